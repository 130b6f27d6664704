"""Whole contraction chains and sums of contractions, ordered once before saturation.

Re-association and factoring rules reach a chain's best order one step at a time, and the e-graph of every
order of an n-matrix chain grows with the Catalan numbers: past a dozen matmuls the back-off scheduler bans the
rules long before the best order is found. This pass flattens each chain of Dots (or of BatchDots) and each
tree of Adds once, and puts beside it, as an equal term in its e-class, the order of fewest flops (the
matrix-chain dynamic programme) or the sum with its shared operands factored out. The rules then still explore
around it, and extraction prices both under the cost model, so the original stays when it is cheaper.

The pass runs where its rules are enabled, and reports its matches under their names: a chain is ordered where
`dot-assoc-right` is, a sum factored where `dot-factor-left` is (rules/algebra.egg).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from eqsat.capture.ir import Graph, Role, Variable
from eqsat.ops.table import ADD, BCAST, OPAQUE, OPS, REDUCE_SUM, VAR

CHAIN_RULE = "dot-assoc-right"
FACTOR_RULE = "dot-factor-left"
# the programme is cubic in the chain's length (256 operands: 0.3-1 s): longer chains are left to the rules
MAX_CHAIN = 256


@dataclass(frozen=True)
class Alternatives:
    """egglog commands that union graph nodes with equal terms, and how many of each kind."""

    commands: list[str]
    chains: int
    sums: int


def alternatives(graph: Graph, order_chains: bool = True, factor_sums: bool = True) -> Alternatives:
    """The unions to run once the graph is encoded: each chain of three or more contractions with its order of
    fewest flops, each sum in which two contractions share an operand with those factored."""
    uses = _uses(graph)
    commands: list[str] = []
    chains = sums = 0
    if order_chains:
        for root, operands in _roots(graph, uses, _chain_step).items():
            if 3 <= len(operands) <= MAX_CHAIN:
                commands.append(f"(union {_ref(root)} {_ordered(graph, graph.nodes[root].op, operands)})")
                chains += 1
    if factor_sums:
        for root, terms in _roots(graph, uses, _sum_step).items():
            shape = graph.nodes[root].shape
            terms = [t for t in terms if not _is_zero(graph, t)]  # Python's sum() starts from 0
            if not terms or any(graph.nodes[t].shape != shape for t in terms):  # a scalar term broadcasts: left
                continue
            factored = _factored(graph, uses, terms)
            if factored is not None:
                commands.append(f"(union {_ref(root)} {factored})")
                sums += 1
    return Alternatives(commands, chains, sums)


def _uses(graph: Graph) -> list[int]:
    count = [0] * len(graph.nodes)
    for node in graph.nodes:
        for i in node.inputs:
            count[i] += 1
    for i in graph.roots():
        count[i] += 2  # a result is used outside: never folded into the chain of a node that reads it
    return count


Step = Callable[[Graph, list[int], int, dict[int, list[int]]], list[int] | None]


def _roots(graph: Graph, uses: list[int], step: Step) -> dict[int, list[int]]:
    """Each node that heads a flattened chain (or sum) -> its operands, in order. step(graph, uses, i, flat)
    flattens node i given its inputs' flattenings, or returns None where i is not of the kind."""
    flat: dict[int, list[int]] = {}
    absorbed: set[int] = set()
    for i in range(len(graph.nodes)):
        operands = step(graph, uses, i, flat)
        if operands is None:
            continue
        flat[i] = operands
        absorbed.update(j for j in graph.nodes[i].inputs if j in flat and j not in operands)
    return {i: ops for i, ops in flat.items() if i not in absorbed}


def _chain_step(graph: Graph, uses: list[int], i: int, flat: dict[int, list[int]]) -> list[int] | None:
    """A Dot's (or BatchDot's) operands with those of its single-use inputs of the same op spliced in, where the
    operand that then sits inside the chain keeps a free axis (rank >= 2: what makes re-association sound)."""
    node = graph.nodes[i]
    if OPS[node.op].chain_axes is None or len(node.inputs) != 2:
        return None
    a, b = node.inputs

    def splice(j: int, inner: Callable[[list[int]], int]) -> list[int]:
        same = graph.nodes[j].op == node.op and uses[j] == 1 and j in flat
        return flat[j] if same and len(graph.nodes[inner(flat[j])].shape or ()) >= 2 else [j]

    return splice(a, lambda ops: ops[-1]) + splice(b, lambda ops: ops[0])


def _sum_step(graph: Graph, uses: list[int], i: int, flat: dict[int, list[int]]) -> list[int] | None:
    """An Add's terms, or those of a sum over the axis of a stack (jnp.sum(jnp.stack(terms), 0)), with those of
    its single-use Add inputs spliced in."""
    node = graph.nodes[i]
    if node.op == ADD:
        terms = node.inputs
    elif node.op == REDUCE_SUM and _is_stack(graph, node.inputs[0], node.attrs[0]) and uses[node.inputs[0]] == 1:
        terms = graph.nodes[node.inputs[0]].inputs
    else:
        return None
    return [k for j in terms for k in (flat[j] if j in flat and uses[j] == 1 else [j])]


