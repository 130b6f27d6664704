"""The benchmark suite: each model optimized by eqsat and measured against jax.jit in the same process.

    python -m benches.run              # full suite, published shapes
    python -m benches.run --quick      # small shapes, short timings: a few minutes on 2 cores
    python -m benches.run --models bert,nasrnn --real   # a subset; --real adds the PyPI models

Writes a table to stdout and a JSON file (--out, default benches/results.json); --markdown FILE also writes the
tables in benches/RESULTS.md's form.
"""

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import jax

import eqsat
from benches.charts import CHARTS, draw_results, write_charts
from eqsat.backends.memory import xla_figure
from eqsat.extract.cost import class_of
from eqsat.support import progress
from eqsat.support.workload import Workload
from eqsat.tools.versus import against_jit


def measure(work: Workload, seconds: float, prepared: bool, target: str = "cpu") -> dict[str, Any]:
    t0 = time.perf_counter()
    progress.begin("measure", f"optimize and measure against jax.jit ({seconds:g} s)")
    timing, fast = against_jit(work, target, prepared, seconds)
    plan = fast.plan(*work.args)
    optimize_s = plan.stats["capture_s"] + plan.stats["saturate_s"] + plan.stats["extract_s"]
    return {
        "model": work.name,
        "ops": len(plan.graph.nodes),
        "enodes": plan.stats["enodes"],
        "eclasses": plan.stats["eclasses"],
        "stop": plan.stop_reason,
        "optimize_s": round(optimize_s, 3),
        "predicted_speedup": round(plan.predicted_speedup, 3),
        "measured_speedup": round(timing.ratio, 3),
        "measured_iqr": [round(timing.ratio_low, 3), round(timing.ratio_high, 3)],
        "jit_ms": round(timing.baseline_s * 1e3, 3),
        "eqsat_ms": round(timing.candidate_s * 1e3, 3),
        "peak_bytes_before": xla_figure(work.fn, work.args)["total"],
        # XLA's figure for the plan a direct call runs (with parameters prepared, their work leaves the call)
        "peak_bytes_after": fast.memory(*work.args).xla["total"],
        # where the time goes: the cost model's roofline time per op class, and the share of the measured time it
        # explains (1.0 would mean the program runs at the roofline)
        "roofline_ms_by_class": {k: round(v * 1e3, 3) for k, v in _by_class(plan).items()},
        "roofline_fraction": round(plan.predicted.seconds / timing.candidate_s, 3),
        "rules_changed_plan": plan.rules_involved(),
        "rewritten_ops": plan.rewritten_ops(),
        "fallback": plan.fallback,
        "prepared": bool(prepared and work.params_argnums),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def _by_class(plan: eqsat.Plan) -> dict[str, float]:
    """Predicted seconds per cost class (contraction, elementwise, opaque) over the plan's nodes."""
    seconds: dict[str, float] = {}
    for node in plan.nodes:
        seconds[class_of(node.op)] = seconds.get(class_of(node.op), 0.0) + node.cost.seconds
    return {k: v for k, v in seconds.items() if v}


def _row(work: Workload, seconds: float, no_prepare: bool, target: str) -> dict[str, Any]:
    """Measure one model and print its line of the table."""
    row = measure(work, seconds, prepared=not no_prepare, target=target)
    print(
        f"{row['model']:<16} ops {row['ops']:5d}  e-nodes {row['enodes']:6d}  opt {row['optimize_s']:6.2f}s  "
        f"predicted {row['predicted_speedup']:5.2f}x  measured {row['measured_speedup']:5.2f}x "
        f"[{row['measured_iqr'][0]:.2f}-{row['measured_iqr'][1]:.2f}]  jit {row['jit_ms']:8.2f} ms  "
        f"peak {row['peak_bytes_before'] / 2**20:7.1f} -> {row['peak_bytes_after'] / 2**20:7.1f} MiB  "
        f"{row['fallback'] or ''}",
        flush=True,
    )
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """The tables of benches/RESULTS.md: one row per model, then the roofline time per op class."""
    lines = [
        "| model | ops | e-nodes | optimize s | predicted | measured [IQR] | jax.jit ms | XLA peak MiB before -> after "
        "| rewritten |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rewritten = ", ".join(f"{k} {v}" for k, v in sorted(r["rewritten_ops"].items())) or "none (original kept)"
        lo, hi = r["measured_iqr"]
        lines.append(
            f"| {r['model']} | {r['ops']} | {r['enodes']} | {r['optimize_s']:.2f} | {r['predicted_speedup']:.2f}x "
            f"| **{r['measured_speedup']:.2f}x** [{lo:.2f}-{hi:.2f}] | {r['jit_ms']:.1f} "
            f"| {r['peak_bytes_before'] / 2**20:.1f} -> {r['peak_bytes_after'] / 2**20:.1f} | {rewritten} |"
        )
    lines += ["", "| model | roofline ms by op class (cost model) | measured eqsat ms | roofline fraction |"]
    lines.append("|---|---|---|---|")
    for r in rows:
        by_class = sorted(r["roofline_ms_by_class"].items(), key=lambda kv: -kv[1])
        classes = ", ".join(f"{k} {v:.2f}" for k, v in by_class)
        lines.append(f"| {r['model']} | {classes} | {r['eqsat_ms']:.2f} | {r['roofline_fraction']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benches.models.registry import MODELS

    parser = argparse.ArgumentParser(prog="python -m benches.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes and short timings")
    parser.add_argument("--models", help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--real", action="store_true", help="also the real PyPI models (extra `models`)")
    parser.add_argument("--no-prepare", action="store_true", help="time fast(params, x) instead of prepared")
    parser.add_argument("--target", default="cpu", help="device profile to plan for (run it on that device)")
    parser.add_argument("--seconds", type=float, help="timing budget per model (default 1 quick, 5 full)")
    parser.add_argument("--out", default="benches/results.json")
    parser.add_argument("--markdown", help="also write the tables as markdown (benches/RESULTS.md's form) here")
    parser.add_argument("--charts", default=str(CHARTS), help="folder for the SVG charts ('' for none)")
    args = parser.parse_args(argv)
    scale = "small" if args.quick else "full"
    seconds = args.seconds or (1.0 if args.quick else 5.0)
    names = [n for n in args.models.split(",") if n] if args.models is not None else list(MODELS)
    builders = [lambda n=n: MODELS[n](scale) for n in names]
    if args.real:
        from benches.real_models import REAL_MODELS

        builders += list(REAL_MODELS.values())
    rows = []
    with progress.live_progress():  # a live display on a terminal; the printed rows scroll above it
        for k, build in enumerate(builders):
            progress.step("bench", f"model {k + 1}/{len(builders)}", k, len(builders), depth=0)
            work = build()
            progress.step("bench", f"{work.name} ({k + 1}/{len(builders)})", k, len(builders), depth=0)
            rows.append(_row(work, seconds, args.no_prepare, args.target))
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''} "
        f"cpus={os.cpu_count()} jax={jax.__version__}",
        "target": args.target,
        "command": "python -m benches.run " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows))
    if args.charts:
        write_charts(lambda: draw_results(Path(args.out), Path(args.charts)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
