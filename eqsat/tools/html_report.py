"""Plans drawn: a self-contained HTML report and Graphviz DOT.

The report lays out both programs in the browser with ELK (the Eclipse Layout Kernel, vendored under
eqsat/tools/assets/vendor and inlined, so the file opens offline), grouped into collapsible clusters by jax name stack,
the changed regions highlighted and listed region by region; pan by dragging, zoom with the wheel, hover a node for
its cost and source line.
"""

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from eqsat.census.census import Census
from eqsat.extract import provenance
from eqsat.extract.changes import Region, format_metric, plan_summary, program_difference, ranked_ops, regions
from eqsat.extract.cost import Cost
from eqsat.extract.plan import Plan
from eqsat.extract.views import (
    Program,
    ViewNode,
    label,
    node_seconds,
    original_graph,
    original_program,
    plan_program,
    program,
    seconds_text,
    type_text,
    unmatched,
)

# A program of more nodes is drawn with its clusters collapsed below the deepest level that keeps it this small;
# a click on a cluster opens it.
MAX_VISIBLE = 120

_REWRITTEN_FILL = "#ffb347"
_SOURCE_FILL = "#e8eef7"
_NODE_FILL = "#ffffff"


def _fill(node: ViewNode) -> str:
    return _REWRITTEN_FILL if node.rewritten else _SOURCE_FILL if not node.inputs else _NODE_FILL


def to_dot(plan: Plan, which: str = "plan") -> str:
    """Graphviz DOT of the plan or the original program; rewritten nodes filled orange, outputs drawn bold."""
    drawn = program(plan, which)
    lines = [
        f'digraph "{which}" {{',
        "  rankdir=TB;",
        '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10];',
    ]
    for i, n in enumerate(drawn.nodes):
        text = f"{label(n)}\\n{type_text(n)}".replace('"', '\\"')
        bold = ", penwidth=2.5" if i in drawn.outputs else ""
        lines.append(f'  n{i} [label="{text}", fillcolor="{_fill(n)}"{bold}];')
    lines += [f"  n{j} -> n{i};" for i, n in enumerate(drawn.nodes) for j in n.inputs]
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- graph data


def _clusters(drawn: Program) -> list[str]:
    """Each node's cluster: its name stack region; an input or constant (no scope) sits in the innermost cluster
    holding all its consumers."""
    consumers: list[list[int]] = [[] for _ in drawn.nodes]
    for i, n in enumerate(drawn.nodes):
        for j in n.inputs:
            consumers[j].append(i)
    cluster = [provenance.region(n.scopes) for n in drawn.nodes]
    for i in reversed(range(len(drawn.nodes))):  # consumers come later in program order
        if not drawn.nodes[i].scopes and consumers[i]:
            cluster[i] = provenance.region(cluster[c] for c in consumers[i])
    return cluster


def _depth(path: str) -> int:
    return path.count("/") + 1 if path else 0


def _collapse_depth(cluster: list[str]) -> int | None:
    """The deepest cluster level at which collapsing keeps at most MAX_VISIBLE items drawn (None: draw all)."""
    if len(cluster) <= MAX_VISIBLE:
        return None
    deepest = max(map(_depth, cluster), default=0)
    for depth in range(deepest, 0, -1):
        shallow = sum(_depth(c) < depth for c in cluster)
        closed = len({"/".join(c.split("/")[:depth]) for c in cluster if _depth(c) >= depth})
        if shallow + closed <= MAX_VISIBLE:
            return depth
    return 1 if deepest else None


def _region_lines(region: Region, shown: str) -> list[str]:
    """A region's change in short lines, for the box of the cluster `shown` that draws it."""
    inner = region.name[len(shown) + 1 :] if region.name.startswith(shown + "/") else shown.rsplit("/", 1)[-1]
    timing = f"{seconds_text(region.before_s)} -> {seconds_text(region.after_s)}{region.ratio_text}"
    lines = [f"{inner}: {timing}", f"  {_count(region.before)} -> {_count(region.after)}"]
    if region.rules:
        more = len(region.rules) - 2
        lines.append(f"  rule {', '.join(region.rules[:2])}" + (f" +{more}" if more > 0 else ""))
    return lines + [f"  {s}" for s in region.sources[:1]]


def _count(counts: Any, shown: int = 2) -> str:
    ranked = ranked_ops(counts)
    text = ", ".join(f"{n} {op}" for op, n in ranked[:shown]) or "nothing"
    return text + (", ..." if len(ranked) > shown else "")


