"""Extraction front end: greedy DAG, exact ILP or both ("auto")."""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

from eqsat.egraph.saturate import ENode
from eqsat.extract.dag import dag_cost, reachable
from eqsat.extract.greedy import greedy_dag
from eqsat.support.graph_walk import postorder

METHODS = ("greedy", "ilp", "auto")
EXTRACT_SECONDS = 0.5  # the default of eqsat.Limits.extract_seconds: the ILP's and the sharing pass's budget
AUTO_ILP_MAX_NODES = 4000  # beyond this HiGHS rarely beats greedy within a second and overruns its time limit


class _Dag:
    """A choice with the reference count of every class it reaches, so that switching a few classes costs time in
    proportion to what changes, not to the whole DAG (the sharing pass tries thousands of switches)."""

    def __init__(self, nodes: list[ENode], costs: list[float], choice: dict[str, int], roots: list[str]) -> None:
        self.nodes, self.costs, self.choice, self.roots = nodes, costs, choice, roots
        self.refs: dict[str, int] = {}
        self.counted: dict[str, int] = {}  # reached class -> the node whose children hold references
        self.total = 0.0
        self.base: _Dag | None = None  # the DAG this one was switched from, and the classes switched
        self.switch: dict[str, int] = {}
        self.reached: list[str] = []  # the classes the switch from base newly counted
        self._places: dict[str, int] | None = None
        self._update(list(dict.fromkeys(roots)), [])

    def switched(self, switch: dict[str, int]) -> _Dag:
        """A copy with these classes switched; ValueError if a newly reached class has no choice."""
        new = copy.copy(self)
        new.choice, new.refs, new.counted = {**self.choice, **switch}, dict(self.refs), dict(self.counted)
        new.base, new.switch, new._places = self, switch, None
        adds: list[str] = []
        drops: list[str] = []
        for c, i in switch.items():
            old = new.counted.get(c)
            if old is not None and old != i:  # a reached class: its references move to the new node's children
                new.counted[c] = i
                new.total += self.costs[i] - self.costs[old]
                adds += set(self.nodes[i].children)
                drops += set(self.nodes[old].children)
        new.reached = new._update(adds, drops)
        return new

    def settled(self) -> _Dag | None:
        """This choice if no cycle runs through the classes it reaches, else None.

        Its base is acyclic, so a cycle passes through a class the switch changed; and a class of the base placed
        below every changed one (children first) keeps its base sub-DAG, which holds no changed class. So the check
        walks from the changed classes only, over the classes not below them: a few, where a full walk would visit
        the whole DAG for each of the pass's thousands of trials. A cycle the switch cut off from the roots keeps
        its own references and is refused too: such a cycle holds a switched class or one the switch newly reached,
        so the walk starts from both."""
        base = self.base
        if base is None:
            return self
        places = base.places()
        switched = (c for c in self.switch if c in self.counted and self.choice[c] != base.choice.get(c))
        changed = list(dict.fromkeys([*switched, *(c for c in self.reached if c in self.counted)]))
        floor = min((places[c] for c in changed if c in places), default=math.inf)

        def children(eclass: str) -> list[str]:
            return [
                c
                for c in self.nodes[self.choice[eclass]].children
                if not (places.get(c, math.inf) < floor and self.choice[c] == base.choice[c])
            ]

        try:
            postorder(changed, children)
        except ValueError:
            return None
        self.base = None  # checked: the chain of earlier DAGs need not be kept
        return self

    def places(self) -> dict[str, int]:
        """Each reached class's place in a walk that visits children first (computed once: the DAG is acyclic)."""
        if self._places is None:
            self._places = {c: k for k, c in enumerate(reachable(self.nodes, self.choice, self.roots))}
        return self._places

    def _update(self, adds: list[str], drops: list[str]) -> list[str]:
        """Add and drop one reference to each class listed, with their cascades: additions first, so that no class
        is dropped and added back. Returns the classes newly counted."""
        reached = []
        while adds:
            c = adds.pop()
            self.refs[c] = self.refs.get(c, 0) + 1
            if self.refs[c] == 1:
                i = self.choice.get(c)
                if i is None:
                    raise ValueError(f"no node chosen for reachable e-class {c}")
                self.counted[c] = i
                self.total += self.costs[i]
                reached.append(c)
                adds.extend(set(self.nodes[i].children))
        while drops:
            c = drops.pop()
            self.refs[c] -= 1
            if self.refs[c] == 0:
                i = self.counted.pop(c)
                self.total -= self.costs[i]
                drops.extend(set(self.nodes[i].children))
        return reached


