"""Plans: the program extracted from a saturated e-graph, with its predicted cost and how it came about."""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eqsat.capture.ir import Graph, Node, Shape, Where
from eqsat.egraph.saturate import ENode, Snapshot, StopReason
from eqsat.extract import changes, provenance
from eqsat.extract.cost import Cost, Profile, node_cost, value_bytes
from eqsat.extract.dag import reachable
from eqsat.extract.extractors import EXTRACT_SECONDS, ExtractionReport, extract
from eqsat.extract.timing import measurable
from eqsat.extract.views import original_graph
from eqsat.extract.widen import GROUP as WIDEN_GROUP
from eqsat.extract.widen import removed_roundings, widen
from eqsat.numerics import guard
from eqsat.ops.table import CONV, OPAQUE, OPS, TCONS, TNIL, VAR, ConvAttrs, CostClass, infer

if TYPE_CHECKING:
    from eqsat.backends.memory import MemoryReport

# inputs, projections and list cells: carry no cost and need no shape check
_LISTED = 4  # removed roundings the summary names
# what plan.overflow_watch lists for the convs of convs_over_zeros
LHS_HOLES, PADDED_CONV, BATCH_GROUPED = "lhs-dilated conv", "re-formed padded conv", "batch-grouped conv"
_STRUCTURAL = frozenset(name for name, spec in OPS.items() if spec.cost_class is CostClass.SOURCE)


@dataclass
class PlanNode:
    op: str  # OPS name, or "Op" (opaque primitive) / "Get" / "Var"
    inputs: tuple[int, ...]  # indices of earlier plan nodes
    attrs: tuple[Any, ...]
    shape: Shape | None
    dtype: str | None
    cost: Cost
    rewritten: bool  # not a node of the original program
    parameter_only: bool = False  # computed from parameters and constants alone: runs once when prepared
    scopes: tuple[str, ...] = ()  # name stacks of the equations it came from (rewritten: of what it replaced)
    sources: tuple[str, ...] = ()  # their source lines, "file.py:42 (function)"
    path: str = ""  # an input's pytree path in the call: params.layers[0].wq
    parameter: bool = False  # an input that is a declared parameter (params_argnums)
    wide: bool = False  # a narrow-float elementwise op computed in float32, rounded where read (extract/widen.py)


