"""Special values (issue 42): every op of the table, every alternative kernel and every rule, compared with the
original on inputs holding NaNs (first and last in a row, at and beside its maximum), infinities, signed zeros,
subnormals, the largest finite values, all-equal rows and the tails of elementwise functions
(eqsat/tools/special.py), in float32, bfloat16 and float16. NaN positions, infinities and zeros' signs must be what
the original gives, which is what jax.jit gives on this device; finite values within the rules' tolerance
(eqsat/egraph/check.py check_egraph, `special`, says which elements of a sum are left to its order)."""

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from jax import lax

import eqsat
from eqsat.egraph.check import Disagreement
from eqsat.egraph.rule_sources import collect, keeping, rule_names, rules_in
from eqsat.ops.cumulative import cumulative
from eqsat.ops.table import OPS, CumulativeAttrs
from eqsat.tools.generators import generators, pattern_programs, programs
from eqsat.tools.program import Program, Shape
from eqsat.tools.special import special_array, special_inputs
from eqsat.tools.verify import check_program

DTYPES = ("float32", "bfloat16", "float16")
SOURCES = collect()
EXAMPLES = 2  # draws per generator entry and dtype, the first (hypothesis's simplest: dims of 1) skipped

# Rules whose forms give other special values than this module's reference, the original evaluated op by op, each
# with why. A disagreement is put down to them only where the same program saturated without them agrees everywhere;
# each shows it in a case of its own (CASES below): a rule that agrees fails test_known_rules_still_disagree until it
# leaves the table.
KNOWN: dict[str, str] = {
    "one-hot-row-sum-pick": (
        "op by op, the one-hot product is NaN beside the label where the row holds an inf or NaN (0 x inf); jax.jit's "
        "fused program is not: XLA turns x * one_hot into a select in float32 and float16 (not in bfloat16, where the "
        "rule does not apply), which the pick matches (test_fenced_and_known_rules_give_jits_answer)"
    ),
}

# Rules fenced where their forms' special values differ from jax.jit's: watched by the overflow watch (marked
# `; @real`: the plan's value is not finite wherever they differ, and the original then runs), computed as the
# one-hot product itself where the operand holds an inf or NaN (eqsat/ops/kernels.py take_rows, scatter_rows), or
# narrowed to the convs where they agree (NARROWED: the rule must not fire on its case)
NARROWED = {"few-channels-shifted"}
FENCED = {
    "few-channels-shifted": "narrowed: not where the input is dilated (XLA:CPU skips an ungrouped 2-D conv's holes)",
    "transposed-phases": "watched: XLA:CPU multiplies the holes by the weights elsewhere, PhaseConv never meets them",
    "depthwise-grad-shifted": "watched: XLA spreads a non-finite cotangent to every group's same channel, not its form",
    "one-hot-gather": "exact: the product itself where the table holds an inf or NaN (a whole column NaN)",
    "one-hot-transposed-scatter": "exact: the product itself where the rows hold an inf or NaN",
}

# Generator entries that reach their rules only in a few draws (cumulative-blocks-doubled, dense-merge,
# transpose-through-exp and -tanh, conv-add-weights, fold-scale-into-dense, one-hot-flattened, pick-of-row-broadcast):
# more draws in float32, the cumulative ops' in every dtype
REACHING = {
    "Cumulative": 3, "Dense-none": 3, "Transpose-exp": 3, "conv-sum": 3, "scale-shift": 3, "ScatterRows": 3,
    "one-hot-row-broadcast": 3,
}  # fmt: skip

# The stable composites (rules/stable.egg) are finite where the naive form's exp overflowed: their purpose, which
# validation accepts too (eqsat/numerics/tolerance.py differs). Only where every other element agrees.
STABLE_OPS = {"Softmax", "LogSumExp"}


@dataclass
class Tally:
    fired: set[str] = field(default_factory=set)
    ops: dict[str, set[str]] = field(default_factory=dict)  # dtype -> the ops its e-graphs evaluated
    failures: list[str] = field(default_factory=list)


