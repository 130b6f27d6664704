"""Lowering: a plan becomes a JAX function of the flat arguments, one dispatch per node."""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from eqsat.extract.plan import Plan
from eqsat.graph_walk import reachable


def lower(plan: Plan, outputs: Sequence[int] | None = None, given: Sequence[int] = ()) -> Callable[..., list[Any]]:
    """fn(*flat_args, *given_values) -> the values of `outputs` (default: the plan's results).

    Nodes listed in `given` are read from the trailing arguments instead of computed (prepared weights);
    only the nodes the outputs need run, plus effectful ones when computing the plan's results.
    """
    graph = plan.graph
    assert graph is not None, "a plan loaded from disk has no program to lower"
    wanted = list(plan.outputs) if outputs is None else list(outputs)
    needed = _needed(plan, [*wanted, *(plan.effects if outputs is None else [])], set(given))
    input_names = {graph.nodes[i].attrs[0]: k for k, i in enumerate(graph.inputs)}
    n_args = len(graph.inputs)

    def run(*args: Any) -> list[Any]:
        values: dict[int, Any] = dict(zip(given, args[n_args:], strict=True))

        def variable(name: str) -> Any:
            # constants become arrays here, in the trace that uses them: made earlier, under another trace, they
            # would be that trace's values and leak
            return args[input_names[name]] if name in input_names else jnp.asarray(graph.consts[name])

        for i in needed:
            node = plan.nodes[i]
            values[i] = graph.apply(node.op, node.attrs, [values[j] for j in node.inputs], variable)
        return [values[i] for i in wanted]

    return run


def _needed(plan: Plan, roots: list[int], given: set[int]) -> list[int]:
    """The plan nodes the roots depend on, stopping at given ones, in plan (topological) order."""
    wanted = [r for r in roots if r not in given]
    return sorted(reachable(wanted, lambda i: [j for j in plan.nodes[i].inputs if j not in given]))


def weight_boundary(plan: Plan) -> list[int]:
    """Weight nodes that a non-weight node or a result reads: what `prepare` computes once and keeps."""
    boundary = {i for i in plan.outputs if plan.nodes[i].weight}
    for node in plan.nodes:
        if not node.weight:
            boundary.update(j for j in node.inputs if plan.nodes[j].weight)
    return sorted(i for i in boundary if plan.nodes[i].op != "Var")  # Vars are at hand anyway


def with_weights(plan: Plan, flat: list[Any]) -> tuple[Callable[..., list[Any]], list[Any]]:
    """The plan as fn(*flat, *weights) and its weight-only values computed once on these arguments (none when no
    parameters were declared: then no node is weight-only)."""
    boundary = weight_boundary(plan)
    weights = jax.jit(lower(plan, outputs=boundary))(*flat) if boundary else []
    return lower(plan, given=boundary), weights


def with_original_derivatives(
    optimized: Callable[..., list[Any]], original: Callable[..., list[Any]]
) -> Callable[..., list[Any]]:
    """The optimized forward pass, differentiated as the original is (custom_jvp keeps grad and vmap exact)."""
    wrapped = jax.custom_jvp(optimized)
    wrapped.defjvp(lambda primals, tangents: jax.jvp(original, primals, tangents))
    return wrapped
