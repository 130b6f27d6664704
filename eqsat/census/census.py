"""The kernel census: where a program's time goes, kernel by kernel, measured against the roofline.

Every distinct kernel of the captured program (an op with its shapes, dtype and attributes; an opaque primitive
with its parameters; a chain of elementwise ops as XLA fuses it into one loop) is timed alone on this device
through the timing cache (extract/timing.py: a kernel measured before costs nothing; a new one is stored), within
a budget, and set against its roofline price (extract/cost.py), with the alternatives the rules put beside it and
the one the plan chose. The original program and the plan are timed end to end too, interleaved, so that each
kernel's share is a share of a time the user can check.

`python -m eqsat census` and `fast.census(*args)` take one; planning and calls never load this module.
How the program is cut into kernels, and each timed alone: eqsat/census/units.py.
"""

import dataclasses
import functools
import io
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from eqsat.capture.ir import Graph, Node
from eqsat.census.units import Unit, describe, kernel_rivals, measure_alone, unit_key, unit_roofline, units
from eqsat.egraph.rule_sources import RuleSource
from eqsat.extract import timing
from eqsat.extract.cost import Profile, load_profile, node_cost
from eqsat.extract.plan import Plan
from eqsat.extract.views import seconds_text
from eqsat.numerics.measure import interleaved
from eqsat.numerics.tolerance import comparable, mismatch
from eqsat.planning.planner import after_compiling, compiling_done
from eqsat.support import progress

FORMAT = "eqsat-census"
VERSION = 2  # 2: the plan's own kernels (plan_kernels); a version 1 file reads with none
# kernels alone adding up to more than this many times the program's time (or less than its inverse) are suspect
_AGREE = 1.5
# at least this many interleaved rounds end to end (more as fit in the census's seconds): a scale for the shares,
# not a decision (the guard's), so that a training step of 0.7 s a round is timed in 1.4 s
_END_TO_END_ROUNDS = 2
_AGREED = "the plan's results agree with the original's on these arguments (a census does not validate: calls do)"


@dataclass(frozen=True)
class Kernel:
    """One class of identical kernels of the program, and what the census found for it (times: one occurrence)."""

    key: str  # its timing-cache key
    kind: str  # "kernel" (an op of the table), "opaque" (a jax primitive eqsat does not model) or "fused"
    name: str
    detail: str  # input and output types, attributes
    count: int
    roofline_s: float
    measured_s: float | None  # alone on this device; None: not measured (over the budget, or it failed)
    alternatives: tuple[str, ...] = ()  # the other kernels its e-class holds
    chosen: str = ""  # the alternative the plan runs instead, where it does
    chosen_count: int = 0  # how many of the `count` occurrences run it
    chosen_s: float | None = None  # the alternative alone, measured
    scope: str = ""  # where the first occurrence sits in the program (jax's name stack)

    @property
    def total_s(self) -> float | None:
        return None if self.measured_s is None else self.count * self.measured_s

    @property
    def lost_s(self) -> float | None:
        """Time lost against the roofline over every occurrence."""
        return None if self.measured_s is None else self.count * (self.measured_s - self.roofline_s)

    @property
    def saved_s(self) -> float | None:
        """What running the chosen alternative saved over every occurrence it replaced, measured alone."""
        if not self.chosen_count or self.measured_s is None or self.chosen_s is None:
            return None
        return self.chosen_count * (self.measured_s - self.chosen_s)