def _tip(i: int, node: ViewNode, changed: bool, kind: str) -> str:
    lines = [f"#{i} {label(node)}  {type_text(node)}"]
    if node.op == "Var" and node.path:
        lines.append(f"input {node.attrs[0]}" + (", a parameter" if node.parameter else ""))
    if node.cost is not None:
        measured = "measured" if node.cost.measured else "predicted"
        lines.append(
            f"{seconds_text(node.cost.seconds)} {measured}, {node.cost.flops:.3g} flops, {node.cost.bytes:.3g} bytes"
        )
    elif node.seconds is not None:
        lines.append(f"{seconds_text(node.seconds)} predicted")
    lines += [f"scope {s}" for s in node.scopes] + [f"line {s}" for s in node.sources]
    if changed:
        lines.append("not in the other program" if kind == "original" else "rewritten / new")
    return "\n".join(lines)


def _pane(drawn: Program, changed: set[int], found: list[Region], kind: str) -> dict[str, Any]:
    """What report.js draws of one program: nodes, edges, clusters (with the regions each shows), and the clusters
    collapsed at first."""
    cluster = _clusters(drawn)
    depth = _collapse_depth(cluster)
    paths = {p for c in cluster for p in ("/".join(c.split("/")[: k + 1]) for k in range(_depth(c)))}
    info: dict[str, dict[str, Any]] = {p: {"changed": False, "summary": [], "regions": []} for p in paths}
    for i in changed:
        for k in range(_depth(cluster[i])):
            info["/".join(cluster[i].split("/")[: k + 1])]["changed"] = True
    for region in found:
        shown = "/".join(region.scope.split("/")[: depth or None])
        if shown in info:  # top-level regions have no cluster: the whole drawing is theirs
            info[shown]["regions"].append(region.name)
            info[shown]["summary"] += _region_lines(region, shown)
    nodes = []
    for i, n in enumerate(drawn.nodes):
        node_kind = ("replaced" if kind == "original" else "new") if i in changed else "input" if not n.inputs else ""
        nodes.append(
            {
                "label": label(n),
                "type": type_text(n),
                "cluster": cluster[i],
                "kind": node_kind,
                "output": i in drawn.outputs,
                "tip": _tip(i, n, i in changed, kind),
            }
        )
    return {
        "nodes": nodes,
        "edges": [[j, i] for i, n in enumerate(drawn.nodes) for j in n.inputs],
        "clusters": info,
        "collapsed": sorted(p for p in paths if depth is not None and _depth(p) == depth),
    }


