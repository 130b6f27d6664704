"""Extraction front end: greedy DAG, exact ILP or both ("auto"), and the DAG cost every extractor is judged by."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from extract.greedy import greedy_dag

if TYPE_CHECKING:  # importing eqsat at run time would pull in jax and import extract.plan back
    from eqsat.saturate import ENode

METHODS = ("greedy", "ilp", "auto")
AUTO_ILP_MAX_NODES = 4000  # beyond this HiGHS rarely beats greedy within a second and overruns its time limit


def share(
    nodes: list[ENode],
    costs: list[float],
    full: dict[str, int],
    roots: list[str],
    rounds: int = 3,
    seconds: float = 0.5,
) -> dict[str, int]:
    """Greedy's blind spot, patched: a new shared value (a merged GEMM) pays only when several e-classes switch to
    it together, and greedy judges each class alone. For each e-class that the choice does not reach yet, try
    switching every class with a node reading it to that node at once; keep the switch if the DAG cost drops.

    `full` is greedy's choice for every e-class (so a switched-to node's new children have choices). Stops after
    `seconds`, keeping what it found."""
    deadline = time.perf_counter() + seconds
    readers: dict[str, dict[str, int]] = {}  # class m -> {class c: cheapest node of c that reads m}
    for i, node in enumerate(nodes):
        if math.isinf(costs[i]):
            continue
        for child in set(node.children):
            if child != node.eclass:
                held = readers.setdefault(child, {})
                if node.eclass not in held or costs[i] < costs[held[node.eclass]]:
                    held[node.eclass] = i
    choice = dict(full)
    best = dag_cost(nodes, costs, choice, roots)
    for _ in range(rounds):
        improved = False
        reached = set(reachable(nodes, choice, roots))
        for shared, users in readers.items():
            if time.perf_counter() > deadline:
                return choice
            switch = {c: i for c, i in users.items() if c in reached and choice.get(c) != i}
            if shared in reached or len(switch) < 2:
                continue
            trial = {**choice, **switch}
            try:
                cost = dag_cost(nodes, costs, trial, roots)
            except ValueError:  # the switch made the choice cyclic or left a class without a node
                continue
            if cost < best * (1 - 1e-9):
                choice, best, improved = trial, cost, True
                reached = set(reachable(nodes, choice, roots))
        if not improved:
            break
    return choice


def reachable(nodes: list[ENode], choice: dict[str, int], roots: list[str]) -> list[str]:
    """The e-classes the choice reaches from the roots, children before parents; ValueError if it has no choice
    for one of them or if it is cyclic."""
    order: list[str] = []
    state: dict[str, bool] = {}  # False while on the DFS path, True once finished
    for root in roots:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            eclass, expanded = stack.pop()
            if expanded:
                state[eclass] = True
                order.append(eclass)
                continue
            if eclass in state:
                if not state[eclass]:
                    raise ValueError(f"the choice is cyclic through e-class {eclass}")
                continue
            if eclass not in choice:
                raise ValueError(f"no node chosen for reachable e-class {eclass}")
            state[eclass] = False
            stack.append((eclass, True))
            stack.extend((c, False) for c in nodes[choice[eclass]].children if not state.get(c, False))
    return order


def dag_cost(nodes: list[ENode], costs: list[float], choice: dict[str, int], roots: list[str]) -> float:
    """The sum of the chosen nodes' costs over the e-classes reachable from the roots, each counted once."""
    return math.fsum(costs[choice[c]] for c in reachable(nodes, choice, roots))


def extract(
    nodes: list[ENode],
    costs: list[float],
    roots: list[str],
    method: str = "auto",
    time_limit: float = 5.0,
    baseline: dict[str, int] | None = None,
    min_gain: float = 0.0,
) -> tuple[dict[str, int], dict[str, Any]]:
    """The chosen node per e-class reachable from the roots, and a report: the method whose choice it is, each
    method's DAG cost and time, and whether the ILP proved its choice optimal. "auto" runs greedy and then the ILP,
    warm-started with greedy's choice and bounded by time_limit seconds, and keeps the cheaper. A baseline choice
    (the original program) is kept when no extractor beats it: greedy can do worse than the program it started
    from, since it judges each e-class alone."""
    from extract.ilp import ilp_extract  # here, not at the top: extract.ilp imports dag_cost from this module

    if method not in METHODS:
        raise ValueError(f"unknown extraction method {method!r}; expected one of {METHODS}")
    report: dict[str, Any] = {"method": method, "greedy_cost": None, "greedy_s": None}
    report |= {"ilp_cost": None, "ilp_s": None, "optimal": False}
    choice: dict[str, int] | None = None
    if method in ("greedy", "auto"):
        start = time.perf_counter()
        everything = greedy_dag(nodes, costs)
        missing = [r for r in roots if r not in everything]
        if missing:  # greedy extracts every class that has an acyclic finite choice, so none exists
            raise ValueError(f"no finite acyclic choice exists for e-classes {missing}")
        report["greedy_cost"] = dag_cost(nodes, costs, everything, roots)
        shared = share(nodes, costs, everything, roots, seconds=time_limit)
        choice = {c: shared[c] for c in reachable(nodes, shared, roots)}
        report["greedy_s"] = time.perf_counter() - start
        report["shared_cost"] = dag_cost(nodes, costs, choice, roots)
        report["method"] = "greedy+share" if report["shared_cost"] < report["greedy_cost"] else "greedy"
    if method == "ilp" or (method == "auto" and len(nodes) <= AUTO_ILP_MAX_NODES):
        start = time.perf_counter()
        ilp_choice, ilp_cost, report["optimal"] = ilp_extract(nodes, costs, roots, time_limit, warm_start=choice)
        report["ilp_s"] = time.perf_counter() - start
        report["ilp_cost"] = ilp_cost
        if choice is None or ilp_cost < report["shared_cost"]:
            choice, report["method"] = ilp_choice, "ilp"
    assert choice is not None
    if baseline is not None:
        try:
            baseline_cost = dag_cost(nodes, costs, baseline, roots)
        except ValueError:  # a baseline node was banned (ill-typed): it cannot be kept
            baseline_cost = math.inf
        if math.isfinite(baseline_cost):  # subsumed (replaced) original nodes make it infinite: not an option
            report["baseline_cost"] = baseline_cost
        if baseline_cost * (1 - min_gain) <= dag_cost(nodes, costs, choice, roots):
            choice, report["method"] = {c: baseline[c] for c in reachable(nodes, baseline, roots)}, "original"
    return choice, report
