"""A choice of one e-node per e-class: the e-classes it reaches and its DAG cost, which every extractor is judged by."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from eqsat.support.graph_walk import postorder

if TYPE_CHECKING:
    from eqsat.egraph.saturate import ENode


def reachable(nodes: list[ENode], choice: dict[str, int], roots: list[str]) -> list[str]:
    """The e-classes the choice reaches from the roots, children before parents; ValueError if it has no choice
    for one of them or if it is cyclic."""

    def children(eclass: str) -> tuple[str, ...]:
        if eclass not in choice:
            raise ValueError(f"no node chosen for reachable e-class {eclass}")
        return nodes[choice[eclass]].children

    return postorder(roots, children)


def dag_cost(nodes: list[ENode], costs: list[float], choice: dict[str, int], roots: list[str]) -> float:
    """The sum of the chosen nodes' costs over the e-classes reachable from the roots, each counted once."""
    return math.fsum(costs[choice[c]] for c in reachable(nodes, choice, roots))
