"""Plans for a TPU checked by XLA's own TPU compiler on a machine without one (issue 43).

With libtpu installed (the optional extra `tpu-aot`), jax compiles for a TPU topology deviceless: the function is
planned for a TPU profile, validated here on the CPU, and then the original and the plan are lowered for a TPU
device and compiled by XLA's TPU pipeline (fusion, layout, buffer assignment), whose cost and memory analyses
are set beside eqsat's own prediction. Nothing runs on a TPU.
"""

import dataclasses
import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

import eqsat
from eqsat.backends.lower import lower
from eqsat.backends.memory import MemoryReport, figure_of, memory_report
from eqsat.extract.cost import Cost, load_bundled, profile_names
from eqsat.extract.plan import Plan
from eqsat.ops import kernels
from eqsat.support.errors import EqsatError
from eqsat.support.workload import Workload

TARGET = "tpu-v5e"
NO_CHANGE = 0.02  # a figure within 2% of the original's is no change: no gain, no loss
NEEDS_EXTRA = (
    "compiling for a TPU without one needs libtpu, the optional extra `tpu-aot`: pip install -e '.[tpu-aot]' "
    "(in its own environment: with libtpu installed, every jax process tries a TPU first)"
)
# libtpu reads these at its first use: unset, it warns twice on a host that is no TPU VM, and a second process
# loading it (pytest -n 2's other worker) fails on its lockfile, though deviceless compiles share no device
_QUIET_TPU_ENV = {
    "TPU_ACCELERATOR_TYPE": "v5litepod-4",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


class TpuCompilerMissing(EqsatError):
    """libtpu is not installed, or it gave no TPU topology to compile for."""


@dataclass(frozen=True)
class Compiled:
    """One program as XLA's TPU compiler sees it, or the compiler's error."""

    error: str | None = None
    fusions: int = 0  # fusions the program launches (top level and in control flow, not nested in other fusions)
    flops: float = 0.0
    bytes: float = 0.0  # cost_analysis's "bytes accessed"
    seconds: float = 0.0  # cost_analysis's "optimal_seconds", a roofline
    temp: int = 0  # the buffer assigner's temp bytes (deviceless, a TPU's leaves out intermediate values' buffers)
    peak: int = 0  # XLA's peak: argument + output - alias + temp, or its own peak where more (backends/memory.py)
    resident: int = 0  # argument + output - alias: what the program holds whatever it computes
    branches: int = 0  # while loops and conditionals in the program (a fallback is one)


@dataclass
class Check:
    """The original and the plan compiled for a TPU, with eqsat's prediction for each."""

    name: str
    plan: Plan
    original: Compiled
    planned: Compiled  # the plan as optimize runs it: under the overflow watch where @real rules fired
    # where the plan has fallbacks (the overflow watch's, an exact kernel's): its program without them, what an
    # ordinary call runs (XLA's cost analysis counts a fallback's body as if it ran)
    alone: Compiled | None = None
    model: MemoryReport | None = None  # eqsat's memory model of the plan (backends/memory.py memory_report)
    budget: int | None = None
    notes: list[str] = field(default_factory=list)
    optimized: Any = None  # the optimized function the plan came from (what a device at hand times)

    @property
    def with_fallbacks(self) -> bool:
        return self.alone is not None

    @property
    def rewritten(self) -> dict[str, int]:
        return self.plan.rewritten_ops()


def quiet_libtpu() -> None:
    """Tell libtpu it is on no TPU VM and may be loaded by several processes, before jax first starts its
    backends (which try a TPU where libtpu is installed). Settings already made are kept."""
    for name, value in _QUIET_TPU_ENV.items():
        os.environ.setdefault(name, value)


def libtpu_installed() -> bool:
    """Whether XLA's TPU compiler (libtpu) can be loaded here."""
    return importlib.util.find_spec("libtpu") is not None


def topology_of(target: str) -> str:
    """The TPU topology a target's plans are compiled for (its profile's `topology`); TpuCompilerMissing for a
    target that is no TPU."""
    topology = load_bundled(target).topology
    if not topology:
        tpus = [name for name in profile_names() if load_bundled(name).topology]
        raise TpuCompilerMissing(f"{target!r} is no TPU target; XLA's TPU compiler compiles for {tpus}")
    return topology


def tpu_device(topology: str | None = None) -> Any:
    """The first device of a TPU topology (default: TARGET's), to lower and compile for deviceless;
    TpuCompilerMissing without libtpu."""
    if not libtpu_installed():
        raise TpuCompilerMissing(NEEDS_EXTRA)
    quiet_libtpu()
    topology = topology or topology_of(TARGET)
    from jax.experimental import topologies

    try:
        return topologies.get_topology_desc(topology, "tpu").devices[0]
    except Exception as error:  # jax's and libtpu's own types: a topology it does not know, a libtpu too old
        raise TpuCompilerMissing(f"no TPU topology {topology!r} from libtpu: {str(error).splitlines()[0]}") from None


def on_device(args: Sequence[Any], device: Any) -> list[Any]:
    """The arguments as jax.ShapeDtypeStructs placed on `device` (pytrees kept)."""
    sharding = jax.sharding.make_single_device_sharding(device)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), list(args))


