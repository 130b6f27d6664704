"""Memory planning of a lowered plan: liveness, offset planning, a memory-aware order, XLA's own figures, budgets.

Our figures (liveness, lower_bound, best_fit, memory_schedule) model the plan as lowered, one buffer per node
(memory_report: none for the values the target keeps inside fusions, backends/fusion.py, and with its layout
copies); XLA fuses and reschedules, so its figure (xla_figure) is the one a budget is checked against.
"""

import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from eqsat.backends.fusion import fused_values
from eqsat.backends.lower import lower
from eqsat.extract.cost import Profile, class_of, load_profile, value_bytes
from eqsat.numerics.tolerance import mismatch
from eqsat.ops.table import GET, VAR
from eqsat.support.graph_walk import postorder

if TYPE_CHECKING:  # at runtime only duck-typed, so that extract.plan may import this module
    from eqsat.extract.plan import Plan

MEMORY_OPTIMIZED = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


@dataclass(frozen=True)
class Interval:
    """One value of the schedule: `size` bytes live over steps start..end inclusive."""

    node: int
    size: int
    start: int
    end: int


def liveness(
    plan: "Plan", order: Sequence[int] | None = None, donated: bool = False, fused: Collection[int] = ()
) -> list[Interval]:
    """One interval per plan node, in plan order, for the schedule `order` (default: the plan's node order).

    A value is live from its producer's step to its last consumer's step. Graph inputs and constants (Var) are
    live from step 0 and, unless donated, to the last step, as the caller keeps them; results live to the last
    step. A Get's buffer is written by its multi-result call, so it is live from that call's step; the call's
    tuple value itself counts 0 bytes, as does a value the target keeps inside fusions (`fused`: backends/fusion.py).
    """
    nodes = plan.nodes
    order = list(range(len(nodes))) if order is None else list(order)
    if sorted(order) != list(range(len(nodes))):
        raise ValueError("order must be a permutation of the plan's nodes")
    pos = [0] * len(nodes)
    for step, i in enumerate(order):
        pos[i] = step
    last = len(order) - 1
    end = [pos[i] for i in range(len(nodes))]
    for i, node in enumerate(nodes):
        for j in node.inputs:
            if pos[j] >= pos[i]:
                raise ValueError(f"order is not topological: node {i} runs before its input {j}")
            end[j] = max(end[j], pos[i])
    for i in reversed(order):  # a fused value is computed in its consumers' fusions: its inputs are read there
        if i in fused:
            for j in nodes[i].inputs:
                end[j] = max(end[j], end[i])
    for i in _pinned(plan, donated):
        end[i] = last
    intervals = []
    for i, node in enumerate(nodes):
        start = 0 if node.op == VAR else pos[node.inputs[0]] if node.op == GET else pos[i]
        size = 0 if i in fused else value_bytes(node.shape, node.dtype)
        intervals.append(Interval(i, size, start, end[i]))
    return intervals


def _live_bytes(intervals: Sequence[Interval]) -> np.ndarray:
    """Live bytes at each step (a difference array swept once)."""
    steps = max((iv.end for iv in intervals), default=-1) + 2
    delta = np.zeros(steps, dtype=np.int64)
    for iv in intervals:
        delta[iv.start] += iv.size
        delta[iv.end + 1] -= iv.size
    return np.cumsum(delta)[:-1]


def lower_bound(intervals: Sequence[Interval]) -> int:
    """The peak of live bytes over the steps: no offset assignment can use less."""
    live = _live_bytes(intervals)
    return int(live.max()) if live.size else 0


# placement orders tried by best_fit: by size first (the classic), then by size x lifetime, then by lifetime;
# no one order wins on every benchmark model (squeezenet wants lifetime, train_step size x lifetime)
_PLACEMENT_ORDERS: tuple[Callable[[Interval, int], tuple[int, ...]], ...] = (
    lambda iv, size: (-size, iv.start),
    lambda iv, size: (-size * (iv.end - iv.start + 1), iv.start),
    lambda iv, size: (iv.start - iv.end, -size),
)


