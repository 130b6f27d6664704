"""One shape for both programs of a plan (the plan and the original it was extracted from), so that diffs, regions
and drawings treat them alike, and the matching that tells which nodes of one have no counterpart in the other."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eqsat.capture.ir import Graph, Role, Shape
from eqsat.extract.cost import Cost
from eqsat.ops.table import OPAQUE, VAR

if TYPE_CHECKING:  # plans are read here, never built: extract.plan imports this module for its summary
    from eqsat.extract.plan import Plan


@dataclass(frozen=True)
class ViewNode:
    op: str
    name: str  # the op, or an opaque call's primitive name
    attrs: tuple[Any, ...]
    inputs: tuple[int, ...]
    shape: Shape | None
    dtype: str | None
    rewritten: bool = False
    cost: Cost | None = None  # plan nodes: their full cost
    seconds: float | None = None  # original nodes: their predicted time, where the plan recorded it
    scopes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    path: str = ""  # an input's pytree path
    parameter: bool = False  # an input that is a declared parameter


@dataclass(frozen=True)
class Program:
    nodes: list[ViewNode]
    outputs: tuple[int, ...]  # in the program's order, so the two programs' outputs pair up


def original_graph(plan: "Plan") -> Graph | None:
    """The program the plan was extracted from: plan.graph, or the saved sketch of a loaded plan."""
    return plan.graph if plan.graph is not None else plan.saved_original


def _op_name(op: str, attrs: tuple[Any, ...], graph: Graph | None) -> str:
    return graph.op_name(op, attrs) if graph is not None else op


def plan_program(plan: "Plan") -> Program:
    graph = original_graph(plan)
    nodes = [
        ViewNode(
            n.op,
            _op_name(n.op, n.attrs, graph),
            n.attrs,
            n.inputs,
            n.shape,
            n.dtype,
            n.rewritten,
            n.cost,
            scopes=n.scopes,
            sources=n.sources,
            path=n.path,
            parameter=n.parameter,
        )
        for n in plan.nodes
    ]
    return Program(nodes, tuple(plan.outputs))


def original_program(plan: "Plan") -> Program:
    graph = original_graph(plan)
    if graph is None:
        raise ValueError("this plan has no record of its original program (plan.graph is None and it was not loaded)")
    # only what the program computes: capture leaves dead nodes behind (the steps of a folded broadcast chain)
    live = sorted(graph.live())
    index = {old: new for new, old in enumerate(live)}
    seconds = plan.original_seconds
    nodes = []
    for i in live:
        n, where = graph.nodes[i], graph.where.get(i)
        name = str(n.attrs[0]) if n.op == VAR else ""
        nodes.append(
            ViewNode(
                n.op,
                _op_name(n.op, n.attrs, graph),
                n.attrs,
                tuple(index[j] for j in n.inputs),
                n.shape,
                n.dtype,
                seconds=seconds[i] if i < len(seconds) else None,
                scopes=(where.scope,) if where and where.scope else (),
                sources=(where.source,) if where and where.source else (),
                path=graph.variable(name).path,
                parameter=graph.variable(name).role is Role.PARAMETER,
            )
        )
    return Program(nodes, tuple(index[i] for i in graph.outputs))


def program(plan: "Plan", which: str) -> Program:
    if which not in ("plan", "original"):
        raise ValueError(f"which must be 'plan' or 'original', not {which!r}")
    return plan_program(plan) if which == "plan" else original_program(plan)


def label(node: ViewNode) -> str:
    if node.op == VAR:
        return node.path or str(node.attrs[0])
    if node.op == OPAQUE:
        return node.name  # an opaque call's attrs index the graph's opaque table: meaningless to readers
    return node.name + (f"[{','.join(map(str, node.attrs))}]" if node.attrs else "")


def type_text(node: ViewNode) -> str:
    shape = "?" if node.shape is None else "x".join(map(str, node.shape)) or "scalar"
    return f"{shape} {node.dtype or ''}".strip()


def seconds_text(s: float) -> str:
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def node_seconds(node: ViewNode) -> float:
    """A node's predicted time in its program: a plan node's cost, an original node's recorded time."""
    return node.cost.seconds if node.cost is not None else node.seconds or 0.0


def _terms(program: Program, table: dict[tuple, int]) -> list[int]:
    """A structural id per node (op, attrs, type, input ids): equal ids are the same computation. Ids are interned
    in the shared table, so keys stay flat and hashing a deep DAG stays linear."""
    ids: list[int] = []
    for n in program.nodes:
        key = (n.name, n.attrs, n.shape, n.dtype, tuple(ids[i] for i in n.inputs))
        ids.append(table.setdefault(key, len(table)))
    return ids


def unmatched(a: Program, b: Program) -> tuple[set[int], set[int]]:
    """The nodes of each program with no counterpart in the other: what a rewrite replaced and what it put there.

    A node has a counterpart if the other program computes the same term, or if it sits where the other program has
    the same op on the same type: found walking down from the outputs (which pair up in order), so that a consumer of
    a rewritten subgraph, whose term differs only through its input, is not counted as changed itself."""
    table: dict[tuple, int] = {}
    keys_a, keys_b = _terms(a, table), _terms(b, table)
    matched_a = {i for i, k in enumerate(keys_a) if k in set(keys_b)}
    matched_b = {i for i, k in enumerate(keys_b) if k in set(keys_a)}

    def same(i: int, j: int) -> bool:
        x, y = a.nodes[i], b.nodes[j]
        return (label(x), type_text(x), len(x.inputs)) == (label(y), type_text(y), len(y.inputs))

    pairs, seen = list(zip(a.outputs, b.outputs, strict=False)), set()
    while pairs:
        i, j = pairs.pop()
        if (i, j) in seen or not same(i, j):
            continue
        seen.add((i, j))
        matched_a.add(i)
        matched_b.add(j)
        inputs = list(zip(a.nodes[i].inputs, b.nodes[j].inputs, strict=True))
        swapped = [(p, q) for (p, _), (_, q) in zip(inputs, reversed(inputs), strict=True)]
        if len(inputs) == 2 and not all(same(*pq) for pq in inputs) and all(same(*pq) for pq in swapped):
            inputs = swapped  # commuted operands (add-comm, mul-comm)
        pairs.extend(inputs)
    return set(range(len(a.nodes))) - matched_a, set(range(len(b.nodes))) - matched_b


def changed(plan: "Plan", which: str, program: Program) -> set[int]:
    """Nodes of this program (`which` of the plan's two) without a counterpart in the other, and rewritten ones."""
    rewritten = {i for i, n in enumerate(program.nodes) if n.rewritten}
    if original_graph(plan) is None:
        return rewritten
    if which == "plan":
        return unmatched(original_program(plan), program)[1] | rewritten
    return unmatched(program, plan_program(plan))[0]
