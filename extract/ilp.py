"""Exact DAG extraction as a 0-1 integer program solved by HiGHS (scipy.optimize.milp).

Variables: x_n (node n chosen, binary) and a_c (class c active; continuous, since it equals a sum of binaries).
Roots are active, an active class chooses exactly one node, a chosen node activates its child classes, and the
objective is the cost of the chosen nodes. Only where the class graph has cycles (its strongly connected
components of more than one class) does acyclicity need constraints: an order o_c per class in such a component,
with o_c >= o_d + 1 whenever a chosen node of c has child d in the same component (Miller-Tucker-Zemlin).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, milp
from scipy.sparse import coo_array

from eqsat.egraph.saturate import ENode
from eqsat.extract.dag import dag_cost, reachable
from eqsat.support import graph_walk


def ilp_extract(
    nodes: list[ENode],
    costs: list[float],
    roots: list[str],
    extract_seconds: float,
    warm_start: dict[str, int] | None = None,
) -> tuple[dict[str, int], float, bool]:
    """(choice, DAG cost, proven optimal). scipy's milp takes no initial solution, so a valid warm start bounds
    the objective from above and is returned if the solver finds nothing cheaper within extract_seconds."""
    candidates = _prune(nodes, costs, roots)
    if not candidates:  # nothing to extract (a function that returns nothing): the empty choice is optimal
        return {}, 0.0, True
    warm_cost = math.inf
    if warm_start is not None:
        try:
            warm_cost = dag_cost(nodes, costs, warm_start, roots)
        except ValueError:  # incomplete or cyclic: not a solution, so no bound either
            warm_cost = math.inf
    result = _solve(nodes, costs, roots, candidates, warm_cost, extract_seconds)
    proven = result.status == 0
    if result.x is not None:
        picked: dict[str, int] = {}
        for j, i in enumerate(candidates):
            if result.x[j] > 0.5:
                picked[nodes[i].eclass] = i
        choice = {c: picked[c] for c in reachable(nodes, picked, roots)}
        cost = dag_cost(nodes, costs, choice, roots)
        if cost < warm_cost:
            return choice, cost, proven
    if warm_start is not None and math.isfinite(warm_cost):
        return {c: warm_start[c] for c in reachable(nodes, warm_start, roots)}, warm_cost, proven
    raise RuntimeError(f"the ILP found no extraction within {extract_seconds} s: {result.message}")


class _Rows:
    """A sparse constraint matrix built one row at a time: lower <= A x <= upper."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []

    def add(self, entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.lower)
        for col, val in entries:
            self.rows.append(r)
            self.cols.append(col)
            self.vals.append(val)
        self.lower.append(lo)
        self.upper.append(hi)

    def constraint(self, n_vars: int) -> LinearConstraint:
        matrix = coo_array((self.vals, (self.rows, self.cols)), shape=(len(self.lower), n_vars))
        return LinearConstraint(matrix.tocsr(), self.lower, self.upper)