def _check(prog: Program, inputs: list[np.ndarray], tally: Tally, lead: str) -> None:
    found, snapshot, _ = check_program(prog, SOURCES, inputs=inputs)
    fired = {rule for rule, count in snapshot.rule_matches.items() if count}
    tally.fired |= fired
    tally.ops.setdefault(prog.dtype, set()).update(node.op for node in snapshot.nodes)
    found = [d for d in found if not (d.rescued and d.op in STABLE_OPS)]
    known = fired & set(KNOWN)
    if found and known and not check_program(prog, _without(known), inputs=inputs)[0]:
        return
    tally.failures += [_describe(prog, inputs, d, lead) for d in found[:1]]


def _without(rules: set[str]) -> list:
    return keeping(SOURCES, lambda names: not set(names) & rules)


def _describe(prog: Program, inputs: list[np.ndarray], d: Disagreement, lead: str) -> str:
    shown = "\n".join(f"    x{i} = {np.asarray(x, np.float32).tolist()}" for i, x in enumerate(inputs))
    return f"[{lead}, {prog.dtype}] {d.describe()}\n  program:\n    {prog!r}\n  inputs:\n{shown}"


def _lead(dtype: str, lead: str, tally: Tally) -> Callable[[st.DataObject], None]:
    salt = zlib.crc32(f"{lead} {dtype}".encode())  # each test its own values, even in hypothesis's simplest draw

    def one(data: st.DataObject) -> None:
        if not data.draw(st.integers(0, 2**32 - 1)):  # hypothesis's first draw, every choice its simplest
            return
        prog = data.draw(programs(dtypes=(dtype,), max_steps=1, lead=lead))
        _check(prog, data.draw(special_inputs(prog, salt)), tally, lead)

    return one


def _run(dtype: str, tally: Tally) -> None:
    for lead in sorted(generators()):
        examples = EXAMPLES + (REACHING.get(lead, 0) if dtype == "float32" or lead == "Cumulative" else 0)
        settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )(given(st.data())(_lead(dtype, lead, tally)))()


def test_every_op_kernel_and_rule_agrees_with_the_original_on_special_values():
    tally = Tally()
    for dtype in DTYPES:
        _run(dtype, tally)
    # rules no generator reached, on their own patterns (as `rules check` runs them)
    rng = np.random.default_rng(0)
    for src in SOURCES:
        for rule in rules_in(src):
            if not set(rule.names) & tally.fired:
                for prog in pattern_programs(rule.command, dtypes=("float32",))[:2]:
                    _check(prog, [special_array(s, "float32", rng) for s in prog.input_shapes], tally, rule.names[0])
    # a cumulative product along 128 elements, which blocks of 32 double at (cumulative-prod-blocks-doubled)
    for reverse in (0, 1):
        prog = Program("float32")
        attrs = CumulativeAttrs("prod", 0, reverse)
        prog.apply(f"cumprod[0, {reverse}]", partial(cumulative, attrs), prog.fresh((128, 2)))
        _check(prog, [special_array((128, 2), "float32", rng)], tally, "cumulative-prod-blocks-doubled")
    assert not tally.failures, f"{len(tally.failures)} programs disagree:\n\n" + "\n\n".join(tally.failures[:8])
    # every rule fired (the losses' and stable forms' only in float32: jnp.sum of bfloat16 and float16 sums in
    # float32, converts their patterns do not match), every op of the table was evaluated in float32 and every
    # kernel alternative in every dtype
    assert {name for src in SOURCES for name in rule_names(src)} - tally.fired == set()
    ops = {name for name, op in OPS.items() if not op.structural}
    assert ops - tally.ops["float32"] == set()
    for dtype in DTYPES:
        assert {name for name in ops if OPS[name].alternative} - tally.ops[dtype] == set(), dtype


