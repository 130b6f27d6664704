"""The bench models, the demo's cases and the kernel workloads planned for tpu-v5e and compiled, original and plan,
by XLA's own TPU compiler on this machine without a TPU (issue 43; eqsat/tools/tpu_check.py): a markdown table of
both programs' TPU flops, bytes, temp bytes and fusions beside eqsat's predictions, and the rewrites each plan took.

Needs libtpu (the optional extra `tpu-aot`), e.g. `PYTHONPATH=/path/to/libtpu python -m benches.tpu_check`.

With `--here`, the same checks run on the device at hand instead (issue 43 item 5: a TPU or a GPU lent for an
hour): every case is planned for that device's profile (the one whose timing_device is this machine's, or
--target), both programs are compiled for it by its own compiler, and both are timed there, interleaved, so that
measured times stand beside the compiler's figures (a last column). On a CPU it runs too, as a dry run.
"""

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable

import jax

from eqsat.extract.cost import load_bundled, profile_names
from eqsat.extract.timing import local_device
from eqsat.numerics.measure import Comparison, interleaved
from eqsat.support.workload import Workload
from eqsat.tools import tpu_check


def _cases(scale: str) -> dict[str, Callable[[], Workload]]:
    """name -> workload factory: the demo's examples, the NasRNN steps, the bench models, the kernel rows (keras'
    and flax's need the optional extra `models`)."""
    from benches import kernels
    from benches.acceptance import WORKLOADS
    from benches.models.registry import MODELS

    cases: dict[str, Callable[[], Workload]] = {name: lambda f=f: f(scale) for name, f in WORKLOADS.items()}
    del cases["nasrnn_5_steps"]  # MODELS' nasrnn, the same build
    cases.update({name: lambda f=f: f(scale) for name, f in MODELS.items()})
    rows = ("onehot", "onehot_train", *kernels.SMALL, *kernels.WITH_HAND, *kernels.SUMS, *kernels.KERAS)
    cases.update({name: lambda name=name: kernels.workload(name) for name in (*rows, "mobilenetv2_train")})
    return cases


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def _pair(original: float, plan: float, fmt: Callable[[float], str] = lambda v: f"{v:.3g}") -> str:
    mark = " **more**" if plan > original * 1.001 and original >= 0 else ""
    return f"{fmt(original)} -> {fmt(plan)}{mark}"


HEADER = (
    "| case | TPU compile | XLA flops | XLA bytes | XLA temp MiB | XLA fusions (eqsat kernels) | XLA optimal us "
    "| eqsat flops | eqsat bytes | eqsat us | ranks agree | rewritten ops (rules that fired) | notes |\n"
    + "|---" * 13
    + "|"
)


def row(found: tpu_check.Check) -> str:
    """One markdown row: original -> plan (the plan's program without its fallbacks where it has some)."""
    base, mine, plan = found.original, tpu_check.plan_program(found), found.plan
    failed = [name for name, c in tpu_check.programs(found) if c.error]
    compiled = "both" if not failed else "FAILED: " + ", ".join(failed)
    if failed:
        figures = [""] * 5
    else:
        figures = [
            _pair(base.flops, mine.flops),
            _pair(base.bytes, mine.bytes),
            _pair(base.temp, mine.temp, _mib),
            f"{base.fusions} -> {mine.fusions} (eqsat {plan.original.kernels} -> {plan.predicted.kernels})",
            _pair(base.seconds * 1e6, mine.seconds * 1e6, lambda v: f"{v:.1f}" if v >= 0 else "-"),
        ]
    predicted = [
        _pair(plan.original.flops, plan.predicted.flops),
        _pair(plan.original.bytes, plan.predicted.bytes),
        _pair(plan.original.seconds * 1e6, plan.predicted.seconds * 1e6, lambda v: f"{v:.1f}"),
    ]
    rewrites = tpu_check.listed(found.rewritten)
    rules = ", ".join(sorted(plan.rules_fired)) or "none"
    notes = [*found.notes, *tpu_check.findings(found)]
    if found.with_fallbacks and not found.planned.error:
        notes.append(f"with its fallbacks: {found.planned.flops:.3g} flops, {found.planned.bytes:.3g} bytes")
    cells = [found.name, compiled, *figures, *predicted, _agrees(found), f"{rewrites} ({rules})", "; ".join(notes)]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def _agrees(found: tpu_check.Check) -> str:
    """Whether eqsat's predicted change and the TPU compiler's flops and bytes point the same way: +1 where XLA
    counts fewer of one and no more of the other, -1 the reverse, 0 where both are within 2%. (XLA's own
    optimal_seconds is no judge: it reads (A@B)@v and A@(B@v) at 1024 as equally fast.)"""
    base, mine, plan = found.original, tpu_check.plan_program(found), found.plan
    if base.error or mine.error:
        return "-"

    def way(before: float, after: float) -> int:
        return 0 if abs(after - before) <= tpu_check.NO_CHANGE * max(before, 1e-30) else (1 if after < before else -1)

    ours = way(plan.original.seconds, plan.predicted.seconds)
    flops, bytes_ = way(base.flops, mine.flops), way(base.bytes, mine.bytes)
    theirs = flops + bytes_ if flops * bytes_ >= 0 else None  # None: fewer flops, more bytes, or the reverse
    if theirs is None:
        return f"mixed (eqsat {ours:+d}, XLA flops {flops:+d}, bytes {bytes_:+d})"
    return "yes" if ours == (theirs > 0) - (theirs < 0) else f"**no** (eqsat {ours:+d}, XLA {theirs:+d})"