def share(
    nodes: list[ENode],
    costs: list[float],
    full: dict[str, int],
    roots: list[str],
    rounds: int = 3,
    extract_seconds: float = EXTRACT_SECONDS,
    depth: int = 3,
) -> dict[str, int]:
    """Greedy's blind spot, patched: a new shared value (a merged GEMM) pays only when several e-classes switch to
    it together, and greedy judges each class alone. For each e-class that the choice does not reach yet, try
    switching every class that reads it, within `depth` readers (a GEMM over all steps, sliced, then reshaped), to
    the node reading it, all at once; keep the switch if the DAG cost drops, then undo the parts of it that do not
    pay on their own. The widest switches are tried first: a merge of all n GEMMs before its parts.

    `full` is greedy's choice for every e-class (so a switched-to node's new children have choices). Stops after
    `extract_seconds`, keeping what it found."""
    deadline = time.perf_counter() + extract_seconds
    readers = _cheapest_readers(nodes, costs)
    dag = _Dag(nodes, costs, dict(full), roots)
    for _ in range(rounds):
        improved = False
        lifts = {shared: _lift(readers, shared, dag, depth) for shared in readers if shared not in dag.counted}
        unchanged = dag  # the lifts hold until a switch is taken
        for _, shared in sorted((-width, shared) for shared, (_, width) in lifts.items() if width >= 2):
            if time.perf_counter() > deadline:
                return dag.choice
            switch, width = lifts[shared] if dag is unchanged else _lift(readers, shared, dag, depth)
            if shared in dag.counted or width < 2:
                continue
            try:
                trial = dag.switched(switch)
            except ValueError:
                continue
            trial = _improvement(trial, dag)
            if trial is None:
                continue
            for c in switch:  # undo what does not pay on its own
                if c in dag.counted and trial.choice[c] != dag.choice[c]:
                    trial = _improvement(trial.switched({c: dag.choice[c]}), trial) or trial
            dag, improved = trial, True
        if not improved:
            break
    return dag.choice


def _cheapest_readers(nodes: list[ENode], costs: list[float]) -> dict[str, dict[str, int]]:
    """Class m -> {class c: the cheapest finite node of c that reads m}."""
    readers: dict[str, dict[str, int]] = {}
    for i, node in enumerate(nodes):
        if math.isinf(costs[i]):
            continue
        for child in set(node.children):
            if child != node.eclass:
                held = readers.setdefault(child, {})
                if node.eclass not in held or costs[i] < costs[held[node.eclass]]:
                    held[node.eclass] = i
    return readers


def _lift(readers: dict[str, dict[str, int]], shared: str, dag: _Dag, depth: int) -> tuple[dict[str, int], int]:
    """The switch to `shared`: readers up to `depth` levels, climbing only through classes not reached; and how
    many reached classes it changes."""
    switch: dict[str, int] = {}
    frontier, width = [shared], 0
    for _ in range(depth):
        above = []
        for m in frontier:
            for c, i in readers.get(m, {}).items():
                if c not in switch and c != shared:
                    switch[c] = i
                    if c not in dag.counted:
                        above.append(c)
                    elif dag.counted[c] != i:
                        width += 1
        frontier = above
    return switch, width