def _solve(
    nodes: list[ENode],
    costs: list[float],
    roots: list[str],
    candidates: list[int],
    warm_cost: float,
    extract_seconds: float,
) -> OptimizeResult:
    """The program over the candidates (x_n are its first len(candidates) variables) solved by HiGHS; a finite
    warm_cost bounds the objective from above."""
    classes = list(dict.fromkeys(nodes[i].eclass for i in candidates))
    cid = {c: k for k, c in enumerate(classes)}
    n_x, n_a = len(candidates), len(classes)
    component = _cyclic_components(nodes, candidates, cid)
    order_var = {k: n_x + n_a + j for j, k in enumerate(component)}
    rows = _Rows()
    members: list[list[tuple[int, float]]] = [[(n_x + k, -1.0)] for k in range(n_a)]
    for j, i in enumerate(candidates):
        members[cid[nodes[i].eclass]].append((j, 1.0))
    for entries in members:
        rows.add(entries, 0.0, 0.0)  # sum of the class's x = a_c
    for j, i in enumerate(candidates):
        k = cid[nodes[i].eclass]
        for d in dict.fromkeys(cid[c] for c in nodes[i].children):
            rows.add([(j, 1.0), (n_x + d, -1.0)], -np.inf, 0.0)  # x_n <= a_child
            if k in component and component.get(d) == component[k]:
                big = float(component[k][1])
                rows.add([(order_var[k], 1.0), (order_var[d], -1.0), (j, -big)], 1.0 - big, np.inf)

    positive = [costs[i] for i in candidates if costs[i] > 0]
    scale = max(positive, default=1.0)  # HiGHS's absolute gap (1e-6) would swamp costs measured in seconds
    objective = np.zeros(n_x + n_a + len(order_var))
    objective[:n_x] = [costs[i] / scale for i in candidates]
    if math.isfinite(warm_cost):
        rows.add([(j, objective[j]) for j in range(n_x)], -np.inf, warm_cost / scale * (1 + 1e-9) + 1e-9)

    lb = np.zeros(len(objective))
    ub = np.ones(len(objective))
    for r in roots:
        lb[n_x + cid[r]] = 1.0
    for k, var in order_var.items():
        ub[var] = component[k][1] - 1
    integrality = np.zeros(len(objective))
    integrality[:n_x] = 1
    return milp(
        objective,
        integrality=integrality,
        bounds=Bounds(lb, ub),
        constraints=rows.constraint(len(objective)),
        options={"time_limit": extract_seconds, "mip_rel_gap": 1e-6},
    )


def _prune(nodes: list[ENode], costs: list[float], roots: list[str]) -> list[int]:
    """Indices of the nodes worth a variable: finite cost, no child that is its own class, every child class
    extractable (has a finite acyclic choice), in a class reachable from the roots through such nodes."""
    parents: dict[str, list[int]] = {}
    waiting: list[int] = []
    for i, node in enumerate(nodes):
        children = set(node.children)
        waiting.append(len(children))
        for c in children:
            parents.setdefault(c, []).append(i)
    usable = [math.isfinite(costs[i]) and nodes[i].eclass not in nodes[i].children for i in range(len(nodes))]
    extractable: set[str] = set()
    ready = [i for i in range(len(nodes)) if waiting[i] == 0 and usable[i]]
    while ready:  # the least fixed point, from the leaves up
        eclass = nodes[ready.pop()].eclass
        if eclass in extractable:
            continue
        extractable.add(eclass)
        for p in parents.get(eclass, ()):
            waiting[p] -= 1
            if waiting[p] == 0 and usable[p]:
                ready.append(p)
    missing = [r for r in roots if r not in extractable]
    if missing:
        raise ValueError(f"no finite acyclic choice exists for e-classes {missing}")
    by_class: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        if usable[i] and all(c in extractable for c in node.children):
            by_class.setdefault(node.eclass, []).append(i)
    classes = graph_walk.reachable(roots, lambda eclass: [c for i in by_class[eclass] for c in nodes[i].children])
    return sorted(i for eclass in classes for i in by_class[eclass])


def _cyclic_components(nodes: list[ENode], candidates: list[int], cid: dict[str, int]) -> dict[int, tuple[int, int]]:
    """Class -> (component id, size) for the classes in strongly connected components of more than one class
    (Tarjan's algorithm, iterative)."""
    succ: list[list[int]] = [[] for _ in cid]
    for i in candidates:
        succ[cid[nodes[i].eclass]].extend(cid[c] for c in nodes[i].children)
    index: list[int] = [-1] * len(cid)
    low = [0] * len(cid)
    on_stack = [False] * len(cid)
    stack: list[int] = []
    result: dict[int, tuple[int, int]] = {}
    counter = 0
    for start in range(len(cid)):
        if index[start] >= 0:
            continue
        work = [(start, 0)]
        while work:
            v, pos = work.pop()
            if pos == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if pos < len(succ[v]):
                work.append((v, pos + 1))
                w = succ[v][pos]
                if index[w] < 0:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    members.append(w)
                    if w == v:
                        break
                if len(members) > 1:
                    for w in members:
                        result[w] = (v, len(members))
    return result
