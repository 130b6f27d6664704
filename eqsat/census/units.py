"""The kernels of a program as XLA runs them, for the census (eqsat/census/census.py): each op that is not fused alone,
each chain of elementwise ops as one loop; each kernel keyed for the timing cache, described for people, priced by the
roofline and timed alone on this device; and the alternatives the rules put beside each."""

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.core import ShapedArray

from eqsat.capture.ir import Graph, Node
from eqsat.egraph.rule_sources import RuleSource
from eqsat.egraph.saturate import Saturation, saturate
from eqsat.extract import timing
from eqsat.extract.cost import Profile, node_cost, node_key
from eqsat.numerics.sample import example_like
from eqsat.ops.table import OPAQUE, OPS, VAR, CostClass

_FUSED = (CostClass.ELEMENTWISE, CostClass.BITCAST)  # XLA fuses these into loops with their neighbours
# primitives eqsat does not capture that XLA fuses into loops all the same: a pad joins its producer's loop (a zero
# padding before a strided conv, keras' ZeroPadding2D), where timed alone it read as a pass of its own (0.94 ms of
# EfficientNetB0's 23 ms plan that no kernel of the program spends: benches/RESULTS.md, session 20)
_LOOP_PRIMITIVES = ("pad", "convert_element_type", "stop_gradient")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # a function's address in a printed parameter differs per process
_UNMEASURABLE = ("while",)  # a loop run on random inputs may not end: listed, timed only as part of the program


@dataclass(frozen=True)
class Unit:
    """One kernel of the program: the graph nodes it runs (in order), the values it reads and those it gives."""

    kind: str
    nodes: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def units(graph: Graph) -> list[Unit]:
    """The program's kernels: each op that is not fused (a contraction, a gather, a pool, an opaque primitive) alone,
    and each group of elementwise ops joined by values that only they read (XLA's loop fusions; a value a kernel
    also reads is written out, so the loop ends there). A reshape, broadcast or parameter-only op feeding several
    loops is recomputed in each, as XLA does."""
    live = sorted(graph.live())
    consumers: dict[int, list[int]] = {i: [] for i in live}
    for i in live:
        for j in graph.nodes[i].inputs:
            consumers[j].append(i)

    def fused(i: int) -> bool:
        node = graph.nodes[i]
        if node.op == OPAQUE:
            return graph.op_name(node.op, node.attrs) in _LOOP_PRIMITIVES
        return node.op in OPS and OPS[node.op].cost_class in _FUSED

    def source(i: int) -> bool:
        node = graph.nodes[i]
        return node.op != OPAQUE and OPS[node.op].cost_class is CostClass.SOURCE

    # cheap to recompute in every loop that reads it: reshapes and broadcasts, and what reads sources alone
    shared = {i for i in live if fused(i) and (OPS[graph.nodes[i].op].view or all(
        source(j) for j in graph.nodes[i].inputs))}  # fmt: skip
    parent = {i: i for i in live if fused(i) and i not in shared}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def producers(i: int) -> list[int]:
        """The loop ops i reads, through reshapes and broadcasts that i alone reads."""
        found = []
        for j in graph.nodes[i].inputs:
            found += producers(j) if j in shared and len(consumers[j]) == 1 else [j] if j in parent else []
        return found

    for i in parent:
        for j in producers(i):
            if all(fused(c) for c in consumers[j]):  # read by loops alone: fused into them
                parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in parent:
        groups.setdefault(find(i), []).append(i)
    roots = set(graph.roots())
    for i in shared:  # one read by a kernel (a broadcast weight) or a program output is a loop of its own
        if i in roots or any(not fused(c) for c in consumers[i]):
            groups[i] = [i]
    units = []
    for members in groups.values():
        nodes = _with_shared(graph, members, shared)
        if all(_bitcast(graph.nodes[i].op) for i in nodes):  # no kernel at all
            continue
        units.append(_unit(graph, "fused", nodes, consumers))
    for i in live:
        if not fused(i) and not source(i):
            units.append(_unit(graph, "opaque" if graph.nodes[i].op == OPAQUE else "kernel", [i], consumers))
    return units


def _bitcast(op: str) -> bool:
    """A row-major reshape: XLA moves no data for it."""
    return op in OPS and OPS[op].cost_class is CostClass.BITCAST


def _with_shared(graph: Graph, members: list[int], shared: set[int]) -> list[int]:
    """The members and the shared ops they read (through other shared ops), in program order."""
    found, stack = set(members), list(members)
    while stack:
        for j in graph.nodes[stack.pop()].inputs:
            if j in shared and j not in found:
                found.add(j)
                stack.append(j)
    return sorted(found)


def _unit(graph: Graph, kind: str, nodes: list[int], consumers: dict[int, list[int]]) -> Unit:
    inside = set(nodes)
    inputs = tuple(dict.fromkeys(j for i in nodes for j in graph.nodes[i].inputs if j not in inside))
    roots = set(graph.roots())
    outputs = tuple(i for i in nodes if i in roots or any(c not in inside for c in consumers[i]))
    return Unit(kind, tuple(nodes), inputs, outputs)


