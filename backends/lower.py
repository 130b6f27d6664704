"""Lowering: a plan becomes a JAX function of the flat arguments, one dispatch per node."""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap
from jax.extend import core

from eqsat.backends.merged_contractions import merged_contractions
from eqsat.extract.plan import Plan
from eqsat.ops import kernels
from eqsat.ops.table import DOT, OPS, VAR
from eqsat.support.graph_walk import reachable


def lower(
    plan: Plan, outputs: Sequence[int] | None = None, given: Sequence[int] = (), watch: Sequence[int] = ()
) -> Callable[..., list[Any]]:
    """fn(*flat_args, *given_values) -> the values of `outputs` (default: the plan's results), then those of
    `watch` (what an overflow watch checks).

    Nodes listed in `given` are read from the trailing arguments instead of computed (the parameter-only values
    `prepare` computed once, or an earlier memory segment's values);
    only the nodes the outputs need run, plus effectful ones when computing the plan's results.
    """
    graph = plan.graph
    assert graph is not None, "a plan loaded from disk has no program to lower"
    wanted = [*(plan.outputs if outputs is None else outputs), *watch]
    needed = _needed(plan, [*wanted, *(plan.effects if outputs is None else [])], set(given))
    input_names = {graph.nodes[i].attrs[0]: k for k, i in enumerate(graph.inputs)}
    n_args = len(graph.inputs)
    wide = {i for i in needed if plan.nodes[i].wide}
    # widened values read as typed: by a node computed as typed, or as a result
    rounded = {j for i in needed if i not in wide for j in plan.nodes[i].inputs} | set(wanted)
    merged, unread = merged_contractions(plan, needed, wide | set(wanted) | set(given))
    needed = [i for i in needed if i not in unread]

    def run(*args: Any) -> list[Any]:
        values: dict[int, Any] = dict(zip(given, args[n_args:], strict=True))
        in_float32: dict[int, Any] = {}  # the unrounded values of widened nodes

        def variable(name: str) -> Any:
            # constants become arrays here, in the trace that uses them: made earlier, under another trace, they
            # would be that trace's values and leak
            return args[input_names[name]] if name in input_names else jnp.asarray(graph.consts[name])

        def read_wide(j: int) -> Any:
            return in_float32[j] if j in in_float32 else lax.convert_element_type(values[j], jnp.float32)

        for i in needed:
            node = plan.nodes[i]
            if i in merged:
                a, b = merged[i].operands
                values[i] = OPS[DOT].lower(node.attrs, values[a], values[b], contracting=merged[i].contracting)
                continue
            if i not in wide:
                values[i] = graph.apply(node.op, node.attrs, [values[j] for j in node.inputs], variable)
                continue
            inputs = [read_wide(j) for j in node.inputs]
            # a Convert between float32 and a narrow type is the identity in float32: the rounding is deferred
            in_float32[i] = inputs[0] if OPS[node.op].converts else graph.apply(node.op, node.attrs, inputs, variable)
            if i in rounded:
                values[i] = lax.convert_element_type(in_float32[i], jnp.dtype(node.dtype))
        return [values[i] for i in wanted]

    return run


def _needed(plan: Plan, roots: list[int], given: set[int]) -> list[int]:
    """The plan nodes the roots depend on, stopping at given ones, in plan (topological) order."""
    wanted = [r for r in roots if r not in given]
    return sorted(reachable(wanted, lambda i: [j for j in plan.nodes[i].inputs if j not in given]))


def parameter_only_boundary(plan: Plan) -> list[int]:
    """Parameter-only nodes that a per-call node or a result reads: what `prepare` computes once and keeps."""
    boundary = {i for i in plan.outputs if plan.nodes[i].parameter_only}
    for node in plan.nodes:
        if not node.parameter_only:
            boundary.update(j for j in node.inputs if plan.nodes[j].parameter_only)
    return sorted(i for i in boundary if plan.nodes[i].op != VAR)  # Vars are at hand anyway


def with_parameter_only_values(
    plan: Plan, flat: list[Any], watch: Sequence[int] = ()
) -> tuple[Callable[..., list[Any]], list[Any]]:
    """The plan as fn(*flat, *parameter_only_values) (returning the values of `watch` after its results, as
    `lower`) and its parameter-only values computed once on these arguments (none when no parameters were
    declared: then no node is parameter-only)."""
    boundary = parameter_only_boundary(plan)
    parameter_only_values = jax.jit(lower(plan, outputs=boundary))(*flat) if boundary else []
    return lower(plan, given=boundary, watch=watch), parameter_only_values


def with_original_derivatives(
    optimized: Callable[..., list[Any]], original: Callable[..., list[Any]]
) -> Callable[..., list[Any]]:
    """The optimized forward pass, differentiated as the original is (custom_jvp keeps grad and vmap exact)."""
    wrapped = jax.custom_jvp(optimized)
    wrapped.defjvp(lambda primals, tangents: jax.jvp(original, primals, tangents))
    return wrapped


def _is_token(x: Any) -> bool:
    return isinstance(x, core.Token) or isinstance(getattr(x, "aval", None), core.AbstractToken)