@dataclass
class Plan:
    target: str
    nodes: list[PlanNode]
    outputs: list[int]
    effects: list[int]
    predicted: Cost
    original: Cost
    stop_reason: StopReason  # a saved plan's string is read back as the enum
    stats: dict[str, float] = field(default_factory=dict)
    rules_fired: dict[str, int] = field(default_factory=dict)
    graph: Graph | None = field(default=None, repr=False, compare=False)  # opaque calls and constants
    # a plan loaded from disk: its original program's saved sketch (graph stays None: it cannot run)
    saved_original: Graph | None = field(default=None, repr=False, compare=False)
    fallback: str | None = None  # why the original program runs instead, if it does
    extraction: ExtractionReport = field(default_factory=lambda: ExtractionReport("none"))
    memory: "MemoryReport | None" = field(default=None, repr=False, compare=False)  # Optimized.memory() fills it
    autotune: list[dict[str, Any]] = field(default_factory=list)  # candidates: label, predicted and measured s
    blamed: list[str] | None = None  # after a failed validation: the rules the mismatching result depends on
    original_seconds: list[float] = field(default_factory=list)  # predicted time of each original graph node
    # the plan timed against the original after validation (eqsat/numerics/guard.py)
    measured: dict[str, Any] | None = None
    # the rules marked `; @real` that fired for a rewritten plan: its results are checked for inf and NaN on device,
    # the original running where any is (backends/lower.py with_overflow_watch); empty: not watched
    overflow_watch: list[str] = field(default_factory=list)
    # per node: the graph nodes it stands for (eqsat/planning/repeats.py copies a block's plan into each layer
    # with them)
    members: list[list[int]] = field(default_factory=list, repr=False, compare=False)

    @property
    def predicted_speedup(self) -> float:
        return self.original.seconds / self.predicted.seconds if self.predicted.seconds else 1.0

    def __post_init__(self) -> None:
        self.stop_reason = StopReason(self.stop_reason)

    def rewritten_ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            if node.rewritten:
                counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    @property
    def unchanged(self) -> bool:
        """The plan is the original program, node for node."""
        return (
            not self.rewritten_ops()
            and len(self.nodes) == self.stats.get("original_nodes")
            and not self.stats.get("bodies_rewritten")
            and not self.widened()
        )

    def widened(self) -> int:
        """How many narrow-float elementwise nodes compute in float32 (extract/widen.py)."""
        return sum(node.wide for node in self.nodes)

    def program(self) -> Graph:
        """The plan's own program as a graph (for the census), its opaque calls and constants the original's."""
        original = self.graph if self.graph is not None else Graph()
        return Graph(
            nodes=[Node(n.op, n.inputs, n.attrs, n.shape, n.dtype) for n in self.nodes],
            outputs=list(self.outputs),
            effects=list(self.effects),
            consts=original.consts,
            opaque=original.opaque,
            where={
                i: Where(n.scopes[0], n.sources[0] if n.sources else "") for i, n in enumerate(self.nodes) if n.scopes
            },
        )

    def rewritten_frontier(self) -> list[int]:
        """The rewritten nodes whose values the rest of the program reads as the original's (results, and inputs
        of nodes kept from the original): where these are finite, what follows them computes as the original."""
        read = set(self.outputs)
        read.update(j for node in self.nodes if not node.rewritten for j in node.inputs)
        return [i for i in sorted(read) if self.nodes[i].rewritten]

    def convs_over_zeros(self) -> dict[str, list[int]]:
        """The convs whose zeros XLA:CPU multiplies by the weights (NaN where one is inf) or skips, as the program
        around them or their own shape leads it to; the overflow watch watches them. Those with lhs dilation, Conv or
        an alternative kernel (fuzz seed 2042 cases 1358, 1611; seed 2046 case 2793); Convs with batch groups, which
        XLA:CPU masks by a product with zeros, NaN by the layout (seed 2047 case 1619; their alternative kernels come
        from a rule marked `; @real`); the padded Convs the plan re-formed (sibling merges: seed 2046 case 1647)."""
        found: dict[str, list[int]] = {LHS_HOLES: [], BATCH_GROUPED: [], PADDED_CONV: []}
        for i, node in enumerate(self.nodes):
            spec = OPS.get(node.op)
            if spec is None or spec.attributes is not ConvAttrs:
                continue
            attrs = ConvAttrs(*node.attrs)
            if max(attrs.lhs_dilation) > 1:
                found[LHS_HOLES].append(i)
            elif node.op == CONV and attrs.batch_groups > 1:
                found[BATCH_GROUPED].append(i)
            elif node.op == CONV and node.rewritten and max((*attrs.pad_low, *attrs.pad_high)) > 0:
                found[PADDED_CONV].append(i)
        return found

    def rules_involved(self) -> list[str]:
        """The rules a mismatch depends on, where validation found one (re-planning with subsets of the fired rules:
        eqsat/planning/refusals.py blame); otherwise every rule that fired, the set the plan was extracted from."""
        return list(self.blamed) if self.blamed is not None else sorted(self.rules_fired)

    def summary(self) -> str:
        lines = [
            f"plan for target {self.target!r}: {len(self.nodes)} nodes, "
            f"{sum(n.rewritten for n in self.nodes)} rewritten",
            f"  predicted time   {self.original.seconds * 1e3:9.3f} ms -> {self.predicted.seconds * 1e3:9.3f} ms"
            f"  ({self.predicted_speedup:.2f}x)",
            f"  flops            {self.original.flops:9.3g} -> {self.predicted.flops:9.3g}",
            f"  bytes moved      {self.original.bytes:9.3g} -> {self.predicted.bytes:9.3g}",
            f"  kernels          {self.original.kernels:9d} -> {self.predicted.kernels:9d}",
            f"  saturation       stopped by {self.stop_reason} after {int(self.stats.get('iterations', 0))} "
            f"iterations, {int(self.stats.get('enodes', 0))} e-nodes, {int(self.stats.get('eclasses', 0))} e-classes",
            "  time             "
            + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in self.stats.items() if k.endswith("_s")),
        ]
        contractions = [n for n in self.nodes if measurable(n.op)]  # every kernel class the timing cache prices
        if contractions:
            lines.append(
                f"  kernel costs     {sum(n.cost.measured for n in contractions)} of {len(contractions)} measured "
                f"(timing cache: {int(self.stats.get('timing_hits', 0))} hits, "
                f"{int(self.stats.get('timing_measured', 0))} measured now, "
                f"{int(self.stats.get('timing_transferred', 0))} from other shapes, "
                f"{int(self.stats.get('timing_skipped', 0))} over budget), the rest predicted by roofline"
            )
        if self.rules_fired:
            fired = ", ".join(f"{name} x{count}" for name, count in sorted(self.rules_fired.items()))
            lines.append(f"  rules fired      {fired}")
        if self.rewritten_ops():
            lines.append(f"  rewritten ops    {self.rewritten_ops()}")
        if self.widened():
            removed = removed_roundings(self.nodes, [*self.outputs, *self.effects])
            where = ", ".join(
                f"{node.op}" + (f" ({node.sources[0]})" if node.sources else "") for node in removed[:_LISTED]
            )
            more = f" and {len(removed) - _LISTED} more" if len(removed) > _LISTED else ""
            lines.append(
                f"  low precision    {self.widened()} bfloat16/float16 elementwise ops computed in float32, each chain "
                f"rounded once at its end; roundings removed after {where}{more} (disabled_rules=('{WIDEN_GROUP}',) "
                "keeps them)"
            )
        lines += self._region_lines()
        if self.memory:
            lines.append(self.memory.summary())
        for row in self.autotune:
            mark = "<- chosen" if row["chosen"] else ""
            lines.append(
                f"  autotune         {row['label']:<28} predicted {row['predicted_s'] * 1e3:8.3f} ms  "
                f"measured {row['measured_s'] * 1e3:8.3f} ms {mark}"
            )
        if self.measured:
            lines.append(f"  measured         {guard.describe(self.measured)}")
        if self.overflow_watch and not self.fallback:
            lines.append(
                "  overflow watch   rewritten values checked for inf/NaN (or all zero) on device, the original"
                f" run where any is (@real rules fired: {', '.join(self.overflow_watch)})"
            )
        if self.fallback:
            lines.append(f"  FALLBACK         {self.fallback}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _region_lines(self, shown: int = 12) -> list[str]:
        """What changed, by named region of the program (extract.changes.diff_regions), the first `shown`."""
        if not self.nodes or original_graph(self) is None:
            return []
        found = changes.diff_regions(self)
        lines = [f"  changed regions  {len(found)}" if found else "  changed regions  none"]
        lines += [f"    {region.line()}" for region in found[:shown]]
        if len(found) > shown:
            lines.append(f"    ... {len(found) - shown} more (eqsat.extract.changes.diff_regions(plan) lists all)")
        return lines


def build_plan(
    graph: Graph,
    snapshot: Snapshot,
    profile: Profile,
    prepared: bool = False,
    extractor: str = "auto",
    extract_seconds: float = EXTRACT_SECONDS,
    forbid: frozenset[str] = frozenset(),
    memory_weight: float = 0.0,
) -> Plan:
    """Extract the cheapest well-typed program; nodes whose lowering does not type-check are banned.

    prepared: priced for `prepare`, which runs the nodes computed from parameters and constants alone once:
    they are then free (where parameters are declared). extractor: "greedy", "ilp" or "auto" (greedy, then the ILP
    warm-started from it within extract_seconds, keeping the cheaper). forbid: ops that may not appear
    rewritten (auto-tuning's way to draw distinct candidates). memory_weight: each value's bytes priced again,
    this many times, as memory (under a memory budget).
    """
    nodes = snapshot.nodes
    parameters = graph.parameter_names() if prepared else frozenset()
    parameter_only = _parameter_only_nodes(snapshot, parameters) if parameters else [False] * len(nodes)

    # a parameter-only value bigger than its inputs (a broadcast bias) is kept once only when parameter-only work
    # reads it; read per call, it is cheaper fused into its reader, so extraction does not price it as free
    def size(eclass: str) -> int:
        return value_bytes(snapshot.shape.get(eclass), snapshot.dtype.get(eclass))

    free = [
        parameter_only[i] and not _expands(size(n.eclass), [size(c) for c in n.children]) for i, n in enumerate(nodes)
    ]
    costs, roots, baseline = extraction_problem(graph, snapshot, profile, free, forbid, memory_weight)
    method = extractor
    kept = set(_original_keys(graph, snapshot))
    bans = 0  # the shape rules agree with the lowerings (tests/test_shapes.py): expected to stay 0
    for _ in range(20):
        choice, report = extract(nodes, costs, roots, method, extract_seconds, baseline, profile.min_gain)
        method = "greedy" if extractor == "auto" else extractor  # after a ban, the ILP has had its turn
        order = [choice[c] for c in reachable(nodes, choice, roots)]
        # nodes of the captured program are typed by jax already: only rewritten ones need checking
        banned = [i for i in order if _key(nodes[i]) not in kept and not _typechecks(nodes[i], snapshot)]
        if not banned:
            break
        bans += len(banned)
        for i in banned:
            costs[i] = math.inf
    else:
        raise RuntimeError("extraction kept choosing ill-typed nodes")
    plan = _assemble(graph, snapshot, profile, parameter_only, free, choice, order, kept)
    report.typecheck_bans = bans
    plan.extraction = report
    return plan


def extraction_problem(
    graph: Graph,
    snapshot: Snapshot,
    profile: Profile,
    free: list[bool] | None = None,
    forbid: frozenset[str] = frozenset(),
    memory_weight: float = 0.0,
) -> tuple[list[float], list[str], dict[str, int]]:
    """What an extractor solves: each e-node's cost (the `free` ones, parameter-only, at 0, forbidden rewrites
    infinite, the bytes of its value priced memory_weight more times), the root e-classes, and the original
    program's choice."""
    nodes = snapshot.nodes
    costs = [math.inf if node.subsumed else _cost(node, snapshot, profile) for node in nodes]
    if free is not None:
        costs = [0.0 if f and math.isfinite(c) else c for c, f in zip(costs, free, strict=True)]
    if memory_weight:
        for i, node in enumerate(nodes):
            if costs[i] and math.isfinite(costs[i]):
                size = value_bytes(snapshot.shape.get(node.eclass), snapshot.dtype.get(node.eclass))
                costs[i] += memory_weight * size / profile.bandwidth
    if forbid:
        kept = set(_original_keys(graph, snapshot))
        for i, node in enumerate(nodes):
            if node.op in forbid and _key(node) not in kept:
                costs[i] = math.inf
    return costs, [snapshot.orig[i] for i in graph.roots()], _original_choice(graph, snapshot)


def original_costs(graph: Graph, profile: Profile) -> dict[int, Cost]:
    """The cost of each node of the program as captured that its results need (dead code is free in XLA too)."""
    costs = {}
    for i in sorted(graph.live()):
        node = graph.nodes[i]
        in_shapes = [graph.nodes[i].shape for i in node.inputs]
        costs[i] = node_cost(node.op, in_shapes, node.shape, node.dtype, profile, node.attrs)
    return costs


def plan_costs(nodes: list[PlanNode], graph: Graph, profile: Profile) -> tuple[Cost, Cost, list[float]]:
    """A plan's predicted cost (its nodes' sum), the original program's, and the seconds of each original node."""
    predicted, original = Cost(), Cost()
    for n in nodes:
        predicted += n.cost
    costs = original_costs(graph, profile)
    for cost in costs.values():
        original += cost
    return predicted, original, [costs[i].seconds if i in costs else 0.0 for i in range(len(graph.nodes))]


def _cost(node: ENode, snapshot: Snapshot, profile: Profile) -> float:
    if node.op in _STRUCTURAL:
        return 0.0
    if node.op == OPAQUE:
        return node_cost(OPAQUE, [], snapshot.shape.get(node.eclass), snapshot.dtype.get(node.eclass), profile).seconds
    in_shapes = [snapshot.shape.get(c) for c in node.children]
    out_shape = snapshot.shape.get(node.eclass)
    if out_shape is None or any(s is None for s in in_shapes):
        return math.inf
    return node_cost(node.op, in_shapes, out_shape, snapshot.dtype.get(node.eclass), profile, node.attrs).seconds


def _typechecks(node: ENode, snapshot: Snapshot) -> bool:
    if OPS[node.op].structural:
        return True
    avals = tuple((snapshot.shape[c], snapshot.dtype[c]) for c in node.children)
    return infer(node.op, tuple(node.attrs), avals) == (
        snapshot.shape[node.eclass],
        snapshot.dtype[node.eclass],
    )


def _parameter_only_nodes(snapshot: Snapshot, parameters: frozenset[str]) -> list[bool]:
    """Which e-nodes compute from the parameter Vars alone (a fixpoint over the e-graph)."""
    nodes = snapshot.nodes
    parameter_only = [False] * len(nodes)
    classes: set[str] = set()
    changed = True
    while changed:
        changed = False
        for i, node in enumerate(nodes):
            if parameter_only[i]:
                continue
            if node.attrs[0] in parameters if node.op == VAR else all(c in classes for c in node.children):
                parameter_only[i], changed = True, True
                classes.add(node.eclass)
    return parameter_only


def _expands(out_bytes: int, in_bytes: list[int]) -> bool:
    """A value bigger than its inputs: kept once, every call would read it in full, where XLA fuses it into its
    reader for free (kept broadcasts of biases made equinox's CNN 0.62x of jax.jit)."""
    return bool(in_bytes) and out_bytes > sum(in_bytes)


def _assemble(
    graph: Graph,
    snapshot: Snapshot,
    profile: Profile,
    parameter_only: list[bool],
    free: list[bool],
    choice: dict[str, int],
    order: list[int],
    kept: set[tuple],
) -> Plan:
    """The plan of the chosen nodes (kept: the original nodes' keys). A parameter-only node that is not free (it
    expands its inputs) is kept once only where parameter-only work alone reads it; read per call, it is computed
    per call at its full cost."""
    nodes = snapshot.nodes
    per_call_cost: dict[int, Cost] = {}  # plan node -> its cost if computed per call, for the expanding ones
    index: dict[str, int] = {}  # e-class -> plan node
    lists: dict[str, tuple[int, ...]] = {}  # TList e-class -> plan nodes
    plan_nodes: list[PlanNode] = []
    members: list[list[int]] = []  # per plan node: the original graph nodes it stands for
    originals = _live_originals(graph, snapshot)
    for i in order:
        node = nodes[i]
        if node.op == TNIL:
            lists[node.eclass] = ()
            continue
        if node.op == TCONS:
            lists[node.eclass] = (index[node.children[0]], *lists[node.children[1]])
            continue
        inputs = lists[node.children[0]] if node.op == OPAQUE else tuple(index[c] for c in node.children)
        shape, dtype = snapshot.shape.get(node.eclass), snapshot.dtype.get(node.eclass)
        in_shapes = [plan_nodes[j].shape for j in inputs]
        priced = node.op not in _STRUCTURAL and not (parameter_only[i] and free[i])
        full = node_cost(node.op, in_shapes, shape, dtype, profile, node.attrs) if priced else Cost()
        cost = Cost() if parameter_only[i] else full
        if parameter_only[i] and not free[i]:
            per_call_cost[len(plan_nodes)] = full
        rewritten = _key(node) not in kept
        plan_nodes.append(
            PlanNode(node.op, inputs, tuple(node.attrs), shape, dtype, cost, rewritten, parameter_only[i])
        )
        members.append(originals.get((None, node.eclass) if rewritten else _key(node), []))
        index[node.eclass] = len(plan_nodes) - 1
    outputs = [index[snapshot.orig[i]] for i in graph.outputs]
    effects = [index[snapshot.orig[i]] for i in graph.effects]
    per_call_reads = set(outputs)
    per_call_reads.update(j for n in plan_nodes if not n.parameter_only for j in n.inputs)
    for j in per_call_reads & per_call_cost.keys():
        plan_nodes[j] = dataclasses.replace(plan_nodes[j], parameter_only=False, cost=per_call_cost[j])
    provenance.attach(plan_nodes, members, graph)
    plan_nodes = widen(plan_nodes, [*outputs, *effects], profile)
    return _plan(graph, snapshot, profile, plan_nodes, outputs, effects, members)


def _live_originals(graph: Graph, snapshot: Snapshot) -> dict[tuple, list[int]]:
    """An original node's key (or, under (None, e-class), its e-class) -> the live graph nodes it is."""
    originals: dict[tuple, list[int]] = {}
    live = graph.live()
    for g, key in enumerate(_original_keys(graph, snapshot)):
        if g in live:
            originals.setdefault(key, []).append(g)
            originals.setdefault((None, key[0]), []).append(g)
    return originals


def _plan(
    graph: Graph,
    snapshot: Snapshot,
    profile: Profile,
    plan_nodes: list[PlanNode],
    outputs: list[int],
    effects: list[int],
    members: list[list[int]],
) -> Plan:
    """The plan of the assembled nodes, with its predicted cost beside the original program's and the search's
    statistics."""
    predicted, original, original_seconds = plan_costs(plan_nodes, graph, profile)
    return Plan(
        target=profile.name,
        nodes=plan_nodes,
        outputs=outputs,
        effects=effects,
        predicted=predicted,
        original=original,
        stop_reason=snapshot.stop_reason,
        stats={
            "original_nodes": len(graph.live()),
            "bodies_rewritten": graph.bodies_rewritten,
            "iterations": snapshot.iterations,
            "enodes": len(snapshot.nodes),
            "eclasses": snapshot.num_classes,
        },
        rules_fired={name: count for name, count in snapshot.rule_matches.items() if count},
        graph=graph,
        original_seconds=original_seconds,
        members=members,
    )


def _original_choice(graph: Graph, snapshot: Snapshot) -> dict[str, int]:
    """The e-node of each original node's e-class that is the original node: the program as it came in. Where
    rewrites proved two original nodes equal, the earlier one is kept: its inputs come earlier still, so the
    choice stays acyclic."""
    by_key = {_key(node): i for i, node in enumerate(snapshot.nodes)}
    choice: dict[str, int] = {}
    for key in _original_keys(graph, snapshot):  # in program order
        if key in by_key:
            choice.setdefault(key[0], by_key[key])
    for i, node in enumerate(snapshot.nodes):  # TList cells of opaque calls are not graph nodes; any will do
        if node.op in (TCONS, TNIL):
            choice.setdefault(node.eclass, i)
    return choice


def _key(node: ENode) -> tuple:
    return (node.eclass, node.op, tuple(node.attrs), () if node.op == OPAQUE else node.children)


def _original_keys(graph: Graph, snapshot: Snapshot) -> list[tuple]:
    """(e-class, op, attrs, input e-classes) of every original node, in program order: what _key gives the e-node
    that is that original node, to tell rewritten plan nodes apart."""
    return [
        (
            snapshot.orig.get(i),
            n.op,
            tuple(n.attrs),
            () if n.op == OPAQUE else tuple(snapshot.orig[j] for j in n.inputs),
        )
        for i, n in enumerate(graph.nodes)
    ]
