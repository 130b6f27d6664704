"""The generator table `rules check` draws programs from: one entry per op of the table or rule pattern, hand
written (gen_algebra.py, gen_conv.py beside this file) or drawn from the op's table entry; and programs built from
a rule's own pattern, for rules no generator reaches."""

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from hypothesis import strategies as st
from jax.lax import convert_element_type

from eqsat.ops.cumulative import KINDS, cumulative
from eqsat.ops.table import OPS, CumulativeAttrs, OpSpec
from eqsat.tools.gen_algebra import ALGEBRA
from eqsat.tools.gen_conv import CONV
from eqsat.tools.gen_losses import LOSSES
from eqsat.tools.program import DrawFn, Program, Shape, any_value


def _gen_cumulative(draw: DrawFn, prog: Program) -> int:
    """A cumulative op along an axis long enough for the blocked forms of rules/kernels.egg: blocks of 32 from 64
    elements, of 64 from 128 (half the draws, so that every run reaches both), whole blocks or a ragged last one."""
    kind, axis, reverse = draw(st.sampled_from(KINDS)), draw(st.integers(0, 1)), draw(st.integers(0, 1))
    shape = [draw(st.integers(1, 3))] * 2
    shape[axis] = draw(st.sampled_from([64, 100, 128, 137]))
    x = prog.pick(draw, lambda s: s == tuple(shape), tuple(shape))
    return prog.apply(f"cum{kind}[{axis}, {reverse}]", partial(cumulative, CumulativeAttrs(kind, axis, reverse)), x)


def _gen_convert(draw: DrawFn, prog: Program) -> int:
    """A round trip through a narrower float type: a drawn program keeps one dtype."""
    narrow = draw(st.sampled_from(("bfloat16", "float16")))
    x = any_value(draw, prog)
    return prog.apply(f"convert[{narrow}]", lambda v: convert_element_type(convert_element_type(v, narrow), v.dtype), x)


# Entries per op of the table (the JAX that captures as it) or rule pattern, where drawing the op on random inputs
# (_from_table) would not reach what its rules match. Ops only rules create (Pad, Dense, the stable composites)
# get an entry: the JAX that rules rewrite into them.
GENERATORS: dict[str, Callable[[DrawFn, Program], int]] = {
    **ALGEBRA,
    **CONV,
    **LOSSES,
    "Cumulative": _gen_cumulative,
    "Convert": _gen_convert,
}


def _from_table(spec: OpSpec) -> Callable[[DrawFn, Program], int]:
    """The op on random inputs of one shape, with attributes the op table's example_attrs allows for it: the
    generator of an op that has no hand-written one."""

    def gen(draw: DrawFn, prog: Program) -> int:
        a = any_value(draw, prog)
        shape = prog.shapes[a]
        choices = spec.example_attrs(shape) if spec.example_attrs is not None else [()]
        if not choices:
            raise ValueError(f"the op table's example_attrs of {spec.name} allows no attributes for shape {shape}")
        attrs = draw(st.sampled_from(choices))
        others = [prog.pick(draw, lambda s: s == shape, shape) for _ in range(spec.arity - 1)]
        return prog.apply(f"{spec.name}{list(attrs)}", lambda *xs: spec.lower(attrs, *xs), a, *others)

    return gen


def generators() -> dict[str, Callable[[DrawFn, Program], int]]:
    """GENERATORS, and for every other op of the table one drawn from the table (read at each call)."""
    covered = {name.split("-")[0] for name in GENERATORS}
    table = {name: _from_table(op) for name, op in OPS.items() if not op.structural and name not in covered}
    return {**GENERATORS, **table}


@st.composite
def programs(
    draw: DrawFn, dtypes: Sequence[str] = ("float32", "float64"), max_steps: int = 4, lead: str | None = None
) -> Program:
    """A random program of 1..max_steps generator entries (the first `lead` if given) over dims 1-8, one dtype."""
    prog = Program(draw(st.sampled_from(list(dtypes))))
    entries = generators()
    if lead is not None:
        entries[lead](draw, prog)
    for _ in range(draw(st.integers(0 if lead else 1, max_steps - (lead is not None)))):
        entries[draw(st.sampled_from(sorted(entries)))](draw, prog)
    return prog