def best_fit(intervals: Sequence[Interval], align: int = 1) -> tuple[list[int], int]:
    """Offsets (one per interval) into one arena, and the arena's size.

    Values are placed one by one, each into the smallest gap left by the already placed values it overlaps in
    time, or on top; largest first, then the other placement orders, keeping the smallest arena (stopping at
    the lower bound). align: round sizes and offsets up to this many bytes (XLA aligns to 64).
    """
    sizes = [-(-iv.size // align) * align for iv in intervals]
    floor = lower_bound([Interval(iv.node, size, iv.start, iv.end) for iv, size in zip(intervals, sizes, strict=True)])
    best: tuple[list[int], int] | None = None
    for key in _PLACEMENT_ORDERS:
        order = sorted((k for k in range(len(intervals)) if sizes[k]), key=lambda k: key(intervals[k], sizes[k]))
        offsets, arena = _place(intervals, sizes, order)
        if best is None or arena < best[1]:
            best = offsets, arena
        if arena <= floor:
            break
    assert best is not None
    return best


def _place(intervals: Sequence[Interval], sizes: list[int], order: list[int]) -> tuple[list[int], int]:
    offsets = [0] * len(intervals)
    starts = np.array([iv.start for iv in intervals])
    ends = np.array([iv.end for iv in intervals])
    placed = np.zeros(len(intervals), dtype=bool)
    arena = 0
    for k in order:
        size = sizes[k]
        overlap = np.flatnonzero(placed & (starts <= ends[k]) & (ends >= starts[k]))
        best, best_gap, top = None, None, 0
        for j in sorted(overlap, key=offsets.__getitem__):
            gap = offsets[j] - top
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, offsets[j] + sizes[j])
        offsets[k] = top if best is None else best
        placed[k] = True
        arena = max(arena, offsets[k] + size)
    return offsets, arena


def _pinned(plan: "Plan", donated: bool) -> set[int]:
    """Values live to the end: results, effects and, unless donated, the arguments and constants."""
    kept = {*plan.outputs, *plan.effects}
    return kept if donated else kept | {i for i, n in enumerate(plan.nodes) if n.op == VAR}


def schedule_peak(
    plan: "Plan", order: Sequence[int] | None = None, donated: bool = False, fused: Collection[int] = ()
) -> int:
    """Peak live bytes of the plan run in `order` (default: plan order)."""
    return lower_bound(liveness(plan, order, donated, fused))


def memory_schedule(plan: "Plan", donated: bool = False, fused: Collection[int] = ()) -> list[int]:
    """A topological order of the plan's nodes whose peak live bytes is no higher than the plan's own order.

    Candidates: a depth-first order visiting the hungriest input first (_sethi_ullman), and greedy list
    scheduling (_greedy) with ties broken by plan order or by most recently ready. The lowest-peak order of
    those and the plan's own is returned, the plan's own on a tie.
    """
    orders = [list(range(len(plan.nodes))), _sethi_ullman(plan)]
    orders += [_greedy(plan, donated, depth_first) for depth_first in (False, True)]
    return min(orders, key=lambda order: schedule_peak(plan, order, donated, fused))


def _sethi_ullman(plan: "Plan") -> list[int]:
    """Post-order from the results, inputs visited by decreasing (peak to compute) - (size): Sethi-Ullman's order
    for trees, where computing the hungriest input first keeps fewer finished inputs waiting; on a DAG the peaks
    are estimates (shared inputs are counted in each user)."""
    nodes = plan.nodes
    size = [value_bytes(n.shape, n.dtype) for n in nodes]
    need = [0] * len(nodes)  # estimated peak bytes to compute each node, its inputs computed in `first` order

    def first(i: int) -> list[int]:
        return sorted(set(nodes[i].inputs), key=lambda j: need[j] - size[j], reverse=True)

    for i in range(len(nodes)):
        held = peak = 0
        for j in first(i):
            peak, held = max(peak, held + need[j]), held + size[j]
        need[i] = max(peak, held + size[i])
    order = postorder([*plan.outputs, *plan.effects], first)
    seen = set(order)
    return order + [i for i in range(len(nodes)) if i not in seen]  # unreachable nodes last, still topological


def _greedy(plan: "Plan", donated: bool, depth_first: bool) -> list[int]:
    """Among the ready nodes, run the one that frees the most bytes net of what it allocates; Vars first."""
    nodes = plan.nodes
    pinned = _pinned(plan, donated)
    alloc = [0 if n.op == GET else value_bytes(n.shape, n.dtype) for n in nodes]
    for n in nodes:
        if n.op == GET:  # the call writes all its results
            alloc[n.inputs[0]] += value_bytes(n.shape, n.dtype)
    users: list[set[int]] = [set() for _ in nodes]
    for i, n in enumerate(nodes):
        for j in n.inputs:
            users[j].add(i)
    remaining = [len(u) for u in users]
    waiting = [len(set(n.inputs)) for n in nodes]
    readied = [0] * len(nodes)  # when each node became ready, for the depth-first tie-break
    ready: list[int] = []

    def gain(i: int) -> tuple[int, int]:
        freed = sum(alloc[j] for j in set(nodes[i].inputs) if remaining[j] == 1 and j not in pinned)
        return freed - alloc[i], readied[i] if depth_first else -i

    def run(i: int) -> None:
        order.append(i)
        for j in set(nodes[i].inputs):
            remaining[j] -= 1
        for u in sorted(users[i]):
            waiting[u] -= 1
            if not waiting[u]:
                readied[u] = len(order)
                ready.append(u)

    order: list[int] = []
    for i, n in enumerate(nodes):
        if n.op == VAR:
            run(i)
    ready.extend(i for i, n in enumerate(nodes) if n.op != VAR and not n.inputs)
    while ready:
        best = max(ready, key=gain)
        ready.remove(best)
        run(best)
    return order


def xla_figure(
    fn: Callable[..., Any],
    args: Sequence[Any],
    compiler_options: dict[str, Any] | None = None,
    donate_argnums: int | Sequence[int] = (),
) -> dict[str, int]:
    """XLA's memory figures for jax.jit(fn)(*args): argument, output, alias, temp bytes and their total.

    total = argument + output - alias + temp: on CPU `peak_memory_in_bytes` leaves the temp arena out.
    """
    lowered = jax.jit(fn, donate_argnums=donate_argnums).lower(*args)
    return figure_of(lowered.compile(compiler_options))


def figure_of(compiled: Any) -> dict[str, int]:
    """XLA's memory figures of a compiled program (jax's Compiled), with total = arg + out - alias + temp, or XLA's
    own peak where that is more: XLA:CPU's peak leaves its temp arena out, the TPU's temp leaves out the buffers its
    intermediate values and layout copies take (deviceless, `tanh(x @ w) @ w` at 2048: temp 0, peak 72 MiB against
    args and result 48)."""
    stats = compiled.memory_analysis()
    figure = {
        "argument": int(stats.argument_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
    }
    summed = figure["argument"] + figure["output"] - figure["alias"] + figure["temp"]
    figure["total"] = max(summed, int(getattr(stats, "peak_memory_in_bytes", 0) or 0))
    return figure


def donation_figures(
    fn: Callable[..., Any], args: Sequence[Any], donate_argnums: int | Sequence[int]
) -> dict[str, dict[str, int] | int]:
    """XLA's figures without and with donating `donate_argnums`, and the bytes donation saves."""
    plain, donated = xla_figure(fn, args), xla_figure(fn, args, donate_argnums=donate_argnums)
    return {"plain": plain, "donated": donated, "saved": plain["total"] - donated["total"]}


def segment_cuts(plan: "Plan", k: int) -> list[int]:
    """k-1 cut steps in plan order splitting it into k segments, each moved (within a quarter segment) to the
    step where the fewest bytes cross: those are what a checkpointed segment saves for the backward pass."""
    intervals = [iv for iv in liveness(plan) if plan.nodes[iv.node].op != VAR]
    n = len(plan.nodes)
    crossing = np.zeros(n + 1, dtype=np.int64)  # crossing[p]: bytes defined before step p and used at or after it
    for iv in intervals:
        crossing[iv.start + 1 : iv.end + 1] += iv.size
    cuts: list[int] = []
    for s in range(1, k):
        centre, reach = s * n // k, max(1, n // (4 * k))
        lo, hi = max(centre - reach, (cuts[-1] + 1) if cuts else 1), min(centre + reach, n - 1)
        if lo <= hi:
            cuts.append(lo + int(np.argmin(crossing[lo : hi + 1])))
    return cuts


def segmented(
    plan: "Plan", k: int, policy: Callable[..., bool] = jax.checkpoint_policies.nothing_saveable
) -> Callable[..., list[Any]]:
    """fn(*flat_args) -> the plan's results, run as k segments each wrapped in jax.checkpoint(policy).

    Under jax.grad only segment boundaries (and the arguments) are saved; each segment is recomputed in the
    backward pass. The plan must have no effects (they would be recomputed too).
    """
    if plan.effects:
        raise ValueError("a plan with effects cannot be split into rematerialized segments")
    bounds = [0, *segment_cuts(plan, k), len(plan.nodes)]
    spans = list(itertools.pairwise(bounds))
    reads = [{j for i in range(lo, hi) for j in plan.nodes[i].inputs if plan.nodes[j].op != VAR} for lo, hi in spans]
    later = set(plan.outputs)  # nodes read after the segment being built (built back to front)
    stages = []
    for (lo, hi), read in reversed(list(zip(spans, reads, strict=True))):
        given = sorted(j for j in read if j < lo)
        out = sorted(i for i in range(lo, hi) if i in later and plan.nodes[i].op != VAR)
        if out:
            stages.insert(0, (given, out, jax.checkpoint(lower(plan, outputs=out, given=given), policy=policy)))
        later |= read
    args_out = [i for i in plan.outputs if plan.nodes[i].op == VAR]  # results that are arguments or constants
    read_args = lower(plan, outputs=args_out)

    def run(*args: Any) -> list[Any]:
        values: dict[int, Any] = dict(zip(args_out, read_args(*args), strict=True))
        for given, out, stage in stages:
            values.update(zip(out, stage(*args, *(values[j] for j in given)), strict=True))
        return [values[i] for i in plan.outputs]

    return run


@dataclass
class BudgetReport:
    budget: int
    unconstrained: dict[str, int]
    achieved: dict[str, int]
    mechanism: str  # what made it fit (or the smallest that was tried, when nothing did)
    fits: bool
    tried: list[tuple[str, int]] = field(default_factory=list)  # (mechanism, XLA total bytes), in order

    def summary(self) -> str:
        mb = 1 / 2**20
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"memory budget {self.budget * mb:.1f} MiB: {verdict} with {self.mechanism}: "
            f"{self.unconstrained['total'] * mb:.1f} -> {self.achieved['total'] * mb:.1f} MiB (XLA)"
        )


def fit_budget(
    fn: Callable[..., Any],
    args: Sequence[Any],
    memory_budget: int,
    *,
    loss: Callable[..., Any] | None = None,
    grad: Callable[[Callable[..., Any]], Callable[..., Any]] = jax.value_and_grad,
    loss_plan: "Plan | None" = None,
    segments: Sequence[int] = (2, 4, 8, 16),
) -> tuple[Callable[..., Any], BudgetReport]:
    """A jitted function computing fn whose XLA figure fits memory_budget where one was found, and the report.

    Tried in order, first fit kept: XLA's memory-optimized scheduler; then, when fn is grad(loss) and `loss`
    is given, grad of the loss run as k rematerialized segments (segmented, for each k of `segments`, with
    and without that scheduler). The segments come from loss_plan, eqsat's plan of loss (eqsat.fit_budget makes
    it). A candidate whose results differ from fn's is skipped.
    """
    candidates: list[tuple[str, Callable[..., Any]]] = [("jax.jit", fn)]
    if loss is not None:
        if loss_plan is None:
            raise ValueError("fit_budget with a loss needs loss_plan, the loss's plan (eqsat.fit_budget makes it)")
        for k in segments:
            candidates.append((f"{k} rematerialized segments", grad(_tree_function(segmented(loss_plan, k), loss))))
    expected: list[Any] | None = None
    tried: list[tuple[str, int, Callable[..., Any], dict[str, int]]] = []
    for name, candidate in candidates:
        for options, label in ((None, name), (MEMORY_OPTIMIZED, f"{name} + memory-optimized XLA scheduler")):
            figure = xla_figure(candidate, args, options)
            tried.append((label, figure["total"], candidate, figure))
            if figure["total"] > memory_budget:
                continue
            compiled = jax.jit(candidate, compiler_options=options)
            if candidate is not fn:
                expected = expected if expected is not None else jax.tree_util.tree_leaves(jax.jit(fn)(*args))
                if mismatch(expected, jax.tree_util.tree_leaves(compiled(*args))):
                    break  # wrong results: the next candidate
            return compiled, BudgetReport(memory_budget, tried[0][3], figure, label, True, [t[:2] for t in tried])
    label, _, candidate, figure = min(tried, key=lambda t: t[1])
    options = MEMORY_OPTIMIZED if label.endswith("scheduler") else None
    report = BudgetReport(memory_budget, tried[0][3], figure, label, False, [t[:2] for t in tried])
    return jax.jit(candidate, compiler_options=options), report


def _tree_function(flat: Callable[..., list[Any]], like: Callable[..., Any]) -> Callable[..., Any]:
    """flat (a function of the flat argument leaves) with the argument and result trees of `like`."""

    def tree_fn(*args: Any) -> Any:
        out_tree = jax.tree_util.tree_structure(jax.eval_shape(like, *args))
        return jax.tree_util.tree_unflatten(out_tree, flat(*jax.tree_util.tree_leaves(args)))

    return tree_fn


@dataclass
class MemoryReport:
    """Our model of the plan's memory (a buffer per value the target does not fuse away, and its layout copies)
    and, where measured, XLA's figure."""

    planned_peak: int  # best-fit arena over the plan's order
    lower_bound: int  # peak live bytes, plan's order
    schedule_peak: int  # peak live bytes, memory_schedule's order
    xla: dict[str, int] | None = None
    applied: list[str] = field(default_factory=list)

    def summary(self) -> str:
        mb = 1 / 2**20
        lines = [
            f"  memory (model)   best-fit arena {self.planned_peak * mb:.2f} MiB, lower bound "
            f"{self.lower_bound * mb:.2f} MiB, memory-aware order {self.schedule_peak * mb:.2f} MiB",
        ]
        if self.xla:
            x = self.xla
            lines.append(
                f"  memory (XLA)     {x['total'] * mb:.2f} MiB = args {x['argument'] * mb:.2f} + out "
                f"{x['output'] * mb:.2f} - alias {x['alias'] * mb:.2f} + temp {x['temp'] * mb:.2f}"
            )
        if self.applied:
            lines.append(f"  memory applied   {', '.join(self.applied)}")
        return "\n".join(lines)


def memory_report(
    plan: "Plan", fn: Callable[..., Any] | None = None, args: Sequence[Any] | None = None
) -> MemoryReport:
    """The plan's memory figures, the values its target keeps inside fusions left out (backends/fusion.py); XLA's
    too when fn (the plan's lowered, or any equal, function) and args are given."""
    profile = load_profile(plan.target)
    fused = fused_values(plan, profile)
    intervals = liveness(plan, fused=fused) + layout_copies(plan, profile)
    _, arena = best_fit(intervals)
    xla = xla_figure(fn, args) if fn is not None and args is not None else None
    order = memory_schedule(plan, fused=fused)
    peak = lower_bound(liveness(plan, order, fused=fused) + layout_copies(plan, profile, order))
    return MemoryReport(arena, lower_bound(intervals), peak, xla)


def layout_copies(plan: "Plan", profile: Profile, order: Sequence[int] | None = None) -> list[Interval]:
    """The copies the target makes of each heavy op's inputs while it runs (Profile.layout_copies: a share of its
    inputs' bytes per cost class), each live at the op's own step of `order` (default: plan order)."""
    step = {i: k for k, i in enumerate(order if order is not None else range(len(plan.nodes)))}
    copies = []
    for i, node in enumerate(plan.nodes):
        share = profile.layout_copies.get(str(class_of(node.op)), 0.0)
        if share:
            read = sum(value_bytes(plan.nodes[j].shape, plan.nodes[j].dtype) for j in set(node.inputs))
            copies.append(Interval(i, int(share * read), step[i], step[i]))
    return copies
