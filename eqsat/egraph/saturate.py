"""Saturation: build the e-graph, run the rules under limits, and take a snapshot of the result.

egglog has no node or time limit inside an iteration, so we run one rewrite step at a time (analyses
saturated first, one iteration at a time, rewrites under a persistent back-off scheduler) and check the limits
between steps: no ruleset can hold saturation past Saturation.seconds by more than one egglog step (and the final
analysis of the last step's nodes, which gets a tenth of the limit).

The prelude and the rules do not depend on the program: an e-graph with them declared (29 ms of the 50 ms that
planning a small MLP at a new batch size took) is kept, and each program is added above an egglog `(push)` and
taken off by `(pop)`.
"""

import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum

import egglog.bindings as egg

from eqsat.capture.encode import ANALYSIS, FACTS, encode, prelude
from eqsat.capture.ir import Graph
from eqsat.egraph.chains import CHAIN_RULE, FACTOR_RULE, alternatives
from eqsat.egraph.rule_sources import RuleSource, describe
from eqsat.ops.table import OPS
from eqsat.support import progress
from eqsat.support.errors import ShapeConflictError


@dataclass(frozen=True)
class Saturation:
    """Bounds on saturation (eqsat.Limits builds them from its fields of these names); when one stops it, the best
    plan so far is used and the plan says which."""

    iterations: int = 12
    nodes: int = 50_000
    seconds: float = 10.0


@dataclass
class ENode:
    op: str
    eclass: str
    children: tuple[str, ...]  # e-classes of the tensor / list arguments
    attrs: tuple[int | str, ...]  # literal i64 / String arguments, in order
    subsumed: bool = False  # a rule replaced it (:subsume), e.g. an unstable softmax: never extracted


class StopReason(StrEnum):
    """Why saturation stopped (a str: plans saved as JSON keep the value)."""

    SATURATED = "saturated"  # nothing left to rewrite
    BACK_OFF = "back-off"  # only rules the back-off scheduler banned (the explosive ones) had matches left
    ITERATIONS = "iterations"  # Saturation.iterations
    NODES = "nodes"  # Saturation.nodes
    SECONDS = "seconds"  # Saturation.seconds
    NOT_PLANNED = "not planned"  # no saturation: the original runs (Plan.fallback says why)


@dataclass
class Snapshot:
    """The saturated e-graph as plain data: what extraction reads."""

    nodes: list[ENode]
    shape: dict[str, tuple[int, ...]]
    dtype: dict[str, str]
    orig: dict[int, str]  # graph node index -> e-class
    stop_reason: StopReason
    iterations: int
    seconds: float
    rule_matches: dict[str, int] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len({n.eclass for n in self.nodes})


_REWRITE = "(run-schedule (run-with eqsat_backoff))"
_ANALYSE_ONCE = f"(run-schedule (run {ANALYSIS}))"


def _analyse(egraph: egg.EGraph, deadline: float, nodes: int) -> StopReason | None:
    """Saturate the analysis one egglog iteration at a time, checking the limits between them (the size every 16
    iterations: printing it costs more than a quick iteration), so that a rule of the analysis that never
    saturates cannot hold saturation past them. Returns the limit that stopped it, or None once saturated."""
    step = egraph.parse_program(_ANALYSE_ONCE)
    k = 0
    while egraph.run_program(*step)[0].report.updated:
        k += 1
        if time.perf_counter() >= deadline:
            return StopReason.SECONDS
        if k % 16 == 0 and _size(egraph) >= nodes:
            return StopReason.NODES
    return None


def saturate(graph: Graph, rules: list[RuleSource], limits: Saturation) -> Snapshot:
    start = time.perf_counter()
    # the whole-chain pass is a rewrite like the rules: where no step is allowed, none of it either
    with _program(graph, rules, whole_chains=limits.iterations > 0 and limits.seconds > 0) as built:
        egraph, rule_commands, matches = built
        try:
            stop_reason, iterations = _rewrite(egraph, limits, start + limits.seconds, matches)
        except _Conflict as conflict:
            raise _explain_conflict(conflict.error, graph, rules, rule_commands, conflict.iterations) from None
        snapshot = _snapshot(egraph)
    snapshot.stop_reason, snapshot.iterations = stop_reason, iterations
    snapshot.seconds, snapshot.rule_matches = time.perf_counter() - start, matches
    return snapshot


