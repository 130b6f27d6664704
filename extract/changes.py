"""What a plan changed, in the user's terms: plans side by side, and diffs by named region of the program (its jax
name stacks), each with the ops it had and has, the rules that build the new ones and the predicted speed-up."""

import functools
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from eqsat.egraph import rule_sources
from eqsat.extract import provenance
from eqsat.extract.views import (
    Program,
    label,
    node_seconds,
    original_graph,
    original_program,
    plan_program,
    seconds_text,
    type_text,
    unmatched,
)
from eqsat.ops.table import OPS, VAR

if TYPE_CHECKING:  # plans are read here, never built: extract.plan imports this module for its summary
    from eqsat.extract.plan import Plan

TOP_LEVEL = "(top level)"


@dataclass
class Region:
    """The changed nodes of one named region: those only in the first program and those only in the second."""

    name: str  # the name stack the nodes share (attention, or attention/{q,k,v}), TOP_LEVEL outside any
    scope: str = ""  # the innermost name stack holding them all ("" at the top level)
    before: Counter[str] = field(default_factory=Counter)  # op -> count, only in the first program
    after: Counter[str] = field(default_factory=Counter)
    before_s: float = 0.0  # predicted time of those nodes (parameter-only work, done once when prepared, is free)
    after_s: float = 0.0
    sources: list[str] = field(default_factory=list)  # the source lines they came from, contractions' first
    rules: list[str] = field(default_factory=list)  # fired rules that build every op new here
    comparable: bool = True  # both times priced for one target (a cpu plan's and an h100 plan's are not)

    @property
    def speedup(self) -> float:
        return self.before_s / self.after_s if self.after_s else float("inf") if self.before_s else 1.0

    @property
    def ratio_text(self) -> str:
        """' (1.31x)', or nothing where the two times are not comparable or one is zero."""
        return f" ({self.speedup:.2f}x)" if self.comparable and self.before_s and self.after_s else ""

    def line(self) -> str:
        """e.g. 'encoder/layer_3/attention: 3 Dot -> 1 Dot, 1 Concat, 3 Slice (rule shared-input-merge), 1.31x'"""
        text = f"{self.name}: {_ops(self.before)} -> {_ops(self.after)}"
        if self.rules:
            text += f" (rule{'s' if len(self.rules) > 1 else ''} {', '.join(self.rules)})"
        text += f", {seconds_text(self.before_s)} -> {seconds_text(self.after_s)} predicted{self.ratio_text}"
        if self.sources:
            text += f"; from {', '.join(self.sources[:3])}" + (" ..." if len(self.sources) > 3 else "")
        return text


_CONTRACTIONS = frozenset(op for op, spec in OPS.items() if spec.contracted is not None)


def ranked_ops(counts: Counter[str]) -> list[tuple[str, int]]:
    """Contractions (what a change is about: 3 Dot -> 1 Dense) first, then by count."""
    return sorted(counts.items(), key=lambda kv: (kv[0] not in _CONTRACTIONS, -kv[1], kv[0]))