# ---------------------------------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 16px 20px; color: #222; }
h1 { font-size: 20px; margin: 0 0 10px; } h2 { font-size: 16px; margin: 18px 0 8px; border-bottom: 1px solid #ddd; }
h3 { font-size: 14px; margin: 0 0 6px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f0f2f5; } td.l, th.l { text-align: left; }
tr.rewritten td { background: #fff1dc; }
tr[data-region] { cursor: pointer; } tr[data-region]:hover td { background: #eef4ff; }
.panels { display: flex; gap: 24px; align-items: flex-start; flex-wrap: wrap; }
.graphs { display: flex; gap: 12px; }
.graphs > div { flex: 1 1 50%; min-width: 0; }
.pane { height: calc(100vh - 130px); border: 1px solid #ccc; background: #fcfcfc; overflow: hidden; cursor: grab; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 8px; border: 1px solid #333; border-radius: 4px; }
.scroll { max-height: 240px; overflow: auto; }
svg.graph { font-family: monospace; font-size: 12px; user-select: none; } svg.graph text { white-space: pre; }
svg .edge { fill: none; stroke: #777; stroke-width: 1.1; }
svg .node rect { fill: #fff; stroke: #444; } svg .node.input rect { fill: #e8eef7; }
svg .node.new rect { fill: #ffb347; } svg .node.replaced rect { fill: #f4c2c2; }
svg .node.output rect { stroke: #1f3b73; stroke-width: 2.5; }
svg .cluster > rect { fill: #f3f5f9; fill-opacity: 0.6; stroke: #8a94a6; stroke-dasharray: 4 2; }
svg .cluster.changed > rect { stroke: #e07b00; stroke-width: 2; stroke-dasharray: none; }
svg .cluster .title { font-weight: bold; fill: #3a4660; cursor: pointer; }
svg .collapsed rect { fill: #eef1f6; stroke: #8a94a6; cursor: pointer; }
svg .collapsed.changed rect { fill: #fff1dc; stroke: #e07b00; stroke-width: 2; }
svg .collapsed text:first-of-type { font-weight: bold; }
.census { border: 1px solid #ccc; background: #fcfcfc; } .census svg { font-family: monospace; font-size: 12px; }
.census .measured { fill: #8a94a6; } .census .roofline { fill: #1f6fd1; } .census .chosen { fill: #ffb347; }
"""


def _table(
    header: list[str] | None, rows: list[list[Any]], *, left: int = 1, ident: str = "", attrs: list[str] | None = None
) -> str:
    """An HTML table (escaped); the first `left` columns are left-aligned text; attrs: each row's attributes."""

    def cell(tag: str, k: int, value: Any) -> str:
        cls = ' class="l"' if k < left else ""
        return f"<{tag}{cls}>{html.escape(str(value))}</{tag}>"

    head = "<tr>" + "".join(cell("th", k, h) for k, h in enumerate(header)) + "</tr>" if header else ""
    body = "".join(
        f"<tr {attrs[r] if attrs else ''}>" + "".join(cell("td", k, v) for k, v in enumerate(row)) + "</tr>"
        for r, row in enumerate(rows)
    )
    return f'<table id="{ident}">{head}{body}</table>' if ident else f"<table>{head}{body}</table>"


_AMOUNTS = ["predicted time", "flops", "bytes moved", "kernels"]


def _amounts(cost: Cost) -> list[Any]:
    return [seconds_text(cost.seconds), f"{cost.flops:.3g}", f"{cost.bytes:.3g}", cost.kernels]


def _panel(title: str, content: str) -> str:
    return f"<div><h3>{html.escape(title)}</h3>{content}</div>"


def _regions_table(found: list[Region]) -> str:
    if not found:
        return "<p>no region changed</p>"
    rows = [
        [
            r.name,
            _count(r.before),
            _count(r.after),
            ", ".join(r.rules) or "-",
            seconds_text(r.before_s),
            seconds_text(r.after_s),
            r.ratio_text.strip(" ()") or "-",
            ", ".join(r.sources[:3]),
        ]
        for r in found
    ]
    attrs = [f'data-region="{html.escape(r.name)}"' for r in found]
    header = ["region", "before", "after", "rules", "before", "after", "speed-up", "source lines"]
    return _table(header, rows, left=4, ident="regions", attrs=attrs)


def _plan_tables(plan: Plan) -> list[str]:
    summary = plan_summary(plan)
    costs = [[n, *pair] for n, *pair in zip(_AMOUNTS, _amounts(plan.original), _amounts(plan.predicted), strict=True)]
    costs.append(["speed-up", "", f"{plan.predicted_speedup:.2f}x"])
    shown = ("target", "stop reason", "iterations", "e-nodes", "fallback", "overflow watch")
    saturation = [[k, format_metric(k, summary[k])] for k in shown]
    saturation += [[k, f"{v * 1e3:.1f} ms"] for k, v in plan.stats.items() if k.endswith("_s")]
    rules = [[name, count] for name, count in sorted(plan.rules_fired.items(), key=lambda kv: (-kv[1], kv[0]))]
    fired = f'<div class="scroll">{_table(["rule", "matches"], rules, ident="rules")}</div>' if rules else "<p>none</p>"
    return [
        _panel("Cost summary", _table(["", "original", "plan"], costs, ident="cost-summary")),
        _panel("Saturation", _table(None, saturation, left=2, ident="saturation")),
        _panel("Rules fired", fired),
    ]


def _per_node(plan: Plan) -> str:
    drawn = plan_program(plan)
    rows = [
        [i, label(n), type_text(n), ", ".join(n.scopes), ", ".join(map(str, n.inputs)), *_amounts(n.cost)]
        for i, n in enumerate(drawn.nodes)
        if n.cost is not None
    ]
    attrs = ['class="rewritten"' if n.rewritten else "" for n in drawn.nodes if n.cost is not None]
    header = ["#", "op", "type", "scope", "inputs", *_AMOUNTS]
    return _table(header, rows, left=5, ident="per-node", attrs=attrs)


# the kernel classes the census chart draws, the most time first; the rest are summed in one row
CENSUS_ROWS = 24


def _census_section(found: Census) -> tuple[list[str], dict[str, Any]]:
    """The census (eqsat/census/census.py) as a chart report.js draws (time per kernel class, every occurrence: measured
    alone, its roofline, the chosen alternative's beside it) and a table of its summary lines."""
    ranked = sorted(found.kernels, key=lambda k: -(k.total_s or 0.0))
    rows = []
    for k in ranked[:CENSUS_ROWS]:
        chosen = None
        if k.chosen_count and k.chosen_s is not None and k.measured_s is not None:
            chosen = (k.count - k.chosen_count) * k.measured_s + k.chosen_count * k.chosen_s
        rows.append(
            {
                "label": f"{k.count} x {k.name} {k.detail}",
                "measured": k.total_s,
                "roofline": k.count * k.roofline_s,
                "chosen": chosen,
                "chosenName": k.chosen,
            }
        )
    rest = ranked[CENSUS_ROWS:]
    if rest:
        rows.append(
            {
                "label": f"{len(rest)} more kernel classes",
                "measured": sum(k.total_s or 0.0 for k in rest),
                "roofline": sum(k.count * k.roofline_s for k in rest),
                "chosen": None,
                "chosenName": "",
            }
        )
    body = [
        "<h2>Where the time goes: the kernel census</h2>",
        "<p>" + "<br>".join(html.escape(line.strip()) for line in found.summary()) + "</p>",
        '<p class="legend"><span style="background:#8a94a6">measured alone</span>'
        '<span style="background:#1f6fd1">roofline</span><span style="background:#ffb347">the plan\'s '
        "alternative</span>every occurrence of a kernel class added up; hover a bar for its figures</p>",
        '<div id="census" class="census"></div>',
    ]
    return body, {"rows": rows, "original": found.original_s, "plan": found.plan_s}


def to_html(
    plan: Plan,
    path: str | Path,
    versus: Plan | None = None,
    labels: tuple[str, str] = ("a", "b"),
    census: Census | None = None,
) -> Path:
    """Write a self-contained HTML report and return its path: the plan against its original program, or, with
    `versus`, the two plans (two targets, two rule sets) against each other, region by region. `census`: the
    program's kernel census (eqsat/census/census.py), drawn first as a chart."""
    first, second, names, title, found = _sides(plan, versus, labels)
    only_first, only_second = unmatched(first, second)
    only_second |= {i for i, n in enumerate(second.nodes) if n.rewritten and versus is None}
    data = {
        "pane-a": _pane(first, only_first, found, "original"),
        "pane-b": _pane(second, only_second, found, "plan"),
    }
    time_a = sum(node_seconds(n) for n in first.nodes)
    time_b = sum(node_seconds(n) for n in second.nodes)
    panes = [
        f"<div><h3>{html.escape(name)} ({len(p.nodes)} nodes, {seconds_text(t)} predicted) "
        f'<button data-fit="{pane}">fit</button></h3><div class="pane" id="{pane}"></div></div>'
        for name, p, t, pane in zip(names, (first, second), (time_a, time_b), ("pane-a", "pane-b"), strict=True)
    ]
    chart, census_data = _census_section(census) if census is not None else ([], None)
    body = [
        f"<h1>{html.escape(title)}" + (" (FALLBACK: the original runs)" if plan.fallback else "") + "</h1>",
        *chart,
        '<p class="legend"><span style="background:#ffb347">rewritten / new</span>'
        '<span style="background:#f4c2c2">replaced</span><span style="background:#e8eef7">input / constant</span>'
        '<span style="border-color:#e07b00;border-width:2px">changed cluster</span>'
        "drag to pan, wheel to zoom, click a cluster to open or close it, hover a node for its cost and line</p>",
        '<div class="graphs">',
        *panes,
        "</div>",
        f"<h2>What changed, by region ({html.escape(names[0])} -> {html.escape(names[1])}; click a row to zoom)</h2>",
        f'<div class="scroll">{_regions_table(found)}</div>',
        '<div class="panels">',
        *_plan_tables(plan),
        "</div>",
        "<h2>Per-node cost</h2>",
        _per_node(plan),
    ]
    path = Path(path)
    path.write_text(_page(title, body, data, census_data if chart else None), encoding="utf-8")
    return path


def _sides(
    plan: Plan, versus: Plan | None, labels: tuple[str, str]
) -> tuple[Program, Program, tuple[str, str], str, list[Region]]:
    """The two programs drawn (the original and the plan, or the two plans), their names, the page's title and the
    regions matched between them."""
    if versus is None:
        if original_graph(plan) is None:
            raise ValueError("this plan has no record of its original program to draw it against")
        first, second = original_program(plan), plan_program(plan)
        names, rules = ("original", "plan"), plan.rules_fired
        title = f"eqsat plan for target {plan.target}: {plan.predicted_speedup:.2f}x predicted"
        comparable = True
    else:
        first, second = plan_program(plan), plan_program(versus)
        names, rules = labels, versus.rules_fired
        title = f"eqsat plans {labels[0]} ({plan.target}) and {labels[1]} ({versus.target})"
        different = program_difference(plan, versus, labels)
        title += f", of different programs ({different})" if different else ""
        comparable = plan.target == versus.target and not different  # no speed-up between two programs
    return first, second, names, title, regions(first, second, rules, comparable)


def _page(title: str, body: list[str], graphs: dict[str, Any], census_data: Any) -> str:
    """The self-contained page: the body, the graphs' (and census's, where given) data and the scripts inlined."""
    assets = resources.files("eqsat.tools") / "assets"
    scripts = (assets / "vendor" / "elk.bundled.js").read_text() + "\n" + (assets / "report.js").read_text()
    census_json = _script_json(census_data) if census_data is not None else None
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + f'\n<script type="application/json" id="graph-data">{_script_json(graphs)}</script>\n'
        + (f'<script type="application/json" id="census-data">{census_json}</script>\n' if census_json else "")
        + f"<script>\n{scripts}\n</script>\n</body></html>\n"
    )


def _script_json(data: Any) -> str:
    return json.dumps(data).replace("</", "<\\/")  # never ends the script element early