class _Conflict(Exception):
    """egglog refused a merge (tensors of different shapes or dtypes) in rewrite step `iterations`."""

    def __init__(self, error: Exception, iterations: int) -> None:
        super().__init__(error)
        self.error, self.iterations = error, iterations


def _rewrite(
    egraph: egg.EGraph, limits: Saturation, deadline: float, matches: dict[str, int]
) -> tuple[StopReason, int]:
    """Rewrite steps until a limit or saturation stops them, the analysis saturated before each; adds each rule's
    matches to `matches`. Returns why it stopped and after how many steps."""
    step = egraph.parse_program(_REWRITE)
    stop_reason, iterations = StopReason.ITERATIONS, 0
    if limits.seconds <= 0:  # no time at all means no step; a positive limit always allows the first
        stop_reason = StopReason.SECONDS
    while stop_reason == StopReason.ITERATIONS and iterations < limits.iterations:
        try:
            stopped = _analyse(egraph, deadline, limits.nodes)
            if stopped:
                stop_reason = stopped
                break
            report = egraph.run_program(*step)[0].report
        except egg.EggSmolError as error:
            raise _Conflict(error, iterations + 1) from None
        iterations += 1
        for rule, count in report.num_matches_per_rule.items():
            if not rule.startswith(f"{ANALYSIS}:"):
                matches[rule] = matches.get(rule, 0) + count
        if not report.updated:
            # Nothing changed. Saturated only if the back-off scheduler has no rule banned; else the banned rules
            # are the explosive ones (merges, associativity): letting them run measured 10-40x the optimization
            # time for no better plan, so we stop and say why.
            stop_reason = StopReason.SATURATED if report.can_stop else StopReason.BACK_OFF
            break
        size = _size(egraph)
        progress.step("saturate", f"saturate: iteration {iterations}, {size} e-nodes", iterations, limits.iterations)
        if size >= limits.nodes:
            stop_reason = StopReason.NODES
            break
        if time.perf_counter() >= deadline:
            stop_reason = StopReason.SECONDS
            break
    # The shapes of the last step's nodes (a node left without one is never extracted), given a tenth of the
    # limit beyond it: the built-in analysis saturates in a few quick iterations.
    try:
        stopped = _analyse(egraph, max(deadline, time.perf_counter()) + 0.1 * limits.seconds, 2 * limits.nodes)
    except egg.EggSmolError as error:
        raise _Conflict(error, iterations) from None
    if stopped and stop_reason not in (StopReason.NODES, StopReason.SECONDS):
        stop_reason = stopped
    return stop_reason, iterations


@dataclass
class _Declared:
    """An e-graph with the prelude and one list of rule sources declared, and the rules' parsed commands."""

    egraph: egg.EGraph
    rule_commands: list[tuple[RuleSource, object]]
    programs: int = 0  # how many programs it has held


_DECLARED: OrderedDict[tuple, list[_Declared]] = OrderedDict()  # rule sources -> e-graphs free to take
_DECLARED_LOCK = threading.Lock()
_KEPT_RULE_LISTS, _KEPT_PER_LIST = 8, 2  # threads that saturate at once take one each; more are built
# egglog keeps about 80 KB per program that a pop does not give back (a 6-layer MLP at 180 batch sizes: +15 MB),
# freed with the e-graph: one is declared afresh after this many programs
_PROGRAMS_PER_EGRAPH = 32


def _declared(rules: list[RuleSource]) -> _Declared:
    egraph = egg.EGraph()
    egraph.run_program(*egraph.parse_program(prelude()))
    rule_commands = []
    for src in rules:
        for command in egraph.parse_program(src.text, filename=src.origin):
            rule_commands.append((src, command))
            egraph.run_program(command)
    return _Declared(egraph, rule_commands)