def _ops(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {op}" for op, n in ranked_ops(counts)) or "nothing"


def regions(a: Program, b: Program, rules_fired: dict[str, int] | None = None, comparable: bool = True) -> list[Region]:
    """The regions where program b differs from program a, in program order (b's nodes first).

    A region is a group of changed nodes of both programs joined by the name stacks they come from: a node of
    several (a merged GEMM) joins theirs, so a merged Q/K/V GEMM, its slices and the three GEMMs it replaced are
    one region, named by the scopes they came from: encoder/layer_3/attention/{q,k,v}. Nodes of no scope are
    one region, TOP_LEVEL."""
    only_a, only_b = unmatched(a, b)
    items = [(p, i) for p, only in ((b, only_b), (a, only_a)) for i in sorted(only) if p.nodes[i].op != VAR]
    group = list(range(len(items)))

    def find(k: int) -> int:
        while group[k] != k:
            group[k] = group[group[k]]
            k = group[k]
        return k

    first_with: dict[str, int] = {}
    for k, (p, i) in enumerate(items):
        for scope in p.nodes[i].scopes or ("",):
            group[find(k)] = find(first_with.setdefault(scope, k))
    members: dict[int, list[int]] = {}
    for k in range(len(items)):
        members.setdefault(find(k), []).append(k)
    builders = _rules_building()
    found = []
    for ks in members.values():
        region = Region("", comparable=comparable)
        scopes: dict[str, None] = {}
        contractions_first = sorted(ks, key=lambda k: items[k][0].nodes[items[k][1]].name not in _CONTRACTIONS)
        for k in contractions_first:  # so that the region's first source line is its GEMM's
            p, i = items[k]
            node, side = p.nodes[i], "after" if p is b else "before"
            getattr(region, side)[node.name] += 1
            setattr(region, f"{side}_s", getattr(region, f"{side}_s") + node_seconds(node))
            region.sources.extend(s for s in node.sources if s not in region.sources)
            scopes.update(dict.fromkeys(node.scopes))
        region.scope, region.name = _region_name(list(scopes))
        new_ops = set(region.after) - set(region.before)
        building = [r for r in rules_fired or {} if builders.get(r) and builders[r] <= new_ops]
        region.rules = sorted(building, key=lambda r: (-len(builders[r]), r))  # who builds most of it first
        found.append(region)
    return found


def _region_name(scopes: list[str]) -> tuple[str, str]:
    """The scope holding all of these, and the region's name: that scope, or, where the scopes are several of its
    children, the scope with them in braces (attention/{q,k,v})."""
    common = provenance.region(scopes)
    if not common:
        return "", TOP_LEVEL
    depth = common.count("/") + 1
    children = dict.fromkeys(s.split("/")[depth] for s in scopes if s.count("/") >= depth)
    if common in scopes or len(children) < 2:
        return common, common
    return common, f"{common}/{{{','.join(children)}}}"


@functools.cache
def _rules_building() -> dict[str, frozenset[str]]:
    """Each built-in rule's name -> the ops its right-hand side builds that its left-hand side does not match."""
    built: dict[str, frozenset[str]] = {}
    for src in rule_sources.builtin_groups().values():
        for rule in rule_sources.rules_in(src):
            form = _parse(src.text.encode()[rule.start : rule.stop].decode())
            if len(form) < 3:
                continue
            lhs, rhs = _op_heads(form[1]), _op_heads(form[2])
            if len(rule.names) == 2:  # a birewrite: one name per direction
                built[rule.names[0]], built[rule.names[1]] = frozenset(rhs - lhs), frozenset(lhs - rhs)
            else:
                built[rule.names[0]] = frozenset(rhs - lhs)
    return built


_TOKEN = re.compile(r'\(|\)|"(?:[^"\\]|\\.)*"|[^\s()]+')


def _parse(text: str) -> list[Any]:
    """An s-expression as nested lists of tokens (the first form of text)."""
    stack: list[list[Any]] = [[]]
    for token in _TOKEN.findall(re.sub(r";[^\n]*", "", text)):
        if token == "(":
            stack.append([])
        elif token == ")" and len(stack) > 1:
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    return stack[0][0] if stack[0] and isinstance(stack[0][0], list) else []


def _op_heads(form: Any) -> set[str]:
    if not isinstance(form, list):
        return set()
    heads = {form[0]} & OPS.keys() if form and isinstance(form[0], str) else set()
    return heads.union(*(_op_heads(f) for f in form))


def program_difference(a: "Plan", b: "Plan", names: tuple[str, str] = ("the first", "the second")) -> str | None:
    """How two plans' original programs differ (an input, or ops with no counterpart), or None where they are
    plans of one program or either keeps no record of its original. Two plans of different programs differ
    everywhere: their regions compare the programs, not two plans of one."""
    if original_graph(a) is None or original_graph(b) is None:
        return None
    first, second = original_program(a), original_program(b)
    inputs = [{label(n): type_text(n) for n in p.nodes if n.op == VAR} for p in (first, second)]
    for name in sorted(inputs[0].keys() | inputs[1].keys()):
        types = [found.get(name) for found in inputs]
        if None in types:
            return f"input {name} only in {names[types.index(None) - 1]}"
        if types[0] != types[1]:
            return f"input {name} is {types[0]} in {names[0]} and {types[1]} in {names[1]}"
    only_first, only_second = unmatched(first, second)
    if only_first or only_second:
        return (
            f"{len(only_first)} of {names[0]}'s {len(first.nodes)} ops and {len(only_second)} of {names[1]}'s "
            f"{len(second.nodes)} have no counterpart in the other"
        )
    return None


def diff_regions(plan: "Plan") -> list[Region]:
    """The regions extraction changed: the original program against the plan."""
    return regions(original_program(plan), plan_program(plan), plan.rules_fired)


# ---------------------------------------------------------------------------------------------------- diff


def _expr(program: Program, i: int, depth: int = 3) -> str:
    node = program.nodes[i]
    if not node.inputs:
        return label(node)
    if depth == 0:
        return "…"
    return f"{label(node)}({', '.join(_expr(program, j, depth - 1) for j in node.inputs)})"


def _changed_subgraphs(program: Program, changed: set[int]) -> list[str]:
    """The largest changed subgraphs of a program: changed nodes no other changed node consumes."""
    consumed = {j for i in changed for j in program.nodes[i].inputs}
    return [f"{_expr(program, i)}  : {type_text(program.nodes[i])}" for i in sorted(changed - consumed)]


def _diff_programs(
    a: Program, b: Program, name_a: str, name_b: str, rules_fired: dict[str, int], comparable: bool = True
) -> list[str]:
    changed = regions(a, b, rules_fired, comparable)
    lines = [f"regions ({name_a} -> {name_b}):", *(f"  {r.line()}" for r in changed)] if changed else []
    count_a = Counter((label(n), type_text(n)) for n in a.nodes)
    count_b = Counter((label(n), type_text(n)) for n in b.nodes)
    counts = [
        f"{op} {typ}: {count_a[op, typ]} -> {count_b[op, typ]} ({count_b[op, typ] - count_a[op, typ]:+d})"
        for op, typ in sorted(set(count_a) | set(count_b))
        if count_a[op, typ] != count_b[op, typ]
    ]
    if counts:
        lines += [f"ops ({name_a} -> {name_b}):", *counts]
    for name, program, only in zip((name_a, name_b), (a, b), unmatched(a, b), strict=True):
        lines += [f"only in {name}: {s}" for s in _changed_subgraphs(program, only)]
    if not lines:
        lines.append(f"same ops and subgraphs in {name_a} and {name_b}")
    for name, program in ((name_a, a), (name_b, b)):
        rewritten = Counter(f"{label(n)} {type_text(n)}" for n in program.nodes if n.rewritten)
        if rewritten:
            lines.append(f"rewritten in {name}: " + ", ".join(f"{k} x{v}" for k, v in sorted(rewritten.items())))
    return lines


def diff(a: "Plan", b: "Plan", names: tuple[str, str] = ("a", "b")) -> list[str]:
    """What changed from plan a to plan b: by named region, op counts by (op, type), subgraphs only in one,
    rewritten nodes."""
    head = [
        f"target {a.target} -> {b.target}",
        f"predicted time {seconds_text(a.predicted.seconds)} -> {seconds_text(b.predicted.seconds)}",
    ]
    different = program_difference(a, b, names)
    if different:
        head.append(f"plans of different programs ({different})")
    comparable = a.target == b.target and not different
    return head + _diff_programs(plan_program(a), plan_program(b), *names, b.rules_fired, comparable)


def diff_original(plan: "Plan") -> list[str]:
    """What extraction changed: the original program against the extracted plan."""
    return _diff_programs(original_program(plan), plan_program(plan), "original", "plan", plan.rules_fired)


# ---------------------------------------------------------------------------------------------------- compare


def plan_summary(plan: "Plan") -> dict[str, Any]:
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
        "changed regions": [r.name for r in diff_regions(plan)] if original_graph(plan) is not None else None,
        "fallback": plan.fallback,
        "overflow watch": ", ".join(plan.overflow_watch) or None,  # the @real rules it is watched for
    }