def compile_figures(lowering: Callable[[], Any]) -> Compiled:
    """Compile what lowering() returns (a jax Lowered) and read XLA's analyses; the error's first line if it fails."""
    try:
        compiled = lowering().compile()
    except Exception as error:  # the compiler's own error types: what it says is the finding
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return Compiled(error=f"{type(error).__name__}: {lines[0][:300]}")
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    figure = figure_of(compiled)
    return Compiled(
        fusions=fusion_count(compiled.as_text()),
        flops=float(cost.get("flops", 0.0)),
        bytes=float(cost.get("bytes accessed", 0.0)),
        seconds=float(cost.get("optimal_seconds", 0.0)),
        temp=figure["temp"],
        peak=figure["total"],
        resident=figure["argument"] + figure["output"] - figure["alias"],
        branches=len(_BRANCH.findall(compiled.as_text())),
    )


_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_FUSION = re.compile(r"\sfusion\(.*calls=%?([\w.\-]+)")
_BRANCH = re.compile(r"\s(?:while|conditional)\(")


def fusion_count(hlo: str) -> int:
    """Fusion instructions of an HLO module's text outside fused computations: the fused kernels it launches (a
    TPU fusion nests bitcast and operand fusions inside it, which are no launches of their own)."""
    fusions: dict[str, list[str]] = {}  # computation -> the computations its fusion instructions call
    current = None
    for line in hlo.splitlines():
        header = _HEADER.match(line) if not line.startswith(" ") else None
        if header:
            current = header.group(1)
            fusions[current] = []
        elif current is not None and (found := _FUSION.search(line)):
            fusions[current].append(found.group(1))
    fused = {called for calls in fusions.values() for called in calls}
    return sum(len(calls) for name, calls in fusions.items() if name not in fused)