@contextlib.contextmanager
def _program(
    graph: Graph, rules: list[RuleSource], whole_chains: bool = True
) -> Iterator[tuple[egg.EGraph, list[tuple[RuleSource, object]], dict[str, int]]]:
    """The e-graph of the graph, with the rules declared and each whole chain's best order beside it
    (eqsat/egraph/chains.py, under the names of the rules it stands for, where they are enabled); yields it, the rule
    commands and the pass's matches. The program is taken off afterwards and the declared e-graph kept for the next one,
    unless something raised while it was on (an e-graph left mid-step is not reused)."""
    key = tuple((src.origin, src.text) for src in rules)
    with _DECLARED_LOCK:
        free = _DECLARED.get(key)
        declared = free.pop() if free else None
    declared = declared or _declared(rules)
    egraph = declared.egraph
    egraph.run_program(*egraph.parse_program("(push) (let-scheduler eqsat_backoff (back-off))"))
    egraph.run_program(*egraph.parse_program(encode(graph)))
    passes = (CHAIN_RULE, FACTOR_RULE) if whole_chains else ()
    enabled = {name for name in passes if any(f':name "{name}"' in src.text for src in rules)}
    extra = alternatives(graph, order_chains=CHAIN_RULE in enabled, factor_sums=FACTOR_RULE in enabled)
    if extra.commands:
        egraph.run_program(*egraph.parse_program("\n".join(extra.commands)))
    matches = {name: count for name, count in ((CHAIN_RULE, extra.chains), (FACTOR_RULE, extra.sums)) if count}
    yield egraph, declared.rule_commands, matches
    egraph.run_program(*egraph.parse_program("(pop)"))
    declared.programs += 1
    if declared.programs >= _PROGRAMS_PER_EGRAPH:
        return
    with _DECLARED_LOCK:
        free = _DECLARED.setdefault(key, [])
        _DECLARED.move_to_end(key)
        if len(free) < _KEPT_PER_LIST:
            free.append(declared)
        while len(_DECLARED) > _KEPT_RULE_LISTS:
            _DECLARED.popitem(last=False)


def _size(egraph: egg.EGraph) -> int:
    sizes = egraph.run_program(*egraph.parse_program("(print-size)"))[0]
    return sum(count for name, count in sizes.sizes if name not in FACTS)


def _explain_conflict(
    error: Exception, graph: Graph, rules: list[RuleSource], commands: list, iterations: int
) -> Exception:
    """Replay each rule alone to find one whose rewrite equates tensors of different shape or dtype."""
    text = " ".join(str(error).split())
    if "Illegal merge" not in text:
        return error
    for src, command in commands:
        try:
            with _program(graph, [RuleSource(src.name, src.origin, str(command))]) as (egraph, _, _):
                step = egraph.parse_program(_REWRITE)
                for _ in range(max(iterations, 1)):
                    _analyse(egraph, time.perf_counter() + 1.0, 10**9)
                    egraph.run_program(*step)
        except egg.EggSmolError:
            return ShapeConflictError(
                f"{describe(command)}: this rule equates tensors of different shapes or dtypes ({text}); "
                "add a shape guard such as (= (shape a) (shape b)) to its left-hand side"
            )
    return ShapeConflictError(f"rewrites equated tensors of different shapes or dtypes: {text}")


def _snapshot(egraph: egg.EGraph) -> Snapshot:
    data = json.loads(egraph.serialize([]).to_json())
    raw = data["nodes"]
    literal: dict[str, int | str] = {}
    for node_id, node in raw.items():
        if node_id.startswith("primitive-") and not node["children"] and node["op"] != "vec-of":
            literal[node_id] = json.loads(node["op"]) if node["op"].startswith('"') else _int(node["op"])
    for node_id, node in raw.items():  # vectors (shapes, broadcast dims) after the integers they hold
        if node_id.startswith("primitive-") and node["op"] == "vec-of":
            literal[node_id] = tuple(int(literal[c]) for c in node["children"])
    class_node = {node["eclass"]: node_id for node_id, node in raw.items() if node_id.startswith("primitive-")}
    nodes, shape, dtype, orig = [], {}, {}, {}
    for node_id, node in raw.items():
        op, children = node["op"], node["children"]
        if op == "shape":
            shape[raw[children[0]]["eclass"]] = literal[class_node[node["eclass"]]]
        elif op == "dtype":
            dtype[raw[children[0]]["eclass"]] = str(literal[class_node[node["eclass"]]])
        elif op == "Orig":
            orig[int(literal[children[0]])] = raw[children[1]]["eclass"]
        elif not node_id.startswith("primitive-") and op not in FACTS:
            attrs = tuple(literal[c] for c in children if c in literal)
            attrs = OPS[op].attrs_from_egraph(attrs) if op in OPS else attrs
            kids = tuple(raw[c]["eclass"] for c in children if c not in literal)
            nodes.append(ENode(op, node["eclass"], kids, attrs, bool(node.get("subsumed"))))
    return Snapshot(nodes, shape, dtype, orig, "", 0, 0.0)


def _int(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text
