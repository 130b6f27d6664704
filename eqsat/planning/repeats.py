"""Repeated layers, planned once: a model written as a Python loop over identical layers captures as one long
program whose layers are copies of each other, and saturating it costs time in proportion to its depth.

`find` looks for a run of identical blocks in the captured graph (the same ops, attributes, shapes and wiring,
each reading its own weights), `split` cuts the graph into one block and the glue around its instances (each
instance an opaque call there), and `compose` puts the plans of the two back together: the block's plan copied
into every instance, reading that instance's inputs. Rewrites within a layer are found once for all of them;
rewrites across a layer's boundary are not looked for.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eqsat.capture.ir import Graph, Node, Opaque, Role, Variable
from eqsat.egraph.saturate import Snapshot, StopReason
from eqsat.extract import provenance
from eqsat.extract.cost import Profile
from eqsat.extract.plan import Plan, PlanNode, plan_costs
from eqsat.ops.table import GET, OPAQUE, OPS, VAR

MIN_INSTANCES = 4  # fewer layers are saturated as one program: rewrites across layers stay in reach
MIN_NODES = 8  # a shorter period is a chain or a pattern of ops, not a layer: the rules must see it whole
_CANDIDATE_PERIODS = 8  # the most frequent gaps between equal nodes tried as periods: a layer's is among them


@dataclass(frozen=True)
class Repeat:
    """Identical blocks of a graph: each instance's nodes in block order, the nodes outside it that it reads (in
    the block's input order), and the block places read outside an instance."""

    instances: list[list[int]]
    inputs: list[list[int]]
    outputs: list[int]
    shared: frozenset[int] = frozenset()  # input places that hold the same constant in every instance


@dataclass
class Placeholder:
    """The opaque primitive that stands for one instance in the glue (never bound: compose replaces it)."""

    name: str = "repeat"  # what reports call the op


@dataclass
class Split:
    """A graph cut at its repeats: the glue (each instance an opaque call) and one graph per repeated block."""

    glue: Graph
    calls: dict[int, tuple[int, int]]  # glue opaque index -> (repeat, instance)
    repeats: list[Repeat]
    blocks: list[Graph]
    glue_of: dict[int, int]  # glue node -> the graph node it copies


def find(graph: Graph) -> list[Repeat]:
    """The repeats of the graph, none overlapping: the longest run of identical blocks first, then the longest in
    what is left before and after it."""
    live = graph.live()
    effects = set(graph.effects)
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        for j in node.inputs:
            readers.setdefault(j, []).append(i)
    order = [i for i in range(len(graph.nodes)) if i in live and graph.nodes[i].op != VAR]
    keys: dict[Any, int] = {}
    codes = np.array([keys.setdefault(_signature(graph, i), len(keys)) for i in order], dtype=np.int64)
    found: list[Repeat] = []
    spans = [(0, len(order))]
    while spans:
        lo, hi = spans.pop()
        best = _best_run(codes[lo:hi])
        if best is None:
            continue
        start, period, length = best
        start += lo + (offset := _phase(graph, order, start + lo, period, length, readers))
        repeat = _repeat(graph, order, start, period, (length - offset) // period, effects, readers)
        if repeat is None:
            continue
        found.append(repeat)
        end = start + period * len(repeat.instances)
        spans += [(lo, start), (end, hi)]
    return found


def _signature(graph: Graph, i: int) -> tuple:
    node = graph.nodes[i]
    attrs: Any = node.attrs
    if node.op == OPAQUE:  # its call's primitive and parameters, not its place in the opaque list
        call = graph.opaque[node.attrs[0]]
        attrs = (call.primitive, tuple((k, _hashable(v)) for k, v in sorted(call.params.items())))
    return node.op, attrs, node.shape, node.dtype, len(node.inputs)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))  # an unhashable parameter matches only itself
    return ("id", id(value)) if isinstance(value, np.ndarray) else value


