"""Plans made readable, comparable and keepable: versioned JSON, side-by-side tables, diffs, DOT and HTML reports.

A saved plan keeps everything but the program's constants and opaque parameters, so a loaded plan can be compared,
diffed and drawn but not run (its `graph` is None, as `backends.lower` expects of loaded plans).
"""

import html
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from eqsat.extract.cost import Cost
from eqsat.extract.plan import Plan, PlanNode
from eqsat.ir import Graph, Node, Opaque, Shape

FORMAT = "eqsat-plan"
VERSION = 1
_SAVED = "_eqsat_saved_original"  # instance attribute holding a loaded plan's original program (Plan has no field)


class PlanFormatError(ValueError):
    """A file or dict that is not a plan this version of eqsat can read."""


@dataclass(frozen=True)
class SavedPrimitive:
    """Stands in for an opaque jax primitive of a loaded plan: only its name was saved."""

    name: str

    def bind(self, *args: Any, **params: Any) -> Any:
        raise RuntimeError(f"a plan loaded from disk cannot run: the parameters of {self.name!r} were not saved")


# ---------------------------------------------------------------------------------------------------- JSON


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data: every compared field of Plan, plus the original program's nodes."""
    graph = original_graph(plan)
    return {
        "format": FORMAT,
        "version": VERSION,
        "plan": _fields_to_dict(plan, _PLAN_ENCODE),
        "original": None if graph is None else _graph_to_dict(graph),
    }


def plan_from_dict(data: dict[str, Any]) -> Plan:
    """The Plan plan_to_dict() described; its original program, if saved, is what original_graph() returns."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise PlanFormatError(f"not an eqsat plan: expected format {FORMAT!r}, found {found!r}")
    if data.get("version") != VERSION:
        raise PlanFormatError(
            f"eqsat plan format version {data.get('version')!r} is not supported; this eqsat reads version {VERSION}"
        )
    try:
        plan = _fields_from_dict(Plan, data["plan"], _PLAN_DECODE)
        if data.get("original") is not None:
            vars(plan)[_SAVED] = _graph_from_dict(data["original"])
    except (KeyError, TypeError, ValueError) as error:
        raise PlanFormatError(f"malformed eqsat plan: {type(error).__name__}: {error}") from None
    return plan


def save_plan(plan: Plan, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(_dumps(plan_to_dict(plan)) + "\n")
    return path


def _dumps(value: Any, indent: str = "") -> str:
    """JSON with one line per small object (a node, a cost), so saved plans read and diff well."""
    flat = json.dumps(value, allow_nan=False, ensure_ascii=False)
    if len(flat) + len(indent) <= 200 or not isinstance(value, dict | list) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + _dumps(v, inner) for v in value) + "\n" + indent + "]"


def load_plan(path: str | Path) -> Plan:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise PlanFormatError(f"{path}: not JSON ({error})") from None
    return plan_from_dict(data)


def original_graph(plan: Plan) -> Graph | None:
    """The program the plan was extracted from: plan.graph, or the saved sketch of a loaded plan."""
    return plan.graph if plan.graph is not None else vars(plan).get(_SAVED)


def _num(x: float) -> float | str:
    # strict JSON has no inf/nan; spell them as strings
    return x if isinstance(x, int) or math.isfinite(x) else str(x)


def _unnum(x: float | str) -> float:
    return float(x) if isinstance(x, str) else x


def _cost_to_dict(cost: Cost) -> dict[str, Any]:
    return {
        "seconds": _num(cost.seconds),
        "flops": _num(cost.flops),
        "bytes": _num(cost.bytes),
        "kernels": cost.kernels,
    }


def _cost_from_dict(d: dict[str, Any]) -> Cost:
    return Cost(_unnum(d["seconds"]), _unnum(d["flops"]), _unnum(d["bytes"]), d["kernels"])


def _attrs_to_list(attrs: tuple[Any, ...]) -> list[Any]:
    # an attribute may be a tuple (a shape, broadcast dimensions): JSON has lists, _attrs_from_list turns them back
    return [_attrs_to_list(a) if isinstance(a, tuple) else _plain(a) for a in attrs]


def _attrs_from_list(attrs: list[Any]) -> tuple[Any, ...]:
    return tuple(_attrs_from_list(a) if isinstance(a, list) else a for a in attrs)


def _shape_from(shape: list[int] | None) -> Shape | None:
    return None if shape is None else tuple(shape)


def _shape_to(shape: Shape | None) -> list[int] | None:
    return None if shape is None else list(shape)


# Field converters to and from JSON, by field name; a field not named here is a JSON scalar (str, number, bool,
# None) or a dict of them, so a new simple field of Plan or PlanNode is saved without touching this module.
_NODE_ENCODE: dict[str, Callable[[Any], Any]] = {
    "inputs": list,
    "attrs": _attrs_to_list,
    "shape": _shape_to,
    "cost": _cost_to_dict,
}
_NODE_DECODE: dict[str, Callable[[Any], Any]] = {
    "inputs": tuple,
    "attrs": _attrs_from_list,
    "shape": _shape_from,
    "cost": _cost_from_dict,
}
_PLAN_ENCODE: dict[str, Callable[[Any], Any]] = {
    "nodes": lambda nodes: [_fields_to_dict(n, _NODE_ENCODE) for n in nodes],
    "outputs": list,
    "effects": list,
    "predicted": _cost_to_dict,
    "original": _cost_to_dict,
    "stats": lambda stats: {k: _num(v) for k, v in stats.items()},
    "rules_fired": dict,
}
_PLAN_DECODE: dict[str, Callable[[Any], Any]] = {
    "nodes": lambda nodes: [_fields_from_dict(PlanNode, n, _NODE_DECODE) for n in nodes],
    "predicted": _cost_from_dict,
    "original": _cost_from_dict,
    "stats": lambda stats: {k: _unnum(v) for k, v in stats.items()},
}


def _fields_to_dict(obj: Any, encode: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The dataclass's compared fields (Plan.graph is not one), each through its converter."""
    return {f.name: encode.get(f.name, _plain)(getattr(obj, f.name)) for f in fields(obj) if f.compare}