# Shapes a rule's own pattern is tried at, every tensor variable one shape: square matrices let contractions,
# transposes and elementwise ops of one pattern all type-check.
_PATTERN_SHAPES: tuple[Shape, ...] = ((4,), (4, 4), (3, 4), (2, 4, 4), (2, 3, 3, 4))


class _Unbuildable(Exception):
    """A pattern the op table cannot build as a program: a variable attribute of an op without example_attrs, a
    non-op term."""


def pattern_programs(command: Any, dtypes: Sequence[str] = ("float32", "float64")) -> list[Program]:
    """Programs that compute a rule's left-hand side itself (every op term of a rewrite's left side, a birewrite's
    two sides or a rule's query), its variables fresh inputs of one shape, for each shape that type-checks:
    what `rules check` runs for a rule no generator reaches, so that it is verified all the same."""
    if hasattr(command, "rewrite"):
        sides = [command.rewrite.lhs] + ([command.rewrite.rhs] if type(command).__name__ == "BiRewriteCommand" else [])
        queries = [[side] for side in sides]
    else:
        facts = command.rule.body
        queries = [[e for f in facts for e in ((f.left, f.right) if hasattr(f, "left") else (f.expr,))]]
    out = []
    for terms in queries:
        terms = [t for t in terms if type(t).__name__ == "Call" and t.name in OPS and not OPS[t.name].structural]
        for shape in _PATTERN_SHAPES if terms else ():
            for dtype in dtypes:
                prog, env = Program(dtype), {}
                try:
                    for term in terms:
                        _build(prog, env, term, shape)
                except Exception:  # _Unbuildable, or ops that do not type-check at this shape
                    continue
                out.append(prog)
    return out


def _build(prog: Program, env: dict[str, Any], expr: Any, shape: Shape) -> int:
    kind = type(expr).__name__
    if kind == "Var":
        if expr.name not in env:
            env[expr.name] = prog.fresh(shape)
        return env[expr.name]
    if kind != "Call" or expr.name not in OPS or OPS[expr.name].structural:
        raise _Unbuildable(expr)
    spec = OPS[expr.name]
    inputs = [_build(prog, env, a, shape) for a in expr.args[len(spec.attrs) :]]
    attrs = _attributes(spec, expr.args[: len(spec.attrs)], prog.shapes[inputs[0]] if inputs else shape, env)
    return prog.apply(f"{expr.name}{list(attrs) if attrs else ''}", lambda *xs: spec.lower(attrs, *xs), *inputs)


def _attributes(spec: OpSpec, args: Sequence[Any], shape: Shape, env: dict[str, Any]) -> tuple:
    """The op's attributes: the pattern's literals; a variable takes a value the op table's example_attrs allows
    for the input's shape, the same one wherever the variable recurs."""
    if not any(type(a).__name__ == "Var" for a in args):
        return tuple(_attribute(a) for a in args)
    if spec.example_attrs is None:
        raise _Unbuildable(spec.name)

    def fits(choice: tuple) -> bool:
        return all(
            env.get(f"attr {a.name}", value) == value if type(a).__name__ == "Var" else _attribute(a) == value
            for a, value in zip(args, choice, strict=True)
        )

    choice = next((c for c in spec.example_attrs(shape) if fits(c)), None)
    if choice is None:
        raise _Unbuildable(spec.name)
    env.update({f"attr {a.name}": value for a, value in zip(args, choice, strict=True) if type(a).__name__ == "Var"})
    return tuple(choice)


def _attribute(expr: Any) -> Any:
    """A literal attribute of a pattern: an integer, a string, or a (vec-of ...) of integers."""
    kind = type(expr).__name__
    if kind == "Lit":
        return expr.value.value
    if kind == "Call" and expr.name in ("vec-of", "vec-empty"):
        return tuple(_attribute(a) for a in expr.args)
    raise _Unbuildable(expr)