def _improvement(trial: _Dag, than: _Dag) -> _Dag | None:
    """The trial, settled, if it is acyclic and cheaper than `than`."""
    return trial.settled() if trial.total < than.total * (1 - 1e-4) else None


@dataclass
class ExtractionReport:
    """How a plan was extracted: the method whose choice it is, each method's DAG cost and time, whether the ILP
    proved its choice optimal; plan building adds the type-check bans and what the collectives check refused."""

    method: str
    greedy_cost: float | None = None  # greedy's choice alone
    shared_cost: float | None = None  # after the sharing pass
    greedy_s: float | None = None
    ilp_cost: float | None = None
    ilp_s: float | None = None
    optimal: bool = False
    baseline_cost: float | None = None  # the original program's, where it was an option
    typecheck_bans: int = 0  # chosen nodes whose lowering did not type-check (the shape rules should make it 0)
    refused: str = ""  # collectives a first plan added (its merges then not made)


def extract(
    nodes: list[ENode],
    costs: list[float],
    roots: list[str],
    method: str = "auto",
    extract_seconds: float = EXTRACT_SECONDS,
    baseline: dict[str, int] | None = None,
    min_gain: float = 0.0,
) -> tuple[dict[str, int], ExtractionReport]:
    """The chosen node per e-class reachable from the roots, and a report: the method whose choice it is, each
    method's DAG cost and time, and whether the ILP proved its choice optimal. "auto" runs greedy and then the ILP,
    warm-started with greedy's choice (the baseline's, for "ilp") and bounded by extract_seconds, and keeps the
    cheaper. A baseline choice
    (the original program) is kept when no extractor beats it: greedy can do worse than the program it started
    from, since it judges each e-class alone."""
    if method not in METHODS:
        raise ValueError(f"unknown extraction method {method!r}; expected one of {METHODS}")
    report = ExtractionReport(method)
    choice: dict[str, int] | None = None
    if method in ("greedy", "auto"):
        start = time.perf_counter()
        everything = greedy_dag(nodes, costs)
        missing = [r for r in roots if r not in everything]
        if missing:  # greedy extracts every class that has an acyclic finite choice, so none exists
            raise ValueError(f"no finite acyclic choice exists for e-classes {missing}")
        report.greedy_cost = dag_cost(nodes, costs, everything, roots)
        shared = share(nodes, costs, everything, roots, extract_seconds=extract_seconds)
        choice = {c: shared[c] for c in reachable(nodes, shared, roots)}
        report.greedy_s = time.perf_counter() - start
        report.shared_cost = dag_cost(nodes, costs, choice, roots)
        report.method = "greedy+share" if report.shared_cost < report.greedy_cost else "greedy"
    if method == "ilp" or (method == "auto" and len(nodes) <= AUTO_ILP_MAX_NODES):
        from eqsat.extract.ilp import ilp_extract  # only here: it imports scipy (0.5 s)

        start = time.perf_counter()
        # "ilp" alone starts from the original program: out of time, it keeps that rather than failing the plan
        warm = choice if choice is not None else baseline
        ilp_choice, ilp_cost, report.optimal = ilp_extract(nodes, costs, roots, extract_seconds, warm_start=warm)
        report.ilp_s = time.perf_counter() - start
        report.ilp_cost = ilp_cost
        if choice is None or ilp_cost < report.shared_cost:
            choice, report.method = ilp_choice, "ilp"
    assert choice is not None
    if baseline is not None:
        try:
            baseline_cost = dag_cost(nodes, costs, baseline, roots)
        except ValueError:  # a baseline node was banned (ill-typed): it cannot be kept
            baseline_cost = math.inf
        if math.isfinite(baseline_cost):  # subsumed (replaced) original nodes make it infinite: not an option
            report.baseline_cost = baseline_cost
        if baseline_cost * (1 - min_gain) <= dag_cost(nodes, costs, choice, roots):
            choice, report.method = {c: baseline[c] for c in reachable(nodes, baseline, roots)}, "original"
    return choice, report
