"""eqsat's graph IR: a flat list of nodes in topological order, each naming an op of the op table."""

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from eqsat.ops.table import GET, OPAQUE, OPS, VAR
from eqsat.support.graph_walk import reachable

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Opaque:
    """A jax primitive eqsat does not model, re-bound unchanged with its original parameters."""

    primitive: Any
    params: dict[str, Any]
    multiple_results: bool


class Role(StrEnum):
    """What a Var of the graph stands for; decided once per flat input, when the signature is read."""

    ARGUMENT = "argument"  # a leaf of an argument that changes from call to call
    PARAMETER = "parameter"  # a leaf of a declared parameter (params_argnums): fixed across calls
    CONSTANT = "constant"  # a value the program closes over


@dataclass(frozen=True)
class Variable:
    """A Var's role and, for an input, its pytree path in the call (params.layers[0].wq)."""

    role: Role = Role.ARGUMENT
    path: str = ""


@dataclass(frozen=True)
class Where:
    """Where a node came from in the user's program."""

    scope: str = ""  # jax's name stack of the equation: "encoder/layer_3/attention" ("" at the top level)
    source: str = ""  # the user's line that made the equation: "models/bert.py:42 (encoder_layer)"


@dataclass(frozen=True)
class Node:
    op: str  # an OPS name, or "Op" (opaque call) / "Get" (one result of a multi-result opaque call)
    inputs: tuple[int, ...]  # indices of earlier nodes
    attrs: tuple[Any, ...] = ()  # Var: (name,); Op: (opaque index,); Get: (result index,); else OPS attrs
    shape: Shape | None = None  # None for the tuple value of a multi-result opaque call
    dtype: str | None = None  # jax dtype name: 'float32', 'bfloat16', 'key<fry>', ...


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)  # Var nodes of the flat arguments, in order
    outputs: list[int] = field(default_factory=list)  # flat results, in order
    effects: list[int] = field(default_factory=list)  # effectful nodes kept alive though nothing uses them
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # Var name -> value
    opaque: list[Opaque] = field(default_factory=list)
    bodies_rewritten: int = 0  # opaque calls (scan, while, cond, remat) whose bodies eqsat re-planned
    stored_bodies: list[str] = field(default_factory=list)  # keys of the body plans kept from other processes
    real_bodies: dict[int, list[str]] = field(default_factory=dict)  # opaque call -> @real rules its bodies rely on
    where: dict[int, Where] = field(default_factory=dict)  # node -> its equation's place (helper nodes share it)
    variables: dict[str, Variable] = field(default_factory=dict)  # Var name -> its role and path

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def variable(self, name: str) -> Variable:
        return self.variables.get(name, Variable())

    def input_variables(self) -> list[Variable]:
        """Each flat input's role and path, in order."""
        return [self.variable(self.nodes[i].attrs[0]) for i in self.inputs]

    def parameter_names(self) -> frozenset[str]:
        """The Vars fixed across calls where parameters are declared (the parameters, and the constants, which
        count as parameters here), else none: work on them alone (parameter-only work) is what `prepare` runs
        once."""
        roles = {name: v.role for name, v in self.variables.items()}
        if Role.PARAMETER not in roles.values():
            return frozenset()
        return frozenset(name for name, role in roles.items() if role is not Role.ARGUMENT)

    def roots(self) -> list[int]:
        return [*self.outputs, *self.effects]

    def apply(self, op: str, attrs: tuple, args: list[Any], variable: Callable[[str], Any]) -> Any:
        """One node's value from its inputs' values: a Var's from `variable` (its name -> value), an opaque
        primitive re-bound with its parameters, one result of a multi-result call, or the op table's lowering.
        The one evaluator of IR nodes: lowering, rule checking and validation all run nodes through it."""
        if op == VAR:
            return variable(attrs[0])
        if op == OPAQUE:
            call = self.opaque[attrs[0]]
            # as jax.core.eval_jaxpr binds an equation: shard_map's bind takes its parameters in another form than
            # its equation holds them
            return call.primitive.bind(*args, **call.primitive.get_bind_params(call.params))
        if op == GET:
            return args[0][attrs[0]]
        return OPS[op].lower(attrs, *args)

    def live(self) -> set[int]:
        """The nodes the outputs and effects depend on (capture can leave dead ones behind)."""
        return reachable(self.roots(), lambda i: self.nodes[i].inputs)

    def op_name(self, op: str, attrs: tuple) -> str:
        """What a person calls the op: the primitive's name for an opaque call, else the IR op."""
        if op == OPAQUE and attrs and 0 <= attrs[0] < len(self.opaque):
            return self.opaque[attrs[0]].primitive.name
        return op