@dataclass
class Census:
    """A program's kernels sorted by time lost against the roofline, and the program timed end to end."""

    name: str
    device: str
    target: str
    kernels: list[Kernel]
    plan_kernels: list[Kernel] = field(default_factory=list)  # the program eqsat runs, cut and timed the same way
    original_s: float | None = None  # the original program end to end (median of interleaved rounds)
    plan_s: float | None = None  # what eqsat runs, end to end
    rounds: int = 0
    cached: int = 0  # kernels the timing cache held already
    measured: int = 0  # kernels measured now (and stored)
    skipped: int = 0  # kernels left unmeasured: over the budget, or failed
    measure_s: float = 0.0
    took_s: float = 0.0  # the census's own time: planning (or loading the plan), measuring, timing end to end
    notes: list[str] = field(default_factory=list)

    def share(self, kernel: Kernel) -> float | None:
        """The kernel's time (every occurrence, alone) as a fraction of the original program's time."""
        total = kernel.total_s
        return None if total is None or not self.original_s else total / self.original_s

    @property
    def kernels_s(self) -> float:
        """The measured kernels' times added up: what the shares sum to, times the program's time."""
        return sum(k.total_s or 0.0 for k in self.kernels)

    @property
    def plan_kernels_s(self) -> float:
        """The plan's measured kernels added up: where the time goes after eqsat's rewrites."""
        return sum(k.total_s or 0.0 for k in self.plan_kernels)

    @property
    def opaque_s(self) -> float:
        """Time in primitives eqsat does not model (left untouched by every rewrite)."""
        return sum(k.total_s or 0.0 for k in self.kernels if k.kind == "opaque")

    def summary(self) -> list[str]:
        lines = [f"census of {self.name} on {self.device} (target {self.target}): {len(self.kernels)} kernel classes"]
        if self.original_s:
            plan = f", eqsat's plan {seconds_text(self.plan_s)}" if self.plan_s else ""
            ratio = f" ({self.original_s / self.plan_s:.2f}x)" if self.plan_s else ""
            lines.append(
                f"  end to end: original {seconds_text(self.original_s)}{plan}{ratio}, {self.rounds} interleaved rounds"
            )
            lines.append(
                f"  kernels alone add up to {seconds_text(self.kernels_s)}, {self.kernels_s / self.original_s:.0%} of "
                f"the original; opaque primitives (untouched by eqsat) {seconds_text(self.opaque_s)}, "
                f"{self.opaque_s / self.original_s:.0%}"
            )
            if self.plan_s and self.plan_kernels:
                lines.append(
                    f"  the plan's {len(self.plan_kernels)} kernel classes alone add up to "
                    f"{seconds_text(self.plan_kernels_s)}, {self.plan_kernels_s / self.plan_s:.0%} of the plan"
                )
            sums = [(self.kernels_s, self.original_s), (self.plan_kernels_s, self.plan_kernels and self.plan_s)]
            if any(whole and not 1 / _AGREE <= alone / whole <= _AGREE for alone, whole in sums):
                lines.append(
                    "  the kernels alone are far from the program's time: timings on a loaded machine (a small "
                    "kernel waits for the CPU), or XLA fusing across kernels or running independent ones at once"
                )
        lines.append(
            f"  timing cache: {self.cached} kernels held already, {self.measured} measured now in "
            f"{self.measure_s:.1f} s, {self.skipped} not measured; the census took {self.took_s:.1f} s"
        )
        return lines + [f"  {note}" for note in self.notes]

    def table(self, plan: bool = False) -> Any:
        """A rich Table of the original's kernels, or (`plan`) of the plan's, shares of the plan's time."""
        from rich.table import Table

        table = Table(title=None, show_lines=False, header_style="bold")
        headers = ("kernel", "count", "each", "share", "roofline", "lost")
        headers += () if plan else ("alternatives", "plan runs", "saved")
        for header in headers:
            table.add_column(header, justify="left" if header in ("kernel", "alternatives", "plan runs") else "right")
        whole = self.plan_s if plan else self.original_s
        for k in self.plan_kernels if plan else self.kernels:
            share = None if k.total_s is None or not whole else k.total_s / whole
            cells = [
                f"{k.name} {k.detail}",
                str(k.count),
                _seconds(k.measured_s),
                "-" if share is None else f"{share:.1%}",
                seconds_text(k.roofline_s),
                _seconds(k.lost_s),
            ]
            if not plan:
                cells += [
                    ", ".join(k.alternatives) or "-",
                    f"{k.chosen} x{k.chosen_count}" if k.chosen_count else "-",
                    _seconds(k.saved_s),
                ]
            table.add_row(*cells)
        return table

    def __rich__(self) -> Any:
        from rich.console import Group

        parts = ["\n".join(self.summary()), self.table()]
        if self.plan_kernels:
            parts += ["what eqsat runs, kernel by kernel (shares of the plan's time):", self.table(plan=True)]
        return Group(*parts)

    def __str__(self) -> str:
        from rich.console import Console

        out = io.StringIO()
        Console(file=out, width=200, force_terminal=False, color_system=None).print(self)
        return out.getvalue().rstrip("\n")

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **dataclasses.asdict(self)}

    def save(self, path: str | Path) -> Path:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return Path(path)