def _in_range(value: Any) -> Any:
    """Every element finite and not all zero (a product whose new order underflowed is flushed to zero as a whole),
    by the value's float32 sum: inf or NaN where any element is, or where finite elements' sum overflows, and 0
    where all are zero or, rarely, cancel exactly; in those the original runs, as correct and only slower. One
    reduction, one all-reduce where the value is sharded, no max (XLA:CPU's drops NaNs). On an AMD EPYC (AVX-512)
    64 MB take 2.4 ms; the earlier sum of value * 0 plus a count of zeros, through a matrix-vector product, 28 ms."""
    total = jnp.sum(value, dtype=jnp.float32)
    return jnp.isfinite(total) & (total != 0)


def with_overflow_watch(
    optimized: Callable[..., list[Any]], original: Callable[..., list[Any]], watched: int
) -> Callable[..., list[Any]]:
    """The results of optimized(*args), a plan lowered with `watched` values after its results (`lower`'s watch),
    where all inexact ones of these are in range (`_in_range`), else original(*args): decided on device in the
    same XLA program (the original runs only where the plan overflowed or underflowed, or where the original's
    own values are not finite, and then gives its results). For plans that rely on rules that hold for real
    numbers only: re-associated (A@B)@v overflows where the original does not, and underflows to zero where an
    intermediate of the new order falls below the smallest float.

    Under vmap one check covers the whole batch (a custom_vmap rule): a branch on a batched predicate would
    become a select that runs both programs. Derivatives are the plan's where it is in range, else the original's
    (the plan's tangents computed inside the branch: outside, the other branch's zero cotangent times an
    overflowed value would be NaN)."""

    @custom_vmap
    def checked(*args: Any) -> list[Any]:
        values = optimized(*args)
        with jax.named_scope(kernels.OVERFLOW_WATCH):
            results, finite = _split_watched(values, watched)
            return results if finite is None else kernels.kept_unless(finite, results, lambda: original(*args))

    @checked.def_vmap
    def _batched(axis_size: int, in_batched: list[bool], *args: Any) -> tuple[list[Any], list[bool]]:
        return _watched_batch(optimized, original, watched, in_batched, args)

    differentiable = jax.custom_jvp(checked)  # custom_vmap has no transpose: grad would fail through it

    @differentiable.defjvp
    def _jvp(primals: tuple, tangents: tuple) -> tuple[list[Any], list[Any]]:
        return _watched_jvp(optimized, original, watched, primals, tangents)

    def watched_run(*args: Any) -> list[Any]:
        if not any(map(_is_token, args)):
            return differentiable(*args)
        return _watched_with_tokens(optimized, original, watched, args)

    return watched_run


def _split_watched(values: list[Any], watched: int) -> tuple[list[Any], Any]:
    """The results, and whether every watched inexact value is in range (None: none can overflow)."""
    results, watch = values[: len(values) - watched], values[len(values) - watched :]
    inexact = [v for v in watch if jnp.issubdtype(v.dtype, jnp.inexact) and v.size]
    if not inexact:  # integers and booleans cannot overflow to inf
        return results, None
    return results, functools.reduce(jnp.logical_and, [_in_range(v) for v in inexact])


def _watched_batch(
    optimized: Callable[..., list[Any]],
    original: Callable[..., list[Any]],
    watched: int,
    in_batched: list[bool],
    args: tuple,
) -> tuple[list[Any], list[bool]]:
    """The watch's vmap rule: the watch of both programs vmapped, so one check covers the whole batch."""
    axes = tuple(0 if b else None for b in in_batched)
    run = with_overflow_watch(jax.vmap(optimized, in_axes=axes), jax.vmap(original, in_axes=axes), watched)
    results = run(*args)
    return results, [True] * len(results)


def _watched_jvp(
    optimized: Callable[..., list[Any]],
    original: Callable[..., list[Any]],
    watched: int,
    primals: tuple,
    tangents: tuple,
) -> tuple[list[Any], list[Any]]:
    """The watch's JVP rule: the plan's (primals, tangents) where it is in range, else the original's."""
    live = [i for i, t in enumerate(tangents) if t.dtype != jax.dtypes.float0]  # integer inputs have none

    def jvp_of(fun: Callable[..., list[Any]]) -> Callable[[], tuple[list[Any], list[Any]]]:
        def on(*xs: Any) -> list[Any]:
            full = list(primals)
            for i, x in zip(live, xs, strict=True):
                full[i] = x
            return fun(*full)

        return lambda: jax.jvp(on, [primals[i] for i in live], [tangents[i] for i in live])

    def plan() -> tuple[list[Any], list[Any]]:
        values, dvalues = jvp_of(optimized)()
        return values[: len(values) - watched], dvalues[: len(values) - watched]

    _, finite = _split_watched(optimized(*primals), watched)
    # a cond, not _kept_unless's loop: grad transposes these tangents, and a while loop does not transpose
    return plan() if finite is None else lax.cond(finite, plan, jvp_of(original))


def _watched_with_tokens(
    optimized: Callable[..., list[Any]], original: Callable[..., list[Any]], watched: int, args: tuple
) -> list[Any]:
    """The watch where tokens are among the arguments: tokens pass neither custom rules nor a cond's results, so
    the check picks the arrays and the plan's tokens pass."""
    results, finite = _split_watched(optimized(*args), watched)
    if finite is None:
        return results
    arrays = [i for i, r in enumerate(results) if not _is_token(r)]
    picked = iter(
        kernels.kept_unless(finite, [results[i] for i in arrays], lambda: [original(*args)[i] for i in arrays])
    )
    return [next(picked) if i in arrays else r for i, r in enumerate(results)]