def check(
    work: Workload,
    *,
    target: str = TARGET,
    device: Any = None,
    memory_budget: int | None = None,
    **options: Any,
) -> Check:
    """Plan work.fn for `target`, validate the plan on this machine's arguments, and compile the original, the plan
    as optimize runs it and (where it has fallbacks) the plan alone for `device` (default: tpu_device()).
    `options`: optimize's."""
    device = device if device is not None else tpu_device()
    limits = options.pop("limits", None) or eqsat.Limits()
    # this machine's clock says nothing about a TPU's: the plan is kept unmeasured, as the target chose it
    limits = dataclasses.replace(limits, guard_seconds=0)
    fast = eqsat.optimize(
        work.fn, target=target, limits=limits, memory_budget=memory_budget, background=False, **options
    )
    jax.block_until_ready(fast(*work.args))  # validated on the example arguments: a plan that differs is refused
    plan = fast.plan(*work.args)
    structs = on_device(work.args, device)
    found = Check(work.name, plan, compile_figures(lambda: jax.jit(work.fn).lower(*structs)), Compiled())
    found.budget, found.optimized = memory_budget, fast
    found.planned = compile_figures(lambda: fast.lower(*structs))
    if plan.fallback:
        found.notes.append(f"the original runs: {plan.fallback}")
        return found
    found.model = memory_report(plan)
    if plan.overflow_watch or found.planned.branches > found.original.branches:
        flat = jax.tree_util.tree_leaves(structs)
        with kernels.common_path() as checks:
            program = lower(plan)
            found.alone = compile_figures(lambda: jax.jit(lambda *a: (program(*a), checks)).lower(*flat))
    return found


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _side(compiled: Compiled, cost: Cost | None, model: int | None) -> list[str]:
    """One program's column: XLA's figures, then eqsat's prediction."""
    if compiled.error:
        return ["FAILED: " + compiled.error[:60], *[""] * 5, *(_predicted(cost, model))]
    return [
        "compiled",
        str(compiled.fusions),
        f"{compiled.flops:.4g}",
        f"{compiled.bytes:.4g}",
        _mib(compiled.temp),
        _mib(compiled.peak),
        *_predicted(cost, model),
    ]


def _predicted(cost: Cost | None, model: int | None) -> list[str]:
    if cost is None:
        return [""] * 5
    return [
        f"{cost.flops:.4g}",
        f"{cost.bytes:.4g}",
        f"{cost.seconds * 1e6:.1f} us",
        str(cost.kernels),
        _mib(model) if model is not None else "-",
    ]


ROWS = (
    "TPU compile",
    "XLA fusions",
    "XLA flops",
    "XLA bytes accessed",
    "XLA temp",
    "XLA peak (args + out - alias + temp)",
    "eqsat flops",
    "eqsat bytes",
    "eqsat time",
    "eqsat kernels",
    "eqsat memory model (best-fit arena)",
)