def _is_stack(graph: Graph, i: int, axis: int) -> bool:
    """Whether node i is jax's stack primitive (opaque to the op table) along this axis."""
    node = graph.nodes[i]
    if node.op != OPAQUE or not node.inputs:
        return False
    call = graph.opaque[node.attrs[0]]
    return call.primitive.name == "stack" and call.params.get("axis") == axis


def _is_zero(graph: Graph, i: int) -> bool:
    """Whether node i is a constant of zeros, or a broadcast of one: an additive identity a sum can drop."""
    node = graph.nodes[i]
    if node.op == BCAST:
        return _is_zero(graph, node.inputs[0])
    if node.op != VAR or graph.variables.get(node.attrs[0], Variable()).role != Role.CONSTANT:
        return False
    value = graph.consts.get(node.attrs[0])
    return value is not None and not np.any(value)


def _ref(i: int) -> str:
    return f"$eqsat_n{i}"


def _ordered(graph: Graph, op: str, operands: list[int]) -> str:
    """The chain as an egglog term in the order of fewest flops."""
    shapes = [tuple(graph.nodes[j].shape or ())[OPS[op].chain_axes :] for j in operands]
    split = chain_order(shapes)

    def term(lo: int, hi: int) -> str:
        if lo == hi:
            return _ref(operands[lo])
        k = split[lo, hi]
        return f"({op} {term(lo, k)} {term(k + 1, hi)})"

    return term(0, len(operands) - 1)


def chain_order(shapes: list[tuple[int, ...]]) -> dict[tuple[int, int], int]:
    """The matrix-chain dynamic programme over tensors contracted last axis to first: for each interval (lo, hi)
    of the chain, the k where its cheapest order splits it into (lo..k)(k+1..hi). Vectorized over k: 256 operands
    plan in a fraction of a second."""
    n = len(shapes)
    # elements of the product of operands lo..hi: all their axes but the contracted ones (each on both sides),
    # from prefix sums of logarithms, so that no product of a long chain's axes overflows
    logs = np.concatenate([[0.0], np.cumsum([np.log(np.prod(s, dtype=np.float64)) for s in shapes])])
    contracted = np.array([float(s[-1]) for s in shapes[:-1]] or [1.0])
    log_k = np.concatenate([[0.0], np.cumsum(np.log(contracted))])
    lo, hi = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    sizes = np.rint(np.exp(logs[hi + 1] - logs[lo] - 2 * (log_k[np.maximum(hi, lo)] - log_k[lo])))
    best = np.zeros((n, n))
    split: dict[tuple[int, int], int] = {}
    for length in range(2, n + 1):
        for a in range(n - length + 1):
            b = a + length - 1
            costs = best[a, a:b] + best[a + 1 : b + 1, b] + sizes[a, a:b] * sizes[a + 1 : b + 1, b] / contracted[a:b]
            k = int(np.argmin(costs))
            best[a, b], split[a, b] = costs[k], a + k
    return split


def _factored(graph: Graph, uses: list[int], terms: list[int]) -> str | None:
    """The sum with its contractions that share an operand factored, the group that saves most flops first:
    x@B1 + x@B2 + y -> x@(B1 + B2) + y. None where no two terms share one."""
    rest = list(terms)
    parts: list[str] = []
    while True:
        groups: dict[tuple, list[int]] = {}
        for t in rest:
            node = graph.nodes[t]
            if OPS[node.op].chain_axes is not None and uses[t] == 1:  # a product used elsewhere is computed anyway
                a, b = node.inputs
                groups.setdefault((node.op, 0, a), []).append(t)
                groups.setdefault((node.op, 1, b), []).append(t)
        candidates = [(key, g) for key, g in groups.items() if len(g) >= 2 and _same_shapes(graph, key, g)]
        if not candidates:
            break
        (op, side, shared), group = max(candidates, key=lambda c: _saving(graph, c[1]))
        others = [graph.nodes[t].inputs[1 - side] for t in group]
        summed = _sum_term(others)
        parts.append(f"({op} {_ref(shared)} {summed})" if side == 0 else f"({op} {summed} {_ref(shared)})")
        rest = [t for t in rest if t not in group]
    if not parts:
        return None
    return _sum_term(rest, parts)


def _same_shapes(graph: Graph, key: tuple, group: list[int]) -> bool:
    """The operands to be summed have one shape (an Add without broadcasting)."""
    _, side, _ = key
    return len({graph.nodes[graph.nodes[t].inputs[1 - side]].shape for t in group}) == 1


def _saving(graph: Graph, group: list[int]) -> int:
    """Elements of the products no longer computed, a proxy for the flops factoring saves."""
    first = graph.nodes[group[0]]
    size = 1
    for d in first.shape or ():
        size *= d
    return (len(group) - 1) * size


def _sum_term(refs: list[int], terms: Sequence[str] = ()) -> str:
    """A balanced sum of graph nodes and terms (balanced: its rounding grows with log n, not n)."""
    items = [*terms, *map(_ref, refs)]
    while len(items) > 1:
        pairs = [items[k : k + 2] for k in range(0, len(items), 2)]
        items = [f"({ADD} {pair[0]} {pair[1]})" if len(pair) == 2 else pair[0] for pair in pairs]
    return items[0]
