"""SVG charts of the benchmark results, for benches/RESULTS.md: speed-up per model against jax.jit with its
interquartile range and Tensat's published gain beside it, optimization time per model (Tensat's beside it), and
the cost model's predicted against measured times (benches/fidelity.json).

    python -m benches.charts [--results benches/results.json ...] [--fidelity benches/fidelity.json]
                             [--out benches/charts]

matplotlib is a benches-only dependency (the `charts` extra); benches.run and benches.fidelity draw their charts
with it when it is installed.
"""

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Tensat's reported gains over the original graph on GPU and its optimization times in seconds (its paper, MLSys 2021)
TENSAT_SPEEDUP = {
    "bert": 1.092,
    "nasrnn": 1.689,
    "resnext50": 1.088,
    "nasnet_a": 1.073,
    "inception_v3": 1.100,
    "squeezenet": 1.245,
    "vgg19": 1.089,
}
TENSAT_OPTIMIZE_S = {
    "bert": 1.4,
    "nasrnn": 0.5,
    "resnext50": 0.7,
    "nasnet_a": 10.6,
    "inception_v3": 5.1,
    "squeezenet": 0.3,
    "vgg19": 0.4,
}
CHARTS = Path("benches/charts")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("svg")
    matplotlib.rcParams.update({"svg.hashsalt": "eqsat", "svg.fonttype": "none", "font.size": 9})
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})  # the same data, the same file
    _pyplot().close(fig)
    return path


def _family(model: str) -> str:
    """bert-full -> bert: the model a published anchor is keyed by."""
    return model.rsplit("-", 1)[0] if model.endswith(("-full", "-small")) else model


def speedup_chart(result: dict[str, Any], path: Path) -> Path:
    """Measured speed-up against jax.jit per model (median, interquartile range as a bar), the cost model's
    prediction, and Tensat's published GPU gain where there is one."""
    plt = _pyplot()
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7.5, 0.28 * len(rows) + 1.2))
    for y, row in enumerate(reversed(rows)):
        low, high = row["measured_iqr"]
        ax.plot([low, high], [y, y], color="#1f77b4", linewidth=5, alpha=0.35, solid_capstyle="butt")
        ax.plot(row["measured_speedup"], y, "o", color="#1f77b4", label="measured (median, IQR)" if not y else None)
        ax.plot(row["predicted_speedup"], y, "|", color="#555", markersize=9, label="predicted" if not y else None)
        anchor = TENSAT_SPEEDUP.get(_family(row["model"]))
        if anchor:
            ax.plot(anchor, y, "D", color="#e07b00", markersize=4, label="Tensat (GPU, published)")
    labels = [f"{row['model']}{'' if row.get('prepared', True) else ' (plain)'}" for row in reversed(rows)]
    ax.set_yticks(range(len(rows)), labels)
    ax.axvline(1.0, color="#999", linewidth=0.8)
    ax.set_xscale("log")
    ticks = [t for t in (0.5, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10, 30, 100, 300) if _within(ax, t)]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("speed-up over jax.jit (jax.jit time / eqsat time, same process, interleaved)")
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), loc="lower right", fontsize=8)
    ax.set_title(_provenance(result), fontsize=7)
    return _save(fig, path)


def _within(ax: Any, value: float) -> bool:
    low, high = ax.get_xlim()
    return low <= value <= high


def _provenance(result: dict[str, Any]) -> str:
    return f"{result['command']}\n{result['date']}, {result['machine']}"


def optimize_time_chart(result: dict[str, Any], path: Path) -> Path:
    """eqsat's optimization time per model, Tensat's published one beside it."""
    plt = _pyplot()
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7.5, 0.28 * len(rows) + 1.2))
    ys = range(len(rows))
    ax.barh([y + 0.18 for y in ys], [row["optimize_s"] for row in reversed(rows)], 0.36, label="eqsat")
    tensat = [TENSAT_OPTIMIZE_S.get(_family(row["model"]), 0) for row in reversed(rows)]
    ax.barh([y - 0.18 for y in ys], tensat, 0.36, color="#e07b00", label="Tensat (published)")
    ax.set_yticks(list(ys), [row["model"] for row in reversed(rows)])
    ax.set_xscale("log")
    ax.set_xlabel("optimization time, s")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(_provenance(result), fontsize=7)
    return _save(fig, path)


def fidelity_chart(fidelity: dict[str, Any], path: Path) -> Path:
    """The cost model's predicted time against the measured time of every candidate plan (log-log)."""
    plt = _pyplot()
    rows = fidelity["rows"]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    rewritten = [r for r in rows if r["rewritten"]]
    original = [r for r in rows if not r["rewritten"]]
    for subset, name, color in ((original, "original program", "#999"), (rewritten, "rewritten plan", "#1f77b4")):
        ax.scatter([r["measured_s"] for r in subset], [r["predicted_s"] for r in subset], s=14, c=color, label=name)
    values = [v for r in rows for v in (r["measured_s"], r["predicted_s"]) if v > 0]
    span = [min(values) / 2, max(values) * 2]
    ax.plot(span, span, color="#555", linewidth=0.8, linestyle="--", label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured s")
    ax.set_ylabel("predicted s")
    ax.set_title(
        f"{fidelity['plans']} plans, Spearman rank correlation {fidelity['spearman']:.3f}\n{_provenance(fidelity)}",
        fontsize=7,
    )
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


def draw_results(path: Path, out: Path = CHARTS) -> list[Path]:
    """The speed-up and optimization-time charts of a results file (benches.run's JSON), named after it:
    results.json -> results_speedup.svg, results_optimize_time.svg."""
    result = json.loads(path.read_text())
    return [
        speedup_chart(result, out / f"{path.stem}_speedup.svg"),
        optimize_time_chart(result, out / f"{path.stem}_optimize_time.svg"),
    ]


def draw_fidelity(path: Path, out: Path = CHARTS) -> Path:
    return fidelity_chart(json.loads(path.read_text()), out / f"{path.stem}.svg")


def write_charts(draw: Callable[[], Path | list[Path]]) -> None:
    """Run a harness's chart step and say what it wrote, or that matplotlib (the `charts` extra) is missing."""
    try:
        written = draw()
    except ImportError as error:
        print(f"no charts: {error.name} is not installed (pip install -e '.[charts]')")
        return
    for path in written if isinstance(written, list) else [written]:
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.charts", description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs="*", default=["benches/results.json"], help="benches.run JSON files")
    parser.add_argument("--fidelity", default="benches/fidelity.json", help="benches.fidelity JSON ('' for none)")
    parser.add_argument("--out", default=str(CHARTS), help="folder the SVG files go to")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for results in args.results:
        write_charts(lambda results=results: draw_results(Path(results), out))
    if args.fidelity:
        write_charts(lambda: draw_fidelity(Path(args.fidelity), out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