def _fields_from_dict(cls: type, data: dict[str, Any], decode: dict[str, Callable[[Any], Any]]) -> Any:
    # fields missing from an older file take their defaults
    return cls(**{name: decode[name](value) if name in decode else value for name, value in data.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, str | int | float | bool | dict | type(None)):
        return value
    if isinstance(value, list):  # e.g. Plan.autotune's candidates: a list of plain dicts
        return [_plain(v) for v in value]
    raise TypeError(f"cannot save {value!r} of type {type(value).__name__} as JSON")


def _graph_to_dict(graph: Graph) -> dict[str, Any]:
    nodes = [
        {
            "op": n.op,
            "name": _op_name(n.op, n.attrs, graph),  # for people reading the file; loading ignores it
            "inputs": list(n.inputs),
            "attrs": _attrs_to_list(n.attrs),
            "shape": None if n.shape is None else list(n.shape),
            "dtype": n.dtype,
        }
        for n in graph.nodes
    ]
    return {
        "nodes": nodes,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "effects": list(graph.effects),
        "consts": sorted(graph.consts),  # names only: the values stay out of the file
        "opaque": [{"primitive": o.primitive.name, "multiple_results": o.multiple_results} for o in graph.opaque],
    }


def _graph_from_dict(d: dict[str, Any]) -> Graph:
    return Graph(
        nodes=[
            Node(n["op"], tuple(n["inputs"]), _attrs_from_list(n["attrs"]), _shape_from(n["shape"]), n["dtype"])
            for n in d["nodes"]
        ],
        inputs=list(d["inputs"]),
        outputs=list(d["outputs"]),
        effects=list(d["effects"]),
        opaque=[Opaque(SavedPrimitive(o["primitive"]), {}, o["multiple_results"]) for o in d["opaque"]],
    )


# ---------------------------------------------------------------------------------------------------- views

# One shape for both programs (the plan and the original), so diffs and drawings treat them alike.


@dataclass(frozen=True)
class _Node:
    op: str
    name: str  # the op, or an opaque call's primitive name
    attrs: tuple[Any, ...]
    inputs: tuple[int, ...]
    shape: Shape | None
    dtype: str | None
    rewritten: bool = False
    cost: Cost | None = None


@dataclass(frozen=True)
class _Program:
    nodes: list[_Node]
    outputs: tuple[int, ...]  # in the program's order, so the two programs' outputs pair up


def _op_name(op: str, attrs: tuple[Any, ...], graph: Graph | None) -> str:
    return graph.op_name(op, attrs) if graph is not None else op


def _plan_program(plan: Plan) -> _Program:
    graph = original_graph(plan)
    nodes = [
        _Node(n.op, _op_name(n.op, n.attrs, graph), n.attrs, n.inputs, n.shape, n.dtype, n.rewritten, n.cost)
        for n in plan.nodes
    ]
    return _Program(nodes, tuple(plan.outputs))


def _original_program(plan: Plan) -> _Program:
    graph = original_graph(plan)
    if graph is None:
        raise ValueError("this plan has no record of its original program (plan.graph is None and it was not loaded)")
    # only what the program computes: capture leaves dead nodes behind (the steps of a folded broadcast chain)
    live = sorted(graph.live())
    index = {old: new for new, old in enumerate(live)}
    nodes = [
        _Node(n.op, _op_name(n.op, n.attrs, graph), n.attrs, tuple(index[j] for j in n.inputs), n.shape, n.dtype)
        for n in (graph.nodes[i] for i in live)
    ]
    return _Program(nodes, tuple(index[i] for i in graph.outputs))


def _program(plan: Plan, which: str) -> _Program:
    if which not in ("plan", "original"):
        raise ValueError(f"which must be 'plan' or 'original', not {which!r}")
    return _plan_program(plan) if which == "plan" else _original_program(plan)


def _label(node: _Node) -> str:
    if node.op == "Var":
        return str(node.attrs[0])
    if node.op == "Op":
        return node.name  # an opaque call's attrs index the graph's opaque table: meaningless to readers
    return node.name + (f"[{','.join(map(str, node.attrs))}]" if node.attrs else "")


def _type(node: _Node) -> str:
    shape = "?" if node.shape is None else "x".join(map(str, node.shape)) or "scalar"
    return f"{shape} {node.dtype or ''}".strip()


# ---------------------------------------------------------------------------------------------------- compare


def _fmt_seconds(s: float) -> str:
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _summary(plan: Plan) -> dict[str, Any]:
    return {
        "target": plan.target,
        "nodes": len(plan.nodes),
        "rewritten nodes": sum(n.rewritten for n in plan.nodes),
        "original time": plan.original.seconds,
        "predicted time": plan.predicted.seconds,
        "speed-up": plan.predicted_speedup,
        "original flops": plan.original.flops,
        "predicted flops": plan.predicted.flops,
        "original bytes": plan.original.bytes,
        "predicted bytes": plan.predicted.bytes,
        "original kernels": plan.original.kernels,
        "predicted kernels": plan.predicted.kernels,
        "stop reason": plan.stop_reason,
        "iterations": int(plan.stats.get("iterations", 0)),
        "e-nodes": int(plan.stats.get("enodes", 0)),
        "rules fired": dict(sorted(plan.rules_fired.items())),
        "fallback": plan.fallback,
    }


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("time"):
        return _fmt_seconds(value)
    if key == "speed-up":
        return f"{value:.2f}x"
    if key.endswith(("flops", "bytes")):
        return f"{value:.3g}"
    if key == "rules fired":
        return ", ".join(f"{k} x{v}" for k, v in value.items()) or "-"
    return str(value)


def compare(*plans: Plan, labels: list[str] | None = None, console: Console | None = None) -> dict[str, dict[str, Any]]:
    """Print the plans side by side (a rich table) and return {label: {metric: value}} in the same order."""
    if not plans:
        raise ValueError("compare() needs at least one plan")
    if labels is None:
        targets = [p.target for p in plans]
        labels = [t if targets.count(t) == 1 else f"{t} #{i + 1}" for i, t in enumerate(targets)]
    if len(labels) != len(plans) or len(set(labels)) != len(labels):
        raise ValueError(f"need {len(plans)} distinct labels, got {labels}")
    data = {label: _summary(plan) for label, plan in zip(labels, plans, strict=True)}
    table = Table(title="eqsat plans")
    table.add_column("metric", style="bold")
    for label in labels:
        table.add_column(label, justify="right", overflow="fold")
    for key in data[labels[0]]:
        table.add_row(key, *(_fmt(key, data[label][key]) for label in labels))
    (console or Console()).print(table)
    return data


# ---------------------------------------------------------------------------------------------------- diff


def _terms(program: _Program, table: dict[tuple, int]) -> list[int]:
    """A structural id per node (op, attrs, type, input ids): equal ids are the same computation. Ids are interned
    in the shared table, so keys stay flat and hashing a deep DAG stays linear."""
    ids: list[int] = []
    for n in program.nodes:
        key = (n.name, n.attrs, n.shape, n.dtype, tuple(ids[i] for i in n.inputs))
        ids.append(table.setdefault(key, len(table)))
    return ids


def _expr(program: _Program, i: int, depth: int = 3) -> str:
    node = program.nodes[i]
    if not node.inputs:
        return _label(node)
    if depth == 0:
        return "…"
    return f"{_label(node)}({', '.join(_expr(program, j, depth - 1) for j in node.inputs)})"


def _unmatched(a: _Program, b: _Program) -> tuple[set[int], set[int]]:
    """The nodes of each program with no counterpart in the other: what a rewrite replaced and what it put there.

    A node has a counterpart if the other program computes the same term, or if it sits where the other program has
    the same op on the same type: found walking down from the outputs (which pair up in order), so that a consumer of
    a rewritten subgraph, whose term differs only through its input, is not counted as changed itself."""
    table: dict[tuple, int] = {}
    keys_a, keys_b = _terms(a, table), _terms(b, table)
    matched_a = {i for i, k in enumerate(keys_a) if k in set(keys_b)}
    matched_b = {i for i, k in enumerate(keys_b) if k in set(keys_a)}

    def same(i: int, j: int) -> bool:
        x, y = a.nodes[i], b.nodes[j]
        return (_label(x), _type(x), len(x.inputs)) == (_label(y), _type(y), len(y.inputs))

    pairs, seen = list(zip(a.outputs, b.outputs, strict=False)), set()
    while pairs:
        i, j = pairs.pop()
        if (i, j) in seen or not same(i, j):
            continue
        seen.add((i, j))
        matched_a.add(i)
        matched_b.add(j)
        inputs = list(zip(a.nodes[i].inputs, b.nodes[j].inputs, strict=True))
        swapped = [(p, q) for (p, _), (_, q) in zip(inputs, reversed(inputs), strict=True)]
        if len(inputs) == 2 and not all(same(*pq) for pq in inputs) and all(same(*pq) for pq in swapped):
            inputs = swapped  # commuted operands (add-comm, mul-comm)
        pairs.extend(inputs)
    return set(range(len(a.nodes))) - matched_a, set(range(len(b.nodes))) - matched_b


def _changed_subgraphs(program: _Program, changed: set[int]) -> list[str]:
    """The largest changed subgraphs of a program: changed nodes no other changed node consumes."""
    consumed = {j for i in changed for j in program.nodes[i].inputs}
    return [f"{_expr(program, i)}  : {_type(program.nodes[i])}" for i in sorted(changed - consumed)]


def _diff_programs(a: _Program, b: _Program, name_a: str, name_b: str) -> list[str]:
    count_a = Counter((_label(n), _type(n)) for n in a.nodes)
    count_b = Counter((_label(n), _type(n)) for n in b.nodes)
    lines = [
        f"{op} {typ}: {count_a[op, typ]} -> {count_b[op, typ]} ({count_b[op, typ] - count_a[op, typ]:+d})"
        for op, typ in sorted(set(count_a) | set(count_b))
        if count_a[op, typ] != count_b[op, typ]
    ]
    if lines:
        lines.insert(0, f"ops ({name_a} -> {name_b}):")
    for name, program, changed in zip((name_a, name_b), (a, b), _unmatched(a, b), strict=True):
        lines += [f"only in {name}: {s}" for s in _changed_subgraphs(program, changed)]
    if not lines:
        lines.append(f"same ops and subgraphs in {name_a} and {name_b}")
    for name, program in ((name_a, a), (name_b, b)):
        rewritten = Counter(f"{_label(n)} {_type(n)}" for n in program.nodes if n.rewritten)
        if rewritten:
            lines.append(f"rewritten in {name}: " + ", ".join(f"{k} x{v}" for k, v in sorted(rewritten.items())))
    return lines


def diff(a: Plan, b: Plan, names: tuple[str, str] = ("a", "b")) -> list[str]:
    """What changed from plan a to plan b: op counts by (op, type), subgraphs only in one, rewritten nodes."""
    head = [
        f"target {a.target} -> {b.target}",
        f"predicted time {_fmt_seconds(a.predicted.seconds)} -> {_fmt_seconds(b.predicted.seconds)}",
    ]
    return head + _diff_programs(_plan_program(a), _plan_program(b), *names)


def diff_original(plan: Plan) -> list[str]:
    """What extraction changed: the original program against the extracted plan."""
    return _diff_programs(_original_program(plan), _plan_program(plan), "original", "plan")


# ---------------------------------------------------------------------------------------------------- DOT

_REWRITTEN_FILL = "#ffb347"
_SOURCE_FILL = "#e8eef7"
_NODE_FILL = "#ffffff"


def _fill(node: _Node) -> str:
    return _REWRITTEN_FILL if node.rewritten else _SOURCE_FILL if not node.inputs else _NODE_FILL


def to_dot(plan: Plan, which: str = "plan") -> str:
    """Graphviz DOT of the plan or the original program; rewritten nodes filled orange, outputs drawn bold."""
    program = _program(plan, which)
    lines = [
        f'digraph "{which}" {{',
        "  rankdir=TB;",
        '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10];',
    ]
    for i, n in enumerate(program.nodes):
        label = f"{_label(n)}\\n{_type(n)}".replace('"', '\\"')
        bold = ", penwidth=2.5" if i in program.outputs else ""
        lines.append(f'  n{i} [label="{label}", fillcolor="{_fill(n)}"{bold}];')
    lines += [f"  n{j} -> n{i};" for i, n in enumerate(program.nodes) for j in n.inputs]
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- SVG

_CHAR_W, _BOX_H, _GAP_X, _GAP_Y, _PAD, _DUMMY_W, _NOTE_H = 7.2, 34, 18, 46, 12, 6, 24
_REPLACED_FILL = "#f4c2c2"  # an original node the plan does not keep
# Drawn whole up to this many nodes. A larger program is drawn as its changed region: a whole BERT (~900 nodes) lays
# out 30000 px wide and 40000 px tall, where neither the boxes nor the changes can be found.
MAX_DRAWN = 150


def _changed(plan: Plan, which: str, program: _Program) -> set[int]:
    """Nodes of this program without a counterpart in the other, and rewritten ones."""
    rewritten = {i for i, n in enumerate(program.nodes) if n.rewritten}
    if original_graph(plan) is None:
        return rewritten
    if which == "plan":
        return _unmatched(_original_program(plan), program)[1] | rewritten
    return _unmatched(program, _plan_program(plan))[0]


@dataclass
class _Focus:
    program: _Program  # the nodes drawn, inputs restricted to them
    ids: list[int]  # each one's index in the whole program
    changed: set[int]
    cut: set[int]  # nodes with inputs or consumers not drawn
    rank: list[int]  # layer of each: its depth in the whole program, gaps closed, so it reads in program order
    note: str


def _focus(program: _Program, changed: set[int], limit: int) -> _Focus:
    """The part of a large program worth drawing: each changed node in program order, with its inputs and consumers,
    while `limit` allows (around the outputs if nothing changed)."""
    consumers: list[list[int]] = [[] for _ in program.nodes]
    for i, n in enumerate(program.nodes):
        for j in n.inputs:
            consumers[j].append(i)
    keep: set[int] = set()
    seeds = sorted(changed) or range(len(program.nodes) - 1, -1, -1)
    shown = 0
    for i in seeds:
        region = {i, *program.nodes[i].inputs, *consumers[i]}
        if keep and len(keep | region) > limit:
            break
        keep |= region
        shown += 1
    order = sorted(keep)
    index = {old: new for new, old in enumerate(order)}
    nodes = [
        replace(program.nodes[i], inputs=tuple(index[j] for j in program.nodes[i].inputs if j in index)) for i in order
    ]
    cut = {index[i] for i in order if not keep.issuperset((*program.nodes[i].inputs, *consumers[i]))}
    what = f"{shown} of {len(changed)} changed nodes" if changed else "the nodes nearest the outputs (nothing changed)"
    note = (
        f"{len(order)} of {len(program.nodes)} nodes: {what}, with their inputs and consumers; "
        "dashed boxes connect to nodes not drawn (to_dot() draws all)"
    )
    sub = _Program(nodes, tuple(index[i] for i in program.outputs if i in index))
    depth = _depths(program)
    levels = {d: k for k, d in enumerate(sorted({depth[i] for i in order}))}
    rank = [levels[depth[i]] for i in order]
    return _Focus(sub, order, {index[i] for i in changed if i in index}, cut, rank, note)


@dataclass
class _Layout:
    x: list[float]  # left edge of every item: program nodes first, then the bends of long edges
    y: list[float]
    width: list[float]
    routes: list[list[int]]  # per edge: the items it passes through, from input to consumer
    size: tuple[float, float]


def _depths(program: _Program) -> list[int]:
    depth: list[int] = []
    for n in program.nodes:
        depth.append(1 + max((depth[i] for i in n.inputs), default=-1))
    return depth


def _layout(program: _Program, rank: list[int] | None = None) -> _Layout:
    """Layered drawing: a node sits one layer below its deepest input (or at `rank`), a source just above its first
    use.

    An edge spanning several layers gets a bend point in each layer it crosses (so it never runs under a box), and
    each layer is ordered by the mean position of its items' inputs to keep crossings few.
    """
    depth = list(rank) if rank is not None else _depths(program)
    # an input or constant sits just above its first consumer, not in one wide top row with long edges
    first_use: dict[int, int] = {}
    for n, d in zip(program.nodes, depth, strict=True):
        for j in n.inputs:
            first_use[j] = min(first_use.get(j, d), d)
    for i, n in enumerate(program.nodes):
        if not n.inputs and i in first_use:
            depth[i] = first_use[i] - 1
    width = [max(len(_label(n)), len(_type(n))) * _CHAR_W + 16 for n in program.nodes]
    preds: list[list[int]] = [[] for _ in program.nodes]
    routes: list[list[int]] = []
    for i, n in enumerate(program.nodes):
        for j in n.inputs:
            route = [j]
            for d in range(depth[j] + 1, depth[i]):
                depth.append(d)
                width.append(_DUMMY_W)
                preds.append([route[-1]])
                route.append(len(depth) - 1)
            preds[i].append(route[-1])
            routes.append([*route, i])
    layers: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    for item, d in enumerate(depth):
        layers[d].append(item)
    rank: dict[int, float] = {}
    for layer in layers:
        layer.sort(key=lambda k: sum(rank[p] for p in preds[k]) / len(preds[k]) if preds[k] else k)
        rank.update((k, r) for r, k in enumerate(layer))
    row_widths = [sum(width[k] for k in layer) + _GAP_X * (len(layer) - 1) for layer in layers]
    total_w = max(row_widths, default=0) + 2 * _PAD
    x, y = [0.0] * len(depth), [0.0] * len(depth)
    for d, (layer, row_w) in enumerate(zip(layers, row_widths, strict=True)):
        left = (total_w - row_w) / 2
        for k in layer:
            x[k], y[k] = left, _PAD + d * (_BOX_H + _GAP_Y)
            left += width[k] + _GAP_X
    total_h = len(layers) * (_BOX_H + _GAP_Y) - _GAP_Y + 2 * _PAD if layers else 2 * _PAD
    return _Layout(x, y, width, routes, (total_w, total_h))


def _edge_path(layout: _Layout, route: list[int]) -> str:
    """A smooth path from the bottom of the input through each bend to the top of the consumer."""
    center = [layout.x[k] + layout.width[k] / 2 for k in route]
    x0, y0 = center[0], layout.y[route[0]] + _BOX_H
    d = f"M{x0:.1f},{y0:.1f}"
    for k, cx in zip(route[1:], center[1:], strict=True):
        top, mid = layout.y[k], (y0 + layout.y[k]) / 2
        d += f" C{x0:.1f},{mid:.1f} {cx:.1f},{mid:.1f} {cx:.1f},{top:.1f}"
        if k != route[-1]:
            d += f" L{cx:.1f},{top + _BOX_H:.1f}"  # straight down through the bend's layer
        x0, y0 = cx, top + _BOX_H
    return d


def to_svg(plan: Plan, which: str = "plan", max_nodes: int = MAX_DRAWN) -> str:
    """The plan or the original program as a standalone SVG, laid out in Python (no graphviz needed).

    Original nodes the plan does not keep are filled red, rewritten plan nodes orange. A program of more than
    max_nodes nodes is drawn as its changed region with a note saying so (see _focus)."""
    program = _program(plan, which)
    changed = _changed(plan, which, program)
    ids, cut, note, rank = list(range(len(program.nodes))), set(), "", None
    if len(program.nodes) > max_nodes:
        focus = _focus(program, changed, max_nodes)
        program, ids, changed, cut, note, rank = (
            focus.program,
            focus.ids,
            focus.changed,
            focus.cut,
            focus.note,
            focus.rank,
        )
    layout = _layout(program, rank)
    top = _NOTE_H if note else 0
    total_w, total_h = max(layout.size[0], len(note) * _CHAR_W + 2 * _PAD), layout.size[1] + top
    marker = f"arrow-{which}"  # ids must differ between the two SVGs inlined in one page
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{total_w:.0f}" height="{total_h:.0f}" '
        f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" font-family="monospace" font-size="12">',
        f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
    ]
    if note:
        parts.append(f'<text x="{_PAD}" y="{_PAD + 4}" fill="#7a4b00" font-style="italic">{html.escape(note)}</text>')
    parts.append(f'<g transform="translate(0,{top})">')
    parts += [
        f'<path d="{_edge_path(layout, route)}" fill="none" stroke="#555" stroke-width="1.2" '
        f'marker-end="url(#{marker})"/>'
        for route in layout.routes
    ]
    for i, n in enumerate(program.nodes):
        x, y, w = layout.x[i], layout.y[i], layout.width[i]
        stroke = ' stroke="#1f3b73" stroke-width="2.5"' if i in program.outputs else ' stroke="#333" stroke-width="1"'
        stroke += ' stroke-dasharray="5 3"' if i in cut else ""
        replaced = which == "original" and i in changed
        fill = _REPLACED_FILL if replaced else _fill(n)
        tip = f"#{ids[i]} {_label(n)} {_type(n)}" + (
            " (rewritten)" if n.rewritten else " (not in the plan)" if replaced else ""
        )
        if n.cost is not None:
            tip += f"\n{_fmt_seconds(n.cost.seconds)}, {n.cost.flops:.3g} flops, {n.cost.bytes:.3g} bytes"
        cx = x + w / 2
        parts.append(
            f"<g><title>{html.escape(tip)}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_BOX_H}" rx="5" fill="{fill}"{stroke}/>'
            f'<text x="{cx:.1f}" y="{y + 14:.1f}" text-anchor="middle" font-weight="bold">'
            f"{html.escape(_label(n))}</text>"
            f'<text x="{cx:.1f}" y="{y + 28:.1f}" text-anchor="middle" fill="#444" font-size="11">'
            f"{html.escape(_type(n))}</text></g>"
        )
    parts.append("</g></svg>")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 20px 24px; color: #222; }