def echo(renderable: Any) -> None:
    """Print a census or table on stdout: as wide as a terminal, else 200 columns (a file keeps whole rows)."""
    from rich.console import Console

    Console(width=None if sys.stdout.isatty() else 200).print(renderable)


def census_from_dict(data: dict[str, Any]) -> Census:
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") not in range(1, VERSION + 1):
        raise ValueError(f"not an eqsat census of version {VERSION} or older")
    fields = {k: v for k, v in data.items() if k not in ("format", "version")}
    rows = {name: fields.pop(name, []) for name in ("kernels", "plan_kernels")}
    kernels = {name: [Kernel(**{**k, "alternatives": tuple(k["alternatives"])}) for k in r] for name, r in rows.items()}
    return Census(**fields, **kernels)


def load_census(path: str | Path) -> Census:
    return census_from_dict(json.loads(Path(path).read_text()))


def is_census(path: str | Path) -> bool:
    """Whether the file is a saved census (not a plan): `compare` takes both."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def side_by_side(a: Census, b: Census, labels: tuple[str, str] = ("a", "b")) -> Any:
    """Two censuses of one program (two targets, rule sets or machines) as one rich table, kernel class by kernel
    class in the first one's order: each one's time alone and what its plan ran instead."""
    from rich.console import Group
    from rich.table import Table

    table = Table(header_style="bold")
    table.add_column("kernel")
    table.add_column("count", justify="right")
    for label in labels:
        table.add_column(f"{label}: each", justify="right")
        table.add_column(f"{label}: plan runs")
        table.add_column(f"{label}: saved", justify="right")
    first, second = {k.key: k for k in a.kernels}, {k.key: k for k in b.kernels}
    for key in dict.fromkeys([*first, *second]):
        pair = (first.get(key), second.get(key))
        shown = first.get(key) or second[key]
        cells = [f"{shown.name} {shown.detail}", str(shown.count)]
        for k in pair:
            if k is None:
                cells += ["absent", "", ""]
            else:
                cells += [_seconds(k.measured_s), f"{k.chosen} x{k.chosen_count}" if k.chosen_count else "-",
                          _seconds(k.saved_s)]  # fmt: skip
        table.add_row(*cells)
    heads = [f"{label}: " + "\n  ".join(c.summary()) for label, c in zip(labels, (a, b), strict=True)]
    return Group(*heads, table)


def _seconds(s: float | None) -> str:
    return "-" if s is None else seconds_text(s)


# ---------------------------------------------------------------------------------------------------- the census


def take(
    plan: Plan,
    rules: Sequence[RuleSource],
    measure_seconds: float,
    programs: tuple[Callable[[], Any], Callable[[], Any]] | None = None,
    seconds: float = 1.0,
    name: str = "",
) -> Census:
    """The census of the plan's original program and of the plan: their kernels timed alone (new ones within
    `measure_seconds` of measuring), and, where `programs` (the original and the plan's, bound to arguments) are
    given, both timed end to end, interleaved, for `seconds` (0: not timed, nor compiled), their results
    compared once."""
    graph = plan.graph
    if graph is None:  # eqsat could not hold the program (the plan says why), or the plan was loaded from a file
        raise ValueError(
            f"no census: the plan holds no program to time ({plan.fallback or 'a plan loaded from a file'})"
        )
    profile = load_profile(plan.target)  # bare: roofline prices, no measured times attached
    device = profile.timing_device or timing.local_device()
    cache = timing.cache_for(device)
    here = device == timing.local_device()
    before, after = _Classes.of(graph, profile), _Classes.of(plan.program(), profile)
    progress.begin("census", f"census: the alternatives of {len(before.first)} kernel classes")
    rivals = kernel_rivals(graph, before.first, rules)
    # what to time: the kernels with alternatives first (and the alternatives), then by predicted time in all, then
    # the plan's own kernels
    order = sorted(before.first, key=lambda k: (not rivals.get(k), -before.counts[k] * before.roofline[k]))
    wanted = [w for key in order for w in (_wanted(graph, key, before.first[key]), *rivals.get(key, []))]
    wanted += [_wanted(after.graph, key, unit) for key, unit in after.first.items()]
    first = _first_calls(programs) if programs is not None and seconds > 0 else None  # compiled before timing
    compiling_done()  # the plan's original, compiled in the background for validation, is not timed beside them
    start = time.perf_counter()
    timer = functools.partial(_time, after.units() | before.units())
    counted = timing.measure(cache, wanted, measure_seconds if here else 0.0, timer=timer)
    measure_s = time.perf_counter() - start
    with cache.lock:
        entries = dict(cache.entries)
    too_fast = timing.too_fast_s() if None in entries.values() else math.inf
    ran = {key: n for key, n in after.counts.items() if after.first[key].kind == "kernel"}
    kernels = before.rows(rivals, ran, entries, too_fast, profile)
    plan_kernels = after.rows({}, {}, entries, too_fast, profile)
    census = Census(
        name=name,
        device=device,
        target=plan.target,
        kernels=kernels,
        plan_kernels=plan_kernels,
        cached=int(counted["hits"]),
        measured=int(counted["measured"]),
        skipped=sum(k.measured_s is None for k in (*kernels, *plan_kernels)),
        measure_s=measure_s,
    )
    _notes(census, plan, here)
    if first is not None:
        progress.begin("census", f"census: the original and the plan end to end ({seconds:g} s)")
        problem = mismatch(*(comparable(results) for results in first))
        census.notes.append(f"the plan's results differ from the original's: {problem}" if problem else _AGREED)
        result = interleaved(*programs, (), seconds=seconds, min_rounds=_END_TO_END_ROUNDS, warm=True)
        census.original_s, census.plan_s, census.rounds = result.baseline_s, result.candidate_s, result.rounds
    return census


def _first_calls(programs: tuple[Callable[[], Any], Callable[[], Any]]) -> tuple[list[Any], list[Any]]:
    """Both programs' first calls (untimed: a first run is slower), their results: the original's on the thread
    that compiles it for validation, where it finds it compiled, while this one compiles and runs the plan."""
    original, plan = programs
    expected = after_compiling(lambda: jax.tree.leaves(jax.block_until_ready(original())))
    got = jax.tree.leaves(jax.block_until_ready(plan()))
    return expected.result(), got


@dataclass(frozen=True)
class _Classes:
    """A program's kernel classes: each one's first occurrence, how often it occurs, its roofline price (once)."""

    graph: Graph
    first: dict[str, Unit]
    counts: dict[str, int]
    roofline: dict[str, float]

    @classmethod
    def of(cls, graph: Graph, profile: Profile) -> "_Classes":
        first, counts = _classes(graph)
        return cls(graph, first, counts, {key: unit_roofline(graph, unit, profile) for key, unit in first.items()})

    def units(self) -> dict[str, tuple[Graph, Unit]]:
        return {key: (self.graph, unit) for key, unit in self.first.items()}

    def rows(
        self,
        rivals: dict[str, list[timing.Wanted]],
        ran: dict[str, int],
        entries: dict[str, float | None],
        too_fast: float,
        profile: Profile,
    ) -> list[Kernel]:
        """The census's rows, the most time lost against the roofline first."""
        rows = [
            _kernel(self.graph, key, self.counts[key], self.roofline[key], rivals.get(key, []), ran, entries,
                    too_fast, profile, unit)
            for key, unit in self.first.items()
        ]  # fmt: skip
        return sorted(rows, key=lambda k: (k.lost_s is None, -(k.lost_s or 0.0), -k.count * k.roofline_s))


def _time(units: dict[str, tuple[Graph, Unit]], wanted: timing.Wanted) -> float | None:
    """A kernel class timed alone: an op of the table as the timing cache times it; an opaque primitive or a fused
    group compiled as a program of its own (from the original's graph or the plan's)."""
    graph, unit = units.get(wanted.key, (None, None))
    if graph is None or unit is None or unit.kind == "kernel":
        return timing.measure_one(wanted)
    return measure_alone(graph, unit)


def _classes(graph: Graph) -> tuple[dict[str, Unit], dict[str, int]]:
    """Each kernel class's first occurrence, and how often the class occurs, by key."""
    first: dict[str, Unit] = {}
    counts: dict[str, int] = {}
    for unit in units(graph):
        key = unit_key(graph, unit)
        first.setdefault(key, unit)
        counts[key] = counts.get(key, 0) + 1
    return first, counts


def _notes(census: Census, plan: Plan, here: bool) -> None:
    if not here:
        census.notes.append(f"the target's device {census.device} is not {timing.local_device()}: nothing measured")
    if plan.fallback:
        census.notes.append(f"eqsat runs the original: {plan.fallback}")


def _wanted(graph: Graph, key: str, unit: Unit) -> timing.Wanted:
    """A kernel class to time: its first occurrence's op (or the census's own unit of a non-kernel), as inputs."""
    node = graph.nodes[unit.nodes[0]]
    dtypes = tuple(graph.nodes[j].dtype for j in unit.inputs)
    shapes = tuple(graph.nodes[j].shape for j in unit.inputs)
    op = node.op if unit.kind == "kernel" else f"census:{unit.kind}"
    return timing.Wanted(key, op, node.attrs, shapes, node.dtype, dtypes)


def _seconds_of(entries: dict[str, float | None], key: str, roof: float, too_fast: float) -> float | None:
    """A kernel's measured seconds (too fast to measure: its roofline price, at most `too_fast`: an opaque gather of
    a few rows from a large table is priced as reading all of it); None where it was not measured."""
    if key not in entries:
        return None
    return min(roof, too_fast) if entries[key] is None else entries[key]


def _kernel(
    graph: Graph,
    key: str,
    count: int,
    roof: float,
    alternatives: list[timing.Wanted],
    ran: dict[str, int],
    entries: dict[str, float | None],
    too_fast: float,
    profile: Profile,
    unit: Unit,
) -> Kernel:
    """One row of the census: a kernel class, its times, and the alternative the plan runs in its place."""
    kind_name, detail = describe(graph, unit)
    chosen = max(alternatives, key=lambda w: ran.get(w.key, 0), default=None)
    chosen_count = ran.get(chosen.key, 0) if chosen is not None else 0
    chosen_s = None
    if chosen is not None and chosen_count:
        roof_chosen = _wanted_roofline(chosen, graph.nodes[unit.nodes[0]], profile)
        chosen_s = _seconds_of(entries, chosen.key, roof_chosen, too_fast)
    where = graph.where.get(unit.nodes[0])
    return Kernel(
        key=key,
        kind=unit.kind,
        name=kind_name,
        detail=detail,
        count=count,
        roofline_s=roof,
        measured_s=_seconds_of(entries, key, roof, too_fast),
        alternatives=tuple(dict.fromkeys(w.op for w in alternatives)),
        chosen=chosen.op if chosen_count and chosen is not None else "",
        chosen_count=min(chosen_count, count),
        chosen_s=chosen_s,
        scope=where.scope if where else "",
    )


def _wanted_roofline(wanted: timing.Wanted, node: Node, profile: Profile) -> float:
    return node_cost(wanted.op, list(wanted.in_shapes), node.shape, wanted.dtype, profile, wanted.attrs).seconds


def census_of(
    optimized: Any,
    args: tuple,
    programs_of: Callable[[tuple], tuple[Callable[[], Any], Callable[[], Any]]],
    measure_seconds: float | None = None,
    seconds: float = 1.0,
) -> Census:
    """The census of an optimized function (eqsat.optimize's result) at these arguments: its plan (built now if
    need be), every kernel timed alone, and the original and the plan's program (`programs_of(args)`: the captured
    program as jax.jit runs it and the plan's, on args) timed end to end."""
    start = time.perf_counter()
    options = optimized.options
    plan = optimized.plan(*args, prepared=False)  # the plan a call runs (its guard may keep the original)
    measure_seconds = options.limits.measure_seconds if measure_seconds is None else measure_seconds
    name = getattr(optimized.fun, "__name__", "")
    census = take(plan, options.rule_sources, measure_seconds, programs_of(args), seconds, name)
    census.took_s = time.perf_counter() - start
    return census