def side_by_side(found: Check) -> str:
    """The check as a table: a row per figure, a column per program."""
    plan = found.plan
    arena = found.model.planned_peak if found.model else None
    columns = {
        "original": _side(found.original, plan.original, None),
        "plan": _side(found.planned, plan.predicted, arena),
    }
    if found.alone is not None:
        columns["plan alone"] = _side(found.alone, plan.predicted, arena)
    width = max(map(len, ROWS))
    cells = [max(len(name), *(len(v) for v in column)) for name, column in columns.items()]
    lines = [f"== {found.name}: planned for {plan.target}, compiled for TPU by XLA (deviceless)"]
    lines.append(" " * width + "  " + "  ".join(f"{n:>{w}}" for n, w in zip(columns, cells, strict=True)))
    for k, row in enumerate(ROWS):
        values = [column[k] for column in columns.values()]
        lines.append(f"{row:<{width}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(values, cells, strict=True)))
    lines.append(f"rewritten ops: {listed(found.rewritten)}")
    lines.append(f"rules fired:   {listed(plan.rules_fired)}")
    if found.with_fallbacks:
        lines.append(
            "note: XLA counts the plan's fallbacks (the overflow watch's loop, the original, where @real rules "
            "fired; an exact kernel's), run only on values out of range, in its flops and bytes; 'plan alone' is "
            "the plan's program without them"
        )
    lines += [f"note: {note}" for note in [*found.notes, *findings(found)]]
    return "\n".join(lines)


def listed(counts: dict[str, int]) -> str:
    """name x count, ..., or none."""
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"


def findings(found: Check) -> list[str]:
    """What deserves a look: a program the TPU compiler refused, a plan XLA counts as more work than the original,
    a memory budget the TPU's buffer assignment misses, eqsat's memory model off XLA's peak by more than 10%."""
    said = [f"{name} does not compile for TPU" for name, c in programs(found) if c.error]
    plan = plan_program(found)
    base = found.original
    if not plan.error and not base.error:
        more = {what: (mine, theirs) for what, mine, theirs in _figures(plan, base) if mine > theirs * 1.001}
        for what, (mine, theirs) in more.items():
            if what != "kernels":
                said.append(f"the plan has more XLA {what} than the original ({mine:.4g} > {theirs:.4g}); "
                            + _predicted_instead(found.plan, what, set(more)))  # fmt: skip
        if found.budget is not None:
            said.append(_budget_note(found, plan))
    if found.model is not None and not plan.error and plan.peak:
        off = found.model.planned_peak / plan.peak - 1
        if abs(off) > 0.10:
            said.append(
                f"eqsat's memory model {_mib(found.model.planned_peak)} is {off:+.0%} off the TPU buffer "
                f"assigner's peak {_mib(plan.peak)}"
            )
    return said


def _budget_note(found: Check, plan: Compiled) -> str:
    """The budget against the TPU's peak (args + out - alias + temp, what eqsat's budget counts) and temp bytes of
    both programs, and eqsat's own check: XLA:CPU's figure of the program optimize runs, watch included."""
    budget, base, whole = found.budget or 0, found.original, found.planned
    mine, theirs = ("under" if c.peak <= budget else "OVER" for c in (plan, base))
    said = f"budget {_mib(budget)}: TPU peak {_mib(plan.peak)} with the plan ({mine}), {_mib(base.peak)} without "
    said += f"({theirs.lower()}); TPU temp {_mib(plan.temp)} against {_mib(base.temp)}"
    if found.with_fallbacks:
        said += f"; with its fallbacks the TPU peak {_mib(whole.peak)}"
    cpu = found.plan.memory.xla if found.plan.memory is not None else None
    if cpu is not None:
        verdict = "under" if cpu["total"] <= budget else "over"
        said += f"; eqsat's own check (XLA:CPU, watch included) {_mib(cpu['total'])} ({verdict})"
    return said


def _figures(plan: Compiled, base: Compiled) -> list[tuple[str, float, float]]:
    """(figure, the plan's, the original's) for what XLA counts and eqsat predicts: flops, bytes, and kernels (XLA's
    fusions)."""
    return [
        ("flops", plan.flops, base.flops),
        ("bytes", plan.bytes, base.bytes),
        ("kernels", plan.fusions, base.fusions),
    ]


def _predicted_instead(plan: Plan, what: str, contradicted: set[str]) -> str:
    """What eqsat predicted for `what` ("flops" or "bytes") and where it saw its gain: the figures it predicted
    fewer of by more than NO_CHANGE that XLA does not count more of (fusions for kernels)."""
    before, after = getattr(plan.original, what), getattr(plan.predicted, what)
    said = f"eqsat predicted {'more' if after > before * 1.001 else 'no more'} ({before:.4g} -> {after:.4g})"
    if plan.predicted.seconds >= plan.original.seconds:
        return said
    gains = [
        f"{name} {getattr(plan.original, name):.4g} -> {getattr(plan.predicted, name):.4g}"
        for name in ("flops", "bytes", "kernels")
        if name not in contradicted and getattr(plan.predicted, name) < getattr(plan.original, name) * (1 - NO_CHANGE)
    ]
    return f"{said}, its gain elsewhere: {', '.join(gains) or 'none that XLA agrees with'}"


def programs(found: Check) -> list[tuple[str, Compiled]]:
    """Each program compiled, named."""
    pairs = [("the original", found.original), ("the plan", found.planned)]
    return pairs + ([("the plan alone", found.alone)] if found.alone is not None else [])


def plan_program(found: Check) -> Compiled:
    """The plan's own program: without the watch where it has one (the watch's fallback is the original)."""
    return found.alone if found.alone is not None else found.planned