h1 { font-size: 21px; margin: 0 0 12px; } h2 { font-size: 16px; margin: 22px 0 8px; border-bottom: 1px solid #ddd; }
h3 { font-size: 14px; margin: 0 0 6px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 9px; text-align: right; }
th { background: #f0f2f5; } td.l, th.l { text-align: left; }
tr.rewritten td { background: #fff1dc; }
.panels { display: flex; gap: 28px; align-items: flex-start; flex-wrap: wrap; }
.graphs { display: flex; gap: 16px; align-items: flex-start; }
.graphs > div { flex: 1 1 50%; overflow: auto; border: 1px solid #ddd; padding: 8px; max-height: 80vh; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 8px; border: 1px solid #333; border-radius: 4px; }
pre { background: #f7f7f7; padding: 8px; font-size: 12px; margin: 0; }
.scroll { max-height: 230px; max-width: 640px; overflow: auto; }  /* a large model's lists stay above the graphs */
"""


def _table(
    header: list[str] | None, rows: list[list[Any]], *, left: int = 1, ident: str = "", classes: list[str] | None = None
) -> str:
    """An HTML table (escaped); the first `left` columns are left-aligned text."""

    def cell(tag: str, k: int, value: Any) -> str:
        cls = ' class="l"' if k < left else ""
        return f"<{tag}{cls}>{html.escape(str(value))}</{tag}>"

    head = "<tr>" + "".join(cell("th", k, h) for k, h in enumerate(header)) + "</tr>" if header else ""
    body = "".join(
        f'<tr class="{classes[r] if classes else ""}">' + "".join(cell("td", k, v) for k, v in enumerate(row)) + "</tr>"
        for r, row in enumerate(rows)
    )
    return f'<table id="{ident}">{head}{body}</table>' if ident else f"<table>{head}{body}</table>"


_AMOUNTS = ["predicted time", "flops", "bytes moved", "kernels"]


def _amounts(cost: Cost) -> list[Any]:
    """A cost as the _AMOUNTS columns."""
    return [_fmt_seconds(cost.seconds), f"{cost.flops:.3g}", f"{cost.bytes:.3g}", cost.kernels]


def _flags(*flags: bool) -> list[str]:
    return ["yes" if f else "" for f in flags]


def _scroll(content: str) -> str:
    return f'<div class="scroll">{content}</div>'


def _panel(title: str, content: str) -> str:
    return f"<div><h3>{html.escape(title)}</h3>{content}</div>"


def to_html(plan: Plan, path: str | Path) -> Path:
    """Write a self-contained HTML report (inline CSS and SVG, nothing fetched) and return its path."""
    program = _plan_program(plan)
    outputs = program.outputs
    graph = original_graph(plan)
    summary = _summary(plan)
    costs = [
        [name, *pair] for name, *pair in zip(_AMOUNTS, _amounts(plan.original), _amounts(plan.predicted), strict=True)
    ]
    costs.append(["speed-up", "", f"{plan.predicted_speedup:.2f}x"])
    saturation = [[k, _fmt(k, summary[k])] for k in ("target", "stop reason", "iterations", "e-nodes", "fallback")]
    saturation += [[k, f"{v * 1e3:.1f} ms"] for k, v in plan.stats.items() if k.endswith("_s")]
    rules = [[name, count] for name, count in sorted(plan.rules_fired.items(), key=lambda kv: (-kv[1], kv[0]))]
    per_node = [
        [i, _label(n), _type(n), ", ".join(map(str, n.inputs)), *_amounts(n.cost), *_flags(n.rewritten, i in outputs)]
        for i, n in enumerate(program.nodes)
        if n.cost is not None
    ]
    if graph is None:
        original_svg, changes = "<p>The original program was not recorded.</p>", ["not known"]
    else:
        original_svg, changes = to_svg(plan, "original"), diff_original(plan)
    body = [
        f"<h1>eqsat plan for target {html.escape(plan.target)}: {plan.predicted_speedup:.2f}x predicted"
        + (" (FALLBACK: the original runs)" if plan.fallback else "")
        + "</h1>",
        '<div class="panels">',
        _panel("Cost summary", _table(["", "original", "plan"], costs, ident="cost-summary")),
        _panel("Saturation", _table(None, saturation, left=2, ident="saturation")),
        _panel("Rules fired", _scroll(_table(["rule", "matches"], rules, ident="rules")) if rules else "<p>none</p>"),
        _panel("What changed", _scroll(f"<pre>{html.escape(chr(10).join(changes))}</pre>")),
        "</div>",
        "<h2>Programs</h2>",
        '<p class="legend"><span style="background:#ffb347">rewritten</span>'
        '<span style="background:#f4c2c2">not in the plan</span>'
        '<span style="background:#e8eef7">input / constant</span>'
        '<span style="border-width:2.5px;border-color:#1f3b73">output</span> hover a box for its cost</p>',
        '<div class="graphs">',
        _panel(f"original ({len(graph.live()) if graph is not None else '?'} nodes)", original_svg),
        _panel(f"plan ({len(plan.nodes)} nodes, {summary['rewritten nodes']} rewritten)", to_svg(plan, "plan")),
        "</div>",
        "<h2>Per-node cost</h2>",
        _table(
            ["#", "op", "type", "inputs", *_AMOUNTS, "rewritten", "output"],
            per_node,
            left=4,
            ident="per-node",
            classes=["rewritten" if row[-2] else "" for row in per_node],
        ),
    ]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>eqsat plan ({html.escape(plan.target)})</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
