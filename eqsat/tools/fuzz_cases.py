"""The fuzzer's cases (eqsat/tools/fuzz.py runs them): a program of 1-4 generator entries in one dtype, how its
inputs are packed as pytrees and its results returned, the body it is placed in, and the target, extractor and
transformation it is optimized and called under; and the function and arguments a case stands for.

Case I of seed S (for one version of the generator table) is drawn from numpy's generator seeded with (S, I),
uniformly (hypothesis, which the generators are written for, leans towards small and first choices, which
verification wants and a fuzzer does not).
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

from eqsat.tools.generators import generators
from eqsat.tools.program import Program

DTYPES = ("float32", "float32", "bfloat16", "float16", "int32")
TRANSFORMS = ("eager", "jit", "vmap", "grad", "scan", "prepare", "optimize-grad", "background", "buckets")
_PICKED = TRANSFORMS[:-1]  # buckets is drawn last, on its own: the other cases stay those drawn before it came
BODIES = ("straight", "straight", "scan", "cond", "fori", "remat", "layers")
TARGETS = ("cpu", "h100", "tpu-v5e")
EXTRACTORS = ("greedy", "ilp", "auto")
_FLOAT_ONLY = ("grad", "optimize-grad")  # transformations that differentiate
_LAYERS = 5  # copies of the program in a "layers" body: enough for eqsat/planning/repeats.py to plan them as one block


@dataclass
class Case:
    """One fuzz case: a program, how it is packed and placed, and how it is optimized and called."""

    index: int
    program: Program
    body: str
    transform: str
    first: str  # "eager" or "transformed": which call of the signature comes first
    target: str
    extractor: str
    tree: tuple[int, ...]  # how many input leaves each positional argument holds (the first one a dict)
    as_dict: bool  # results as a dict (else a tuple)
    data_seed: int
    guard: bool  # the plan timed against the original after validation (a short Limits.guard_seconds)

    def describe(self) -> str:
        return (
            f"case {self.index}: {self.transform} (first call {self.first}), body {self.body}, target {self.target}, "
            f"extractor {self.extractor}, arguments {self.tree}, guard {self.guard}\n  "
            + repr(self.program).replace("\n", "\n  ")
        )


class _Rejected(Exception):
    """The draw made a program its dtype cannot run (tanh of an int): the case is drawn again."""


def _uniform_draw(rng: np.random.Generator) -> Callable[[st.SearchStrategy[Any]], Any]:
    """A draw function for the generators' strategies (integers, booleans, sampled_from, permutations), uniform."""

    def draw(strategy: st.SearchStrategy[Any]) -> Any:
        inner = getattr(strategy, "wrapped_strategy", strategy)
        kind = type(inner).__name__
        if kind == "IntegersStrategy":
            return int(rng.integers(inner.start, inner.end + 1))
        if kind == "BooleansStrategy":
            return bool(rng.integers(2))
        if kind in ("SampledFromStrategy", "JustStrategy"):
            return inner.elements[int(rng.integers(len(inner.elements)))]
        if kind == "PermutationStrategy":
            return [inner.values[i] for i in rng.permutation(len(inner.values))]
        raise TypeError(f"the fuzzer cannot draw from {strategy!r}")

    return draw


def draw_case(seed_value: int, index: int) -> Case:
    """Case `index` of this seed: a program of 1-4 generator entries in one dtype, and how it is optimized and
    called (drawn again, with the next sub-seed, where the program does not type-check in its dtype)."""
    for attempt in range(100):
        rng = np.random.default_rng([seed_value, index, attempt])
        try:
            return _case(rng, index)
        except _Rejected:
            continue
    raise RuntimeError(f"case {index} of seed {seed_value}: no program type-checked in 100 draws")


def _pick(rng: np.random.Generator, options: tuple[Any, ...]) -> Any:
    return options[int(rng.integers(len(options)))]


