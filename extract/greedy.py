"""Greedy DAG extraction: each e-class keeps the e-node whose sub-DAG (shared classes counted once) is cheapest."""

import math
from collections import defaultdict, deque

from eqsat.saturate import ENode


def greedy_dag(nodes: list[ENode], costs: list[float]) -> dict[str, int]:
    """The chosen e-node index per e-class; nodes of infinite cost are never chosen."""
    parents: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for child in set(node.children):
            parents[child].append(i)
    best: dict[str, tuple[float, int, dict[str, float]]] = {}
    queue = deque(i for i, node in enumerate(nodes) if not node.children)
    while queue:
        i = queue.popleft()
        node = nodes[i]
        if math.isinf(costs[i]) or any(child not in best for child in node.children):
            continue
        cost_set: dict[str, float] = {}
        for child in node.children:
            cost_set.update(best[child][2])
        if node.eclass in cost_set:  # a cycle through this class
            continue
        cost_set[node.eclass] = costs[i]
        total = sum(cost_set.values())
        if node.eclass not in best or total < best[node.eclass][0] * (1 - 1e-12):
            best[node.eclass] = (total, i, cost_set)
            queue.extend(parents[node.eclass])
    return {eclass: index for eclass, (_, index, _) in best.items()}