def _ids(v: jax.Array, depth: int) -> jax.Array:
    return jnp.floor(jnp.abs(v) * depth).astype(jnp.int32) % depth


def _conv(rank: int, groups: int, x: Shape, w: Shape, **kw: Any) -> Callable[..., jax.Array]:
    axes = "DHW"[-rank:]
    numbers = (f"N{axes}C", f"{axes}IO", f"N{axes}C")
    window = {"window_strides": (1,) * rank, "padding": [(1, 1)] * rank, "lhs_dilation": (2,) * rank} | kw
    return lambda a, b: lax.conv_general_dilated(a, b, **window, dimension_numbers=numbers, feature_group_count=groups)


def _case(fn: Callable[..., jax.Array], shapes: list[Shape], special: list[tuple[int, tuple, float]]) -> tuple:
    """A program of fn over inputs of these shapes (normals), with special values (input, index, value) written."""
    prog = Program("float32")
    prog.apply("case", fn, *map(prog.fresh, shapes))
    inputs = [np.random.default_rng(i).standard_normal(shape).astype(np.float32) for i, shape in enumerate(shapes)]
    for i, index, value in special:
        inputs[i][index] = value
    return prog, inputs


CASES: dict[str, Callable[[], tuple]] = {
    # an ungrouped 2-D transposed conv of 2 channels, an inf weight: XLA skips the holes, ShiftConv multiplies them
    "few-channels-shifted": lambda: _case(_conv(2, 1, (1, 3, 3, 2), (3, 3, 2, 2)), [(1, 3, 3, 2), (3, 3, 2, 2)],
                                          [(1, (0, 0, 0, 0), np.inf)]),
    # a 3-D transposed conv, an inf weight: XLA multiplies the holes, PhaseConv never meets them
    "transposed-phases": lambda: _case(_conv(3, 1, (1, 2, 2, 2, 1), (2, 2, 2, 1, 1)),
                                       [(1, 2, 2, 2, 1), (2, 2, 2, 1, 1)], [(1, (0, 0, 0, 0, 0), np.inf)]),
    # a depthwise conv's weight gradient, a NaN in the cotangent: XLA spreads it to every group's channel 2
    "depthwise-grad-shifted": lambda: _case(
        lambda a, b: lax.conv_general_dilated(a, b, (1, 1), "VALID", rhs_dilation=(2, 1), batch_group_count=4,
                                              dimension_numbers=("NHWC", "HWIO", "NHWC")),
        [(4, 3, 6, 1), (2, 6, 1, 8)], [(1, (1, 5, 0, 2), np.nan)]),
    # a table row no id picks holds an inf
    "one-hot-gather": lambda: _case(lambda v, t: jax.nn.one_hot(_ids(v, 4), 4, dtype=t.dtype) @ t,
                                    [(3,), (4, 2)], [(0, slice(None), 0.1), (1, (3, 0), np.inf)]),
    "one-hot-transposed-scatter": lambda: _case(lambda v, r: jax.nn.one_hot(_ids(v, 4), 4, dtype=r.dtype).T @ r,
                                                [(3,), (3, 2)], [(1, (0, 0), np.inf)]),
    "one-hot-row-sum-pick": lambda: _case(lambda v, x: jnp.sum(jax.nn.one_hot(_ids(v, 4), 4, dtype=x.dtype) * x, -1),
                                          [(3,), (3, 4)], [(0, slice(None), 0.1), (1, (0, 3), -np.inf)]),
}  # fmt: skip


@pytest.mark.parametrize("rule", sorted(KNOWN))
def test_known_rules_still_disagree(rule: str):
    prog, inputs = CASES[rule]()
    found, snapshot, _ = check_program(prog, SOURCES, inputs=inputs)
    assert snapshot.rule_matches.get(rule) and found, f"{rule} agrees now: take it out of KNOWN"
    assert not check_program(prog, _without({rule}), inputs=inputs)[0]