def unit_key(graph: Graph, unit: Unit) -> str:
    """The unit's timing-cache key: an op of the table keyed as planning keys it; a fused loop or an opaque call by
    a digest of what it computes (ops, attributes, parameters, how they connect), with its input shapes."""
    in_shapes = [graph.nodes[j].shape for j in unit.inputs]
    first = graph.nodes[unit.nodes[0]]
    if unit.kind == "kernel":
        return node_key(first.op, first.attrs, in_shapes, first.dtype)
    where = {j: ("x", k) for k, j in enumerate(unit.inputs)} | {i: ("n", k) for k, i in enumerate(unit.nodes)}
    described = []
    for i in unit.nodes:
        node = graph.nodes[i]
        what: Any = _plain(node.attrs)
        if node.op == OPAQUE:
            call = graph.opaque[node.attrs[0]]
            what = (call.primitive.name, sorted(call.params.items(), key=lambda kv: kv[0]))
        described.append((node.op, what, [where[j] for j in node.inputs], _plain(node.shape), node.dtype))
    described.append(("out", [where[i] for i in unit.outputs]))
    text = _ADDRESS.sub("", repr(described)) + repr([graph.nodes[j].dtype for j in unit.inputs])
    digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
    return node_key(f"census:{unit.kind}", (digest,), in_shapes, first.dtype)


def _plain(value: Any) -> Any:
    """Attributes and shapes as plain tuples, so a key is the same for a plan built here and one loaded from the
    plan store (named tuples such as ConvAttrs there, lists from JSON)."""
    return tuple(map(_plain, value)) if isinstance(value, (tuple, list)) else value


def unit_roofline(graph: Graph, unit: Unit, profile: Profile) -> float:
    total = 0.0
    for i in unit.nodes:
        node = graph.nodes[i]
        in_shapes = [graph.nodes[j].shape for j in node.inputs]
        total += node_cost(node.op, in_shapes, node.shape, node.dtype, profile, node.attrs).seconds
    return total


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "i32", "int64": "i64"}


def _type(shape: Any, dtype: Any) -> str:
    """f32[2,112,112,32]; the tuple of a multi-result call is `tuple`."""
    if shape is None:
        return "tuple"
    return f"{_SHORT.get(dtype, dtype)}[{','.join(map(str, shape))}]"


def describe(graph: Graph, unit: Unit) -> tuple[str, str]:
    """(name, detail) of a unit for people: the op or primitive, or the ops a loop fuses; its types."""
    nodes = [graph.nodes[i] for i in unit.nodes]
    types = " ".join(_type(graph.nodes[j].shape, graph.nodes[j].dtype) for j in unit.inputs)
    out = " ".join(_type(graph.nodes[i].shape, graph.nodes[i].dtype) for i in unit.outputs)
    if unit.kind == "fused":
        counts: dict[str, int] = {}
        for node in nodes:
            if not _bitcast(node.op):
                name = graph.op_name(node.op, node.attrs)
                counts[name] = counts.get(name, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        name = "fused " + ",".join(op if n == 1 else f"{n} {op}" for op, n in ranked[:4])
        name += ",..." if len(ranked) > 4 else ""
        return name, f"{types} -> {out}"
    node = nodes[0]
    attrs = "" if unit.kind == "opaque" else _attrs_text(node.attrs)
    return graph.op_name(node.op, node.attrs), f"{types} -> {out}" + (f" {attrs}" if attrs else "")


def _attrs_text(attrs: tuple) -> str:
    text = ",".join(map(str, attrs)).replace(" ", "")
    return "" if not text else f"[{text}]" if len(text) <= 60 else f"[{text[:57]}...]"


def _example(graph: Graph, j: int, seed: int) -> Any:
    node = graph.nodes[j]
    return jax.numpy.asarray(example_like(ShapedArray(node.shape, node.dtype), seed))


def measure_alone(graph: Graph, unit: Unit) -> float | None:
    """The unit compiled alone on random inputs of its types and timed as the timing cache times a kernel."""
    node = graph.nodes[unit.nodes[0]]
    if node.op == OPAQUE and graph.opaque[node.attrs[0]].primitive.name in _UNMEASURABLE:
        raise ValueError("a loop on random inputs may not end")
    with jax.ensure_compile_time_eval():
        args = tuple(_example(graph, j, seed) for seed, j in enumerate(unit.inputs))

        def run(*xs: Any) -> list[Any]:
            values = dict(zip(unit.inputs, xs, strict=True))
            for i in unit.nodes:
                n = graph.nodes[i]
                values[i] = graph.apply(n.op, n.attrs, [values[j] for j in n.inputs], _no_variable)
            return [values[i] for i in unit.outputs]

        return timing.time_alone(jax.jit(run), args)


def _no_variable(name: str) -> Any:
    raise AssertionError(f"a kernel reads its inputs as arguments, not Var {name}")


def kernel_rivals(
    graph: Graph, classes: dict[str, Unit], rules: Sequence[RuleSource]
) -> dict[str, list[timing.Wanted]]:
    """For each kernel class (key -> its first unit) of the table whose timing the roofline may miss: the other
    kernels the rules put in its e-class, found by saturating a program of these kernels alone on their input types
    (one e-graph for all)."""
    alone = Graph()
    roots: dict[str, int] = {}  # a kernel's key -> its node in `alone`
    for key, unit in classes.items():
        node = graph.nodes[unit.nodes[0]]
        if unit.kind != "kernel" or not timing.measurable(node.op):
            continue
        inputs = []
        for j in node.inputs:
            source = graph.nodes[j]
            inputs.append(alone.add(Node(VAR, (), (f"x{len(alone.nodes)}",), source.shape, source.dtype)))
            alone.inputs.append(inputs[-1])
        roots[key] = alone.add(Node(node.op, tuple(inputs), node.attrs, node.shape, node.dtype))
        alone.outputs.append(roots[key])
    if not roots:
        return {}
    snapshot = saturate(alone, list(rules), Saturation(iterations=3, seconds=5.0))
    by_class: dict[str, list[timing.Wanted]] = {}
    for wanted in timing.wanted_nodes(snapshot):
        by_class.setdefault(wanted.eclass, []).append(wanted)
    return {key: [w for w in by_class.get(snapshot.orig[i], []) if w.key != key] for key, i in roots.items()}
