"""Lowering: a plan becomes a JAX function of the flat arguments, one dispatch per node."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from eqsat.ops import OPS
from extract.plan import Plan


def lower(plan: Plan) -> Callable[..., list[Any]]:
    """A function of the flat arguments returning the flat results, built from lax ops and opaque primitives.

    Every plan node runs, so effectful opaque calls happen even when no result uses them.
    """
    graph = plan.graph
    assert graph is not None, "a plan loaded from disk has no program to lower"
    input_names = {graph.nodes[i].attrs[0]: k for k, i in enumerate(graph.inputs)}
    consts = {name: jnp.asarray(value) for name, value in graph.consts.items()}

    def run(*args: Any) -> list[Any]:
        values: list[Any] = []
        for node in plan.nodes:
            ins = [values[i] for i in node.inputs]
            if node.op == "Var":
                name = node.attrs[0]
                values.append(args[input_names[name]] if name in input_names else consts[name])
            elif node.op == "Op":
                call = graph.opaque[node.attrs[0]]
                values.append(call.primitive.bind(*ins, **call.params))
            elif node.op == "Get":
                values.append(ins[0][node.attrs[0]])
            else:
                values.append(OPS[node.op].lower(node.attrs, *ins))
        return [values[i] for i in plan.outputs]

    return run