@pytest.mark.parametrize("rule", sorted(FENCED))
def test_fenced_rules_agree(rule: str):
    prog, inputs = CASES[rule]()
    found, snapshot, _ = check_program(prog, SOURCES, inputs=inputs)
    assert bool(snapshot.rule_matches.get(rule)) != (rule in NARROWED)
    assert not found, "\n".join(d.describe() for d in found)


@pytest.mark.parametrize("alternatives_win", [True, False], ids=["alternative", "original"])
@pytest.mark.parametrize("rule", sorted(FENCED | KNOWN))
def test_fenced_and_known_rules_give_jits_answer(rule: str, alternatives_win: bool, decide_timings: Any):
    """End to end: planned on finite values, with the rule's form far faster than the op it replaces (or far
    slower: the op itself re-lowered), then called on the case's special values: jax.jit's NaNs, infinities and
    values."""
    prog, inputs = CASES[rule]()

    def fun(*xs: jax.Array) -> Any:  # a Program is not hashable, as jax.jit needs
        return prog(*xs)

    ordinary = [np.random.default_rng(7).standard_normal(x.shape).astype(x.dtype) for x in inputs]
    eqsat.optimize(fun).plan(*ordinary)
    decide_timings(alternatives_win)
    fast = eqsat.optimize(lambda *xs: fun(*xs))
    fast(*ordinary)
    assert bool(fast.plan(*ordinary).rules_fired.get(rule)) != (rule in NARROWED)
    reference = _in_a_loop(fun) if alternatives_win and rule in IN_CONTEXT else fun
    np.testing.assert_allclose(fast(*inputs), jax.jit(reference)(*inputs), rtol=1e-5, atol=1e-6)


# Where jax.jit's own special values depend on the program around the op: XLA:CPU's batch-grouped conv (a depthwise
# conv's weight gradient) spreads a NaN cotangent to every group's same channel alone, not inside a loop or a cond's
# branch. The overflow watch runs the original inside the plan's program, so the plan gives the latter.
IN_CONTEXT = {"depthwise-grad-shifted"}


def _in_a_loop(fun: Callable[..., Any]) -> Callable[..., Any]:
    """fun run once in a while loop's body, as the overflow watch runs the original (backends/lower.py)."""

    def looped(*xs: jax.Array) -> Any:
        first = jax.eval_shape(fun, *xs)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), first)
        return lax.while_loop(lambda c: c[1], lambda c: (fun(*xs), False), (zeros, True))[0]

    return looped


@pytest.mark.parametrize("scale", [3.0, 5.0, 7.0])
def test_stable_softmax_of_a_product_at_large_magnitudes_is_one_hot(scale: float):
    """Fuzz seed 2054, case 9941: the Softmax kernel of x * scale, x near 1e12, under jax.jit was NaN across rows
    where XLA contracted the product into an FMA with the subtraction of the row's largest element in one fusion and
    rounded it in the max's (x - max: the rounding error, down to -65536; every exponent 0, then 0 / 0). Exactly 1
    at the largest element, 0 elsewhere, as in exact arithmetic; its derivative is softmax's."""
    softmax = OPS["Softmax"].lower
    x = jnp.asarray(np.random.default_rng(9941).normal(size=(256, 4)) * 1e12, jnp.float32)
    y = np.asarray(jax.jit(lambda x: softmax((1,), x * np.float32(scale)))(x))
    np.testing.assert_array_equal(y, np.eye(4, dtype=np.float32)[np.argmax(np.asarray(x), 1)])
    small = x[:2] * 1e-12
    ours, jaxs = (
        jax.grad(lambda v, f=f: (f(v) * jnp.arange(4.0)).sum())(small)
        for f in (lambda v: softmax((1,), v), lambda v: jax.nn.softmax(v, 1))
    )
    np.testing.assert_allclose(ours, jaxs, rtol=1e-6, atol=1e-7)
