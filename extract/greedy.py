"""Greedy DAG extraction: each e-class keeps the e-node whose sub-DAG (shared classes counted once) is cheapest.

This is extraction-gym's greedy-DAG (per class, the cheapest union of its children's cost sets), computed in one
pass: classes are finalised cheapest first, as in Dijkstra's algorithm (Knuth's generalisation to superior
functions). A union of cost sets never costs less than any of its parts, so a class finalised this way has its
cheapest cost set among nodes whose children are final, and no later update could improve it. A node is
evaluated once, when its last child class is final, which also makes every choice acyclic: a node only ever
points at classes finalised before its own. Cost sets are bitmasks of class indices (Python ints), so a union is
a word-parallel OR; a set's cost is its biggest child set's total plus the classes that set lacks.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from eqsat.egraph.saturate import ENode

_BIT = np.arange(8)


def greedy_dag(nodes: list[ENode], costs: list[float]) -> dict[str, int]:
    """The chosen e-node index per extractable e-class; nodes of infinite cost are never chosen. Costs are >= 0."""
    class_ids, own, kids, parents = _class_graph(nodes)
    num_classes = len(class_ids)
    waiting = [len(children) for children in kids]  # child classes not final yet

    chosen = [-1] * num_classes
    mask = [0] * num_classes  # the final cost set of each class, as a bitmask of class indices
    total = [0.0] * num_classes
    class_cost = np.zeros(num_classes)  # cost of each final class's chosen node
    nbytes = (num_classes + 7) // 8

    def cost_set(i: int) -> int:
        bits = 1 << own[i]
        for c in kids[i]:
            bits |= mask[c]
        return bits

    def cost_of(bits: int) -> float:
        # only the set bytes are unpacked: O(bytes / SIMD + bits), and a union adds few bits to its biggest part
        data = np.frombuffer(bits.to_bytes(nbytes, "little"), np.uint8)
        at = np.flatnonzero(data)
        set_bits = np.unpackbits(data[at], bitorder="little").view(bool).reshape(-1, 8)
        return float(class_cost[(at[:, None] * 8 + _BIT)[set_bits]].sum())

    heap: list[tuple[float, int]] = []

    def offer(i: int) -> None:
        """Queue node i, whose children are all final, at the cost of its cost set."""
        if math.isinf(costs[i]) or chosen[own[i]] >= 0:
            return
        if not kids[i]:
            heapq.heappush(heap, (costs[i], i))
            return
        base = max(kids[i], key=lambda c: mask[c].bit_count())
        extra = cost_set(i) & ~mask[base] & ~(1 << own[i])
        heapq.heappush(heap, (total[base] + costs[i] + (cost_of(extra) if extra else 0.0), i))

    for i, children in enumerate(kids):
        if not children:
            offer(i)
    while heap:
        t, i = heapq.heappop(heap)
        k = own[i]
        if chosen[k] >= 0:
            continue
        chosen[k], mask[k], total[k], class_cost[k] = i, cost_set(i), t, costs[i]  # the set is not kept in the heap
        for p in parents[k]:
            waiting[p] -= 1
            if waiting[p] == 0:
                offer(p)
    names = list(class_ids)
    return {names[k]: i for k, i in enumerate(chosen) if i >= 0}


def _class_graph(nodes: list[ENode]) -> tuple[dict[str, int], list[int], list[tuple[int, ...]], list[list[int]]]:
    """The e-classes numbered (children too: a class may be referenced and have no nodes); per node its class and
    its distinct child classes, in order; per class the nodes that read it."""
    class_ids: dict[str, int] = {}
    for node in nodes:
        for eclass in (node.eclass, *node.children):
            class_ids.setdefault(eclass, len(class_ids))
    own = [class_ids[node.eclass] for node in nodes]
    kids = [tuple({class_ids[c]: None for c in node.children}) for node in nodes]
    parents: list[list[int]] = [[] for _ in class_ids]
    for i, children in enumerate(kids):
        for c in children:
            parents[c].append(i)
    return class_ids, own, kids, parents