def _best_run(codes: np.ndarray) -> tuple[int, int, int] | None:
    """(start, period, length) of the run of identical blocks covering the most nodes, the shortest period among
    equals (length: the nodes from start that its blocks can cover); None unless that period is a layer's
    (MIN_NODES) repeated MIN_INSTANCES times."""
    n = len(codes)
    if n < MIN_NODES * MIN_INSTANCES:
        return None
    gaps: Counter[int] = Counter()
    last: dict[int, int] = {}
    for p, code in enumerate(codes.tolist()):
        if code in last:
            gaps[p - last[code]] += 1
        last[code] = p
    best: tuple[int, int, int] | None = None
    for period, _ in gaps.most_common(_CANDIDATE_PERIODS):
        if period * 2 > n:
            continue
        same = np.concatenate([[False], codes[:-period] == codes[period:], [False]])
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        starts, ends = edges[0::2], edges[1::2]
        if not len(starts):
            continue
        k = int(np.argmax(ends - starts))
        length = int(ends[k] - starts[k]) + period  # the nodes the run's blocks can cover
        covered = length // period * period
        if (
            best is None
            or covered > best[2] // best[1] * best[1]
            or (covered == best[2] // best[1] * best[1] and period < best[1])
        ):
            best = (int(starts[k]), period, length)
    if best is None or best[1] < MIN_NODES or best[2] // best[1] < MIN_INSTANCES:
        return None
    return best


def _phase(graph: Graph, order: list[int], start: int, period: int, length: int, readers: dict[int, list[int]]) -> int:
    """Where in the run the blocks start: of the offsets that fit the most blocks, the one whose block crosses
    the fewest edges (a layer's own boundary, where the rewrites within it are whole)."""
    fits = length - length // period * period  # offsets 0..fits keep every block

    def crossing(offset: int) -> int:
        block = set(order[start + offset : start + offset + period])
        read = {j for i in block for j in graph.nodes[i].inputs if j not in block}
        return len(read) + sum(any(r not in block for r in readers.get(i, ())) for i in block)

    return min(range(fits + 1), key=crossing)


def _repeat(
    graph: Graph,
    order: list[int],
    start: int,
    period: int,
    count: int,
    effects: set[int],
    readers: dict[int, list[int]],
) -> Repeat | None:
    """The instances of the run's blocks wired alike, the longest stretch of them; None if fewer than
    MIN_INSTANCES."""
    blocks = [order[start + k * period : start + (k + 1) * period] for k in range(count)]
    wirings = [_wiring(graph, block) for block in blocks]
    best: tuple[int, int] = (0, 0)
    first = 0
    for k in range(1, count + 1):
        if k == count or wirings[k][0] != wirings[first][0]:
            if k - first > best[1] - best[0]:
                best = (first, k)
            first = k
    lo, hi = best
    if hi - lo < MIN_INSTANCES or any(i in effects for block in blocks[lo:hi] for i in block):
        return None
    chosen = blocks[lo:hi]
    if _merges_across(graph, chosen):
        return None
    inputs = [wirings[k][1] for k in range(lo, hi)]
    outputs = _outputs(graph, chosen, readers)
    shared = frozenset(
        m
        for m, node in enumerate(inputs[0])
        if graph.nodes[node].op == VAR
        and (value := graph.consts.get(graph.nodes[node].attrs[0])) is not None
        and all(_same_constant(graph, value, row[m]) for row in inputs[1:])
    )
    return Repeat(chosen, inputs, outputs, shared)


def _merges_across(graph: Graph, instances: list[list[int]]) -> bool:
    """Whether contractions of two instances read one value from outside them: a recurrent cell's input GEMMs on
    its shared weight, a NASNet cell's convs of the hidden state two cells read. Their merge is a rewrite across
    layers, which planning one block would not find, so such layers are planned as one program."""
    readers: dict[int, int] = {}
    for k, block in enumerate(instances):
        inside = set(block)
        for i in block:
            node = graph.nodes[i]
            if OPS.get(node.op) is None or OPS[node.op].merge_key is None:
                continue
            for j in node.inputs:
                if j not in inside and readers.setdefault(j, k) != k:
                    return True
    return False


def _same_constant(graph: Graph, value: np.ndarray, node: int) -> bool:
    other = graph.consts.get(graph.nodes[node].attrs[0]) if graph.nodes[node].op == VAR else None
    return other is not None and other.dtype == value.dtype and np.array_equal(other, value)


def _wiring(graph: Graph, block: list[int]) -> tuple[tuple, list[int]]:
    """The block's shape of wiring (each input a place in the block or an input of the block, with the kind of
    value it is) and the nodes outside it that it reads, in order of first use."""
    place = {node: q for q, node in enumerate(block)}
    outside: dict[int, int] = {}
    kinds: list[Any] = []
    wiring = []
    for node in block:
        refs = []
        for j in graph.nodes[node].inputs:
            if j in place:
                refs.append(("in", place[j]))
                continue
            if j not in outside:
                outside[j] = len(outside)
                kinds.append(_kind(graph, j))
            refs.append(("out", outside[j]))
        wiring.append(tuple(refs))
    return (tuple(wiring), tuple(kinds)), list(outside)


def _kind(graph: Graph, node: int) -> tuple:
    """What the block may assume of an input: its role (a computed value changes from call to call, as an
    argument does), shape and dtype."""
    n = graph.nodes[node]
    return _role(graph, node), n.shape, n.dtype


def _role(graph: Graph, node: int) -> Role:
    n = graph.nodes[node]
    return graph.variable(n.attrs[0]).role if n.op == VAR else Role.ARGUMENT


def _outputs(graph: Graph, instances: list[list[int]], readers: dict[int, list[int]]) -> list[int]:
    """Places whose value some instance's outside reads (a later node, or a result of the graph)."""
    results = set(graph.outputs)
    places: set[int] = set()
    for block in instances:
        inside = set(block)
        places.update(
            q for q, node in enumerate(block) if node in results or any(r not in inside for r in readers.get(node, ()))
        )
    return sorted(places)


def split(graph: Graph, repeats: Sequence[Repeat]) -> Split:
    """The glue and the blocks of a graph cut at these repeats."""
    blocks = [_block(graph, repeat) for repeat in repeats]
    glue = Graph(consts=graph.consts, opaque=list(graph.opaque), bodies_rewritten=graph.bodies_rewritten)
    glue.variables = dict(graph.variables)
    last: dict[int, tuple[int, int]] = {}
    member: set[int] = set()
    for r, repeat in enumerate(repeats):
        for k, instance in enumerate(repeat.instances):
            last[max(instance)] = (r, k)
            member.update(instance)
    new: dict[int, int] = {}
    calls: dict[int, tuple[int, int]] = {}
    glue_of: dict[int, int] = {}
    live = graph.live()
    for i, node in enumerate(graph.nodes):
        if i not in live and node.op != VAR:  # dead code may read an instance's inner values
            continue
        if i in member:
            if i in last:
                r, k = last[i]
                repeat = repeats[r]
                calls[len(glue.opaque)] = (r, k)
                glue.opaque.append(Opaque(Placeholder(), {}, True))  # `calls` says which instance it is
                call = glue.add(Node(OPAQUE, tuple(new[j] for j in repeat.inputs[k]), (len(glue.opaque) - 1,)))
                for n, q in enumerate(repeat.outputs):
                    out = graph.nodes[repeat.instances[k][q]]
                    new[repeat.instances[k][q]] = glue.add(Node(GET, (call,), (n,), out.shape, out.dtype))
            continue
        new[i] = glue.add(Node(node.op, tuple(new[j] for j in node.inputs), node.attrs, node.shape, node.dtype))
        glue_of[new[i]] = i
        if i in graph.where:
            glue.where[new[i]] = graph.where[i]
    glue.inputs = [new[i] for i in graph.inputs]
    glue.outputs = [new[i] for i in graph.outputs]
    glue.effects = [new[i] for i in graph.effects]
    return Split(glue, calls, list(repeats), blocks, glue_of)


def _block(graph: Graph, repeat: Repeat) -> Graph:
    """The first instance as a program of its own: a Var per input, b0, b1, ... (a constant the same in every
    instance stays itself), then its nodes in block order; its results are the places read outside."""
    block = Graph(consts=graph.consts, opaque=graph.opaque)
    instance, inputs = repeat.instances[0], repeat.inputs[0]
    new: dict[int, int] = {}
    for m, j in enumerate(inputs):
        source = graph.nodes[j]
        shared = m in repeat.shared
        name = source.attrs[0] if shared else f"b{m}"
        block.variables[name] = graph.variables[name] if shared else Variable(_role(graph, j))
        new[j] = block.add(Node(VAR, (), (name,), source.shape, source.dtype))
        if not shared:
            block.inputs.append(new[j])
    for i in instance:
        node = graph.nodes[i]
        new[i] = block.add(Node(node.op, tuple(new[j] for j in node.inputs), node.attrs, node.shape, node.dtype))
        if i in graph.where:
            block.where[new[i]] = graph.where[i]
    block.outputs = [new[instance[q]] for q in repeat.outputs]
    return block


@dataclass
class Repeated:
    """A graph saturated in parts: the glue's e-graph and each block's (Planner.extract composes their plans)."""

    parts: Split
    glue: Snapshot
    blocks: list[Snapshot]


def snapshots(snapshot: Snapshot | Repeated) -> list[Snapshot]:
    """The e-graphs a saturation made: one, or the glue's and each block's."""
    return [snapshot.glue, *snapshot.blocks] if isinstance(snapshot, Repeated) else [snapshot]


def compose(graph: Graph, parts: Split, glue: Plan, blocks: Sequence[Plan], profile: Profile) -> Plan:
    """The plan of the whole graph: the glue's, with each instance's call replaced by its block's plan reading the
    instance's inputs."""
    spliced = _Spliced()
    at: dict[int, int] = {}  # glue plan node -> plan node
    results: dict[int, list[int]] = {}  # glue plan node of a call -> the plan nodes of its results
    for g, node in enumerate(glue.nodes):
        if node.op == OPAQUE and node.attrs[0] in parts.calls:
            r, k = parts.calls[node.attrs[0]]
            results[g] = spliced.instance(blocks[r], parts.repeats[r], k, [at[j] for j in node.inputs])
        elif node.op == GET and node.inputs[0] in results:
            at[g] = results[node.inputs[0]][node.attrs[0]]
        else:
            stands_for = [parts.glue_of[m] for m in glue.members[g] if m in parts.glue_of]
            at[g] = spliced.add(node, tuple(at[j] for j in node.inputs), stands_for)
    provenance.attach(spliced.nodes, spliced.members, graph)
    predicted, original, original_seconds = plan_costs(spliced.nodes, graph, profile)
    fired = Counter(glue.rules_fired)
    for block in blocks:
        fired.update(block.rules_fired)
    unsaturated = [p.stop_reason for p in (*blocks, glue) if p.stop_reason != StopReason.SATURATED]
    return Plan(
        target=glue.target,
        nodes=spliced.nodes,
        outputs=[at[o] for o in glue.outputs],
        effects=[at[o] for o in glue.effects],
        predicted=predicted,
        original=original,
        stop_reason=unsaturated[0] if unsaturated else glue.stop_reason,
        stats=_stats(graph, parts, glue, blocks),
        rules_fired=dict(fired),
        graph=graph,
        extraction=glue.extraction,
        original_seconds=original_seconds,
    )


class _Spliced:
    """The whole graph's plan nodes as compose adds them, with the original graph nodes each stands for; one Var
    per input or constant, however many copies read it."""

    def __init__(self) -> None:
        self.nodes: list[PlanNode] = []
        self.members: list[list[int]] = []
        self.named: dict[str, int] = {}  # a Var's plan node, by name

    def add(self, node: PlanNode, inputs: tuple[int, ...], stands_for: list[int]) -> int:
        if node.op == VAR and str(node.attrs[0]) in self.named:
            return self.named[str(node.attrs[0])]
        self.nodes.append(replace(node, inputs=inputs))
        self.members.append(stands_for)
        if node.op == VAR:
            self.named[str(node.attrs[0])] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def instance(self, block: Plan, repeat: Repeat, k: int, call_inputs: list[int]) -> list[int]:
        """Add the block's plan as instance k, reading call_inputs (plan nodes); the plan nodes of its results."""
        instance = repeat.instances[k]
        first = len(repeat.inputs[k])  # the block graph's input Vars come before its instance's nodes
        inputs = {f"b{m}": m for m in range(first) if m not in repeat.shared}
        local: dict[int, int] = {}
        for b, inner in enumerate(block.nodes):
            if inner.op == VAR and inner.attrs[0] in inputs:
                local[b] = call_inputs[inputs[inner.attrs[0]]]
                continue
            stands_for = [instance[m - first] for m in block.members[b] if m >= first]
            local[b] = self.add(inner, tuple(local[j] for j in inner.inputs), stands_for)
        return [local[o] for o in block.outputs]


def _stats(graph: Graph, parts: Split, glue: Plan, blocks: Sequence[Plan]) -> dict[str, Any]:
    """The glue's statistics with the blocks' searches added in (their deepest saturation for the iterations)."""
    stats = dict(glue.stats)
    for block in blocks:
        for key, value in block.stats.items():
            if key in ("enodes", "eclasses") or key.startswith("timing_") or key == "measure_s":
                stats[key] = stats.get(key, 0) + value
        stats["iterations"] = max(stats.get("iterations", 0), block.stats.get("iterations", 0))
    stats["original_nodes"] = len(graph.live())
    stats["repeated_layers"] = sum(len(repeat.instances) for repeat in parts.repeats)
    return stats