def _case(rng: np.random.Generator, index: int) -> Case:
    draw = _uniform_draw(rng)
    dtype = _pick(rng, DTYPES)
    prog = Program(dtype)
    entries = generators()
    names = tuple(sorted(entries))
    for _ in range(int(rng.integers(1, 5))):
        try:
            entries[_pick(rng, names)](draw, prog)
        except Exception as error:  # an op this dtype does not take (tanh of an int, an integer -inf)
            raise _Rejected from error
    if not prog.outputs():
        raise _Rejected
    transform = _pick(rng, _PICKED)
    if transform in _FLOAT_ONLY and dtype == "int32":
        transform = "jit"
    n = len(prog.input_shapes)
    cut = sorted(int(c) for c in rng.integers(0, n + 1, int(rng.integers(0, 3))))
    tree = tuple(b - a for a, b in zip([0, *cut], [*cut, n], strict=True))
    if transform == "prepare" and (len(tree) < 2 or tree[0] == 0):
        transform = "jit"  # prepare binds the first argument's leaves: it needs some, and other arguments
    case = Case(
        index,
        prog,
        _pick(rng, BODIES),
        transform,
        _pick(rng, ("eager", "transformed")),
        _pick(rng, TARGETS),
        _pick(rng, EXTRACTORS),
        tree,
        bool(rng.integers(2)),
        int(rng.integers(2**31)),
        bool(rng.integers(4) == 0),
    )
    if rng.integers(len(TRANSFORMS)) == 0:
        case.transform = "buckets"
    return case


def case_function(case: Case) -> Callable[..., Any]:
    """The program as a function of pytree arguments (the first a dict of its leaves, the others lists), its
    results a dict or tuple, computed straight or in a control-flow body."""
    prog = case.program

    def leaves_of(args: tuple) -> list[Any]:
        first, *rest = args
        return [first[f"w{i}"] for i in range(len(first))] + [x for r in rest for x in r]

    def results(leaves: list[Any]) -> Any:
        out = prog(*leaves)
        return {f"out{i}": v for i, v in enumerate(out)} if case.as_dict else tuple(out)

    def fun(*args: Any) -> Any:
        leaves = leaves_of(args)
        if case.body == "scan":
            return lax.scan(lambda c, _: (c, results(leaves)), 0, None, length=2)[1]
        if case.body == "cond":  # both branches the program, one on the inputs negated (ints too)
            return lax.cond(jnp.sum(leaves[0]) > 0, results, lambda ls: results([-x for x in ls]), leaves)
        if case.body == "fori":  # the program's results accumulated over two iterations
            zero = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(results, leaves))
            return lax.fori_loop(0, 2, lambda i, acc: jax.tree_util.tree_map(jnp.add, acc, results(leaves)), zero)
        if case.body == "remat":
            return jax.checkpoint(results)(leaves)
        if case.body == "layers":  # the program copied, each copy on its own inputs: repeated layers (repeats.py)
            copies = [results([x * (k + 1) for x in leaves]) for k in range(_LAYERS)]
            return functools.reduce(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b), copies)
        return results(leaves)

    fun.__name__ = f"fuzz_case_{case.index}"
    return fun


def case_arguments(case: Case) -> tuple:
    """The case's random arguments, packed as its tree says (the first a dict of leaves, the others lists)."""
    leaves = case.program.random_inputs(case.data_seed)
    if case.program.dtype == "int32":  # normals cast to int are mostly 0: spread them over -4..4
        rng = np.random.default_rng(case.data_seed)
        leaves = [rng.integers(-4, 5, x.shape).astype(np.int32) for x in leaves]
    it = iter(jnp.asarray(x) for x in leaves)
    first, *rest = [[next(it) for _ in range(k)] for k in case.tree]
    return ({f"w{i}": x for i, x in enumerate(first)}, *rest)


SPECIAL_SHARE = 0.05  # of each float leaf's elements, at least one


def special_values(args: tuple, data_seed: int) -> tuple:
    """The arguments with NaN, +-inf, +-0 and the smallest subnormal written over a few elements of each float leaf,
    at positions and in a mix drawn from the seed."""
    rng = np.random.default_rng([data_seed, 1])
    leaves, tree = jax.tree.flatten(args)

    def spoil(x: Any) -> Any:
        if not jnp.issubdtype(x.dtype, jnp.floating) or x.size == 0:
            return x
        tiny = float(jnp.finfo(x.dtype).smallest_subnormal)
        pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, tiny, -tiny])
        flat = np.array(x, np.float32).reshape(-1)
        where = rng.choice(flat.size, max(1, int(flat.size * SPECIAL_SHARE)), replace=False)
        flat[where] = pool[rng.integers(len(pool), size=where.size)]
        return jnp.asarray(flat.reshape(x.shape), x.dtype)

    return jax.tree.unflatten(tree, [spoil(x) for x in leaves])