def format_metric(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("time"):
        return seconds_text(value)
    if key == "speed-up":
        return f"{value:.2f}x"
    if key.endswith(("flops", "bytes")):
        return f"{value:.3g}"
    if key == "rules fired":
        return ", ".join(f"{k} x{v}" for k, v in value.items()) or "-"
    if key == "changed regions":
        return str(len(value))
    return str(value)


def compare(
    *plans: "Plan", labels: list[str] | None = None, console: Console | None = None
) -> dict[str, dict[str, Any]]:
    """Print the plans side by side (a rich table), then the regions where each plan differs from the first, and
    return {label: {metric: value}} in the same order ("regions vs first": the differing regions' lines;
    "different program": how its original program differs from the first's, None where it is the same)."""
    if not plans:
        raise ValueError("compare() needs at least one plan")
    if labels is None:
        targets = [p.target for p in plans]
        labels = [t if targets.count(t) == 1 else f"{t} #{i + 1}" for i, t in enumerate(targets)]
    if len(labels) != len(plans) or len(set(labels)) != len(labels):
        raise ValueError(f"need {len(plans)} distinct labels, got {labels}")
    data = {label: plan_summary(plan) for label, plan in zip(labels, plans, strict=True)}
    table = Table(title="eqsat plans")
    table.add_column("metric", style="bold")
    for name in labels:
        table.add_column(name, justify="right", overflow="fold")
    for key in data[labels[0]]:
        table.add_row(key, *(format_metric(key, data[name][key]) for name in labels))
    console = console or Console()
    console.print(table)
    first = plan_program(plans[0])
    for name, plan in zip(labels[1:], plans[1:], strict=True):
        different = program_difference(plans[0], plan, (labels[0], name))
        comparable = plans[0].target == plan.target and not different  # no speed-up between two programs
        differ = regions(first, plan_program(plan), plan.rules_fired, comparable)
        data[name]["regions vs first"] = [r.line() for r in differ]
        data[name]["different program"] = different
        if different:
            note = f"{labels[0]} and {name} are plans of different programs ({different}): the regions compare them"
            console.print(note, highlight=False, markup=False, soft_wrap=True)
        heading = f"regions that differ, {labels[0]} -> {name}: {len(differ) or 'none'}"
        console.print(heading, highlight=False, markup=False, soft_wrap=True)
        for region in differ:
            console.print(f"  {region.line()}", highlight=False, markup=False, soft_wrap=True)
    return data