MEASURED = " measured here, us (jax.jit / eqsat) |"


def here_target() -> str:
    """The profile of the device at hand: the one whose timing_device names it."""
    found = [name for name in profile_names() if load_bundled(name).timing_device == local_device()]
    if not found:
        raise SystemExit(f"python -m benches.tpu_check: error: no profile for {local_device()}; name one with --target")
    return found[0]


def timed_here(found: tpu_check.Check, work: Workload, seconds: float) -> str:
    """Both programs timed on the device at hand, interleaved: original -> plan us, and the ratio."""
    args = jax.device_put(work.args, jax.devices()[0])
    jax.block_until_ready(found.optimized.plan(*args) and found.optimized(*args))
    times: Comparison = interleaved(jax.jit(work.fn), found.optimized, args, seconds)
    return f"{times.baseline_s * 1e6:.1f} -> {times.candidate_s * 1e6:.1f} ({times.ratio:.2f}x)"


def run(
    names: list[str],
    scale: str,
    memory_budget: int | None = None,
    here: bool = False,
    target: str | None = None,
    seconds: float = 2.0,
) -> list[str]:
    """The table's rows, one case at a time (a case that crashes is a row saying so). `here`: compiled for and
    timed on this machine's first device, planned for `target` (default: its profile)."""
    cases = _cases(scale)
    unknown = [name for name in names if name not in cases]
    if unknown:
        raise SystemExit(f"python -m benches.tpu_check: error: unknown cases {unknown}; choose from {sorted(cases)}")
    device = jax.devices()[0] if here else tpu_check.tpu_device()
    target = target or (here_target() if here else tpu_check.TARGET)
    rows = []
    for name in names:
        start = time.perf_counter()
        try:
            work = cases[name]()
        except ImportError as error:  # flax's and keras' models: the optional extra `models`
            rows.append(f"| {name} | skipped: needs {error.name} (the optional extra `models`) |")
            continue
        try:
            found = tpu_check.check(work, target=target, device=device, memory_budget=memory_budget)
            measured = f" {timed_here(found, work, seconds)} |" if here else ""
        except Exception as error:  # any case's failure is a finding of the table, not the end of the run
            traceback.print_exc()
            rows.append(f"| {name} | CRASHED: {type(error).__name__}: {str(error).splitlines()[0][:200]} |")
            continue
        rows.append(row(found) + measured)
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.tpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated cases (default: all)")
    parser.add_argument("--scale", default="full", choices=["full", "small"], help="the examples' and models' size")
    parser.add_argument("--memory-budget", type=int, help="optimize's memory_budget for every case")
    parser.add_argument("--out", help="also write the table to this markdown file")
    parser.add_argument("--here", action="store_true", help="compile for and time on this machine's first device")
    parser.add_argument("--target", help="with --here: the profile to plan for (default: this device's)")
    parser.add_argument("--seconds", type=float, default=2.0, help="with --here: timing per case, interleaved")
    args = parser.parse_args(argv)
    if not args.here:
        tpu_check.quiet_libtpu()  # before any case's arguments start jax's backends
    os.environ.setdefault("EQSAT_PLAN_STORE", "off")  # plans made here with the guard off: not for other processes
    names = args.only.split(",") if args.only else list(_cases(args.scale))
    rows = run(names, args.scale, args.memory_budget, args.here, args.target, args.seconds)
    header = HEADER.replace("\n", MEASURED + "\n", 1) + "---|" if args.here else HEADER
    table = "\n".join([header, *rows])
    print(table)
    if args.out:
        with open(args.out, "w") as out:
            out.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
