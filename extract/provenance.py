"""Where each plan node came from in the user's program: name stacks and source lines, inputs' pytree paths.

A node kept from the captured program has its own equation's place. A rewritten node has the places of the
original nodes of its e-class (what it replaced); a new value that replaced none (a merged GEMM, whose e-class is
new) takes those of the values computed from it (the slices that stand for the Q, K and V projections), else of
its inputs.
"""

from collections.abc import Iterable
from typing import TYPE_CHECKING

from eqsat.capture.ir import Graph, Role, Where
from eqsat.ops.table import VAR

if TYPE_CHECKING:
    from eqsat.extract.plan import PlanNode


def attach(nodes: "list[PlanNode]", members: list[list[int]], graph: Graph) -> None:
    """Fill each plan node's scopes, sources, path and parameter in place; members[k]: the original graph nodes that
    plan node k stands for (its own node, or, rewritten, its e-class's original nodes)."""
    places = [_union(graph.where[i] for i in group if i in graph.where) for group in members]
    consumers: list[list[int]] = [[] for _ in nodes]
    for k, node in enumerate(nodes):
        for j in node.inputs:
            consumers[j].append(k)
    for k in reversed(range(len(nodes))):  # consumers come later: each sees its consumers' places filled first
        if nodes[k].rewritten and not places[k]:
            places[k] = _union(w for c in consumers[k] for w in places[c])
    for k, node in enumerate(nodes):
        if node.rewritten and not places[k]:
            places[k] = _union(w for j in node.inputs for w in places[j])
        node.scopes = tuple(dict.fromkeys(w.scope for w in places[k] if w.scope))
        node.sources = tuple(dict.fromkeys(w.source for w in places[k] if w.source))
        if node.op == VAR:
            variable = graph.variable(str(node.attrs[0]))
            node.path, node.parameter = variable.path, variable.role is Role.PARAMETER


def _union(places: Iterable[Where]) -> list[Where]:
    return list(dict.fromkeys(places))


def region(scopes: Iterable[str]) -> str:
    """The innermost scope holding all of these (their common path prefix), "" at the top level."""
    split = [s.split("/") for s in scopes]
    if not split:
        return ""
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return "/".join(common)
