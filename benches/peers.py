"""eqsat against the peer a user would pick instead: torch eager, torch.compile (default and max-autotune), jax.jit
and eqsat on the same four CNNs, side by side.

    python -m benches.peers                       # four CNNs, batch 2, 224x224, 2 threads, 2 rounds of 5 s each
    python -m benches.peers --models MobileNetV3Small --modes eager,compile,jax,eqsat --batch 1 --size 96 \\
        --rounds 1 --seconds 1                    # a smoke run
    python -m benches.peers --json peers.json     # the rows and the table saved

Needs the optional extras `peers` (torch, torchvision) and `models` (keras): `pip install -e .[peers,models]`.
torch runs torchvision's models, JAX and eqsat keras.applications' (KERAS_BACKEND=jax), all with random weights.

Every measurement runs in its own process (`--worker`), one after another, the frameworks alternating within each
round, each pinned to `--threads` CPUs. Each worker starts with empty caches of what is kept per model (torch
inductor's cache, eqsat's timing cache and stored plans), so its first call is a cold compile; what is kept once per
machine is not (inductor's precompiled torch headers, built by a warm-up before the rounds; eqsat's calibrated
profiles). A torch mode runs once per memory format (contiguous,
channels_last) and reports the faster. eqsat's first call lasts until its plan is ready: built, validated and
settled by the guard (eqsat.tools.versus.settled), so the timed calls run what runs from then on.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benches.peer_workers import (
    MEMORY_FORMATS,
    MODELS,
    MODES,
    TORCH_COMPILE_MODES,
    TORCH_MODES,
    WARM_UP,
    Settings,
    worker_main,
)

REPO = Path(__file__).resolve().parents[1]
TITLES = {
    "eager": "torch eager",
    "compile": "torch.compile",
    "max-autotune": "torch.compile max-autotune",
    "jax": "jax.jit",
    "eqsat": "eqsat",
}
WORKER_SLACK_S = 900.0  # a worker's imports and model building, beyond its compile limit and timed calls
BUSY_LOAD = 0.5
# measured on a 2-core machine with both cores busy: MobileNetV3Small eager at 2 threads 7-658 ms, at 1 thread 2.7 ms
BUSY_WARNING = "the machine is busy; torch's OpenMP threads wait on each other at every op, so its times will jump"
Row = dict[str, Any]
Runner = Callable[[str, str, str, Settings], Row]


def missing_extras(modes: Iterable[str]) -> str | None:
    """One line naming what the selected modes need and lack, and the extra that installs it; None if nothing."""
    needed = {"torch": "peers", "torchvision": "peers"} if set(modes) & set(TORCH_MODES) else {}
    if set(modes) - set(TORCH_MODES):
        needed["keras"] = "models"
    lacking = [name for name in needed if importlib.util.find_spec(name) is None]
    if not lacking:
        return None
    extras = ",".join(sorted({needed[name] for name in lacking}))
    return f"benches.peers needs {', '.join(lacking)}: pip install -e .[{extras}]"


def formats_of(mode: str) -> tuple[str, ...]:
    """The memory formats a mode is measured in: torch's both, JAX's its own (keras's NHWC)."""
    return MEMORY_FORMATS if mode in TORCH_MODES else ("native",)


def _worker_command(mode: str, model: str, memory_format: str, settings: Settings) -> list[str]:
    return [
        sys.executable, "-m", "benches.peers", "--worker", mode, model, "--format", memory_format,
        "--batch", str(settings.batch), "--size", str(settings.size), "--seconds", str(settings.seconds),
        "--threads", str(settings.threads), "--max-compile", str(settings.max_compile),
    ]  # fmt: skip


def run_worker(mode: str, model: str, memory_format: str, settings: Settings) -> Row:
    """One measurement in a fresh process with empty caches; its JSON line, or why there is none."""
    caches = Path(tempfile.mkdtemp(prefix="peers-"))
    _keep_calibration(caches / "eqsat")
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "EQSAT_CACHE_DIR": str(caches / "eqsat"),
    }
    limit = settings.max_compile + 3 * settings.seconds + WORKER_SLACK_S
    # output to files, not pipes: a worker that gives up exits while its compile workers still hold its output open;
    # its own session, so that those end with it
    with open(caches / "out", "w") as out, open(caches / "err", "w") as err:
        worker = subprocess.Popen(
            _worker_command(mode, model, memory_format, settings),
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            status: int | str = worker.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            status = f"worker ran past {limit:.0f} s"
        finally:
            _end_group(worker.pid)
            worker.wait()
    try:
        return _answer(status, (caches / "out").read_text(), (caches / "err").read_text())
    finally:
        shutil.rmtree(caches, ignore_errors=True)


def _answer(status: int | str, out: str, err: str) -> Row:
    """The worker's JSON line; else its exit status and last line of errors."""
    answers = [line for line in out.splitlines() if line.startswith("{")]
    if status == 0 and answers:
        return json.loads(answers[-1])
    last = err.strip().splitlines()[-1] if err.strip() else ""
    why = status if isinstance(status, str) else f"exit status {status}"
    return {"error": f"{why}: {last[:200]}" if last else why}


def _keep_calibration(cache: Path) -> None:
    """eqsat's calibrated device profiles (`python -m eqsat calibrate`) are per machine, like torch's precompiled
    headers, and kept; its timing cache and stored plans are per model, and start empty."""
    from eqsat.extract.cost import cache_dir

    if (cache_dir() / "profiles").is_dir():
        shutil.copytree(cache_dir() / "profiles", cache / "profiles")


def warm_up_torch(settings: Settings, runner: Runner = run_worker) -> None:
    """Build torch inductor's precompiled headers before any measurement: once per machine, for every model."""
    print("warming up torch.compile (its precompiled headers, once per machine)", file=sys.stderr, flush=True)
    result = runner(WARM_UP, "-", "native", settings)
    if "error" in result:
        print(f"torch.compile's warm-up failed: {result['error']}", file=sys.stderr, flush=True)


def _end_group(pgid: int) -> None:
    """End what the worker left of its process group (inductor's compile workers), by the group's id."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def run_bench(
    models: list[str], modes: list[str], settings: Settings, rounds: int, runner: Runner = run_worker
) -> list[Row]:
    """Every (model, mode, memory format) once per round, the modes alternating within a model. A measurement
    skipped for its compile time is not tried again in later rounds."""
    rows: list[Row] = []
    skipped: dict[tuple[str, str, str], str] = {}
    for round_number in range(1, rounds + 1):
        for model in models:
            for mode in modes:
                for memory_format in formats_of(mode):
                    key = (model, mode, memory_format)
                    if key in skipped:
                        result: Row = {"skipped": f"{skipped[key]} (in an earlier round)"}
                    else:
                        result = runner(mode, model, memory_format, settings)
                    if "skipped" in result:
                        skipped.setdefault(key, result["skipped"])
                    row = {"round": round_number, "model": model, "mode": mode, "format": memory_format, **result}
                    print(_progress(row), file=sys.stderr, flush=True)
                    rows.append(row)
    return rows


def _progress(row: Row) -> str:
    where = f"round {row['round']} {row['model']} {row['mode']} {row['format']}"
    if "median_ms" in row:
        return f"{where}: {row['median_ms']:.2f} ms, first call {row['first_call_s']:.1f} s"
    return f"{where}: {row.get('skipped') or row.get('error')}"


def best_per_round(rows: list[Row], model: str, mode: str) -> list[Row]:
    """Per round, the mode's fastest memory format; where none was measured, why (a skip or an error)."""
    best = []
    for round_number in sorted({row["round"] for row in rows}):
        tried = [r for r in rows if (r["round"], r["model"], r["mode"]) == (round_number, model, mode)]
        measured = [r for r in tried if "median_ms" in r]
        if measured:
            best.append(min(measured, key=lambda r: r["median_ms"]))
        elif tried:
            best.append(tried[0])
    return best


def _seconds(values: list[float]) -> str:
    """Seconds per round, to two significant digits or the whole second."""
    return " / ".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" if v >= 1 else f"{v:.2f}" for v in values) + " s"


def _joined(values: list[str]) -> str:
    """Values per round; one where they all agree."""
    return values[0] if len(set(values)) == 1 else " / ".join(values)


def cell(best: list[Row]) -> str:
    """A mode's latency per round, its first call (compile; eqsat: until the plan is ready), and its memory format
    or what ran after eqsat's guard."""
    measured = [r for r in best if "median_ms" in r]
    if not measured:
        return "not run: " + (best[0].get("skipped") or best[0].get("error", "?")) if best else ""
    latency = " / ".join(f"{r['median_ms']:.1f}" if "median_ms" in r else "-" for r in best) + " ms"
    first = _seconds([r["first_call_s"] for r in measured])
    if measured[0]["mode"] == "eqsat":
        runs = _joined([r.get("plan", {}).get("runs", "?") for r in measured])
        return f"{latency} (plan ready {first}; {runs} runs)"
    formats = _joined([r["format"] for r in measured])
    note = "" if formats == "native" else f"; {formats}"
    return f"{latency} (first call {first}{note})"


def eqsat_against_compile(rows: list[Row], model: str) -> tuple[list[float], list[float], list[str]]:
    """Per round where both ran: torch.compile's best mode's latency over eqsat's (above 1: eqsat faster), eqsat's
    plan-ready time over that mode's cold compile (below 0.5: ready in under half the time), and which mode it was."""
    eqsat = {r["round"]: r for r in best_per_round(rows, model, "eqsat") if "median_ms" in r}
    speedups, ready, modes = [], [], []
    for round_number, ours in sorted(eqsat.items()):
        theirs = [
            r
            for mode in TORCH_COMPILE_MODES
            for r in best_per_round(rows, model, mode)
            if r["round"] == round_number and "median_ms" in r
        ]
        if theirs:
            fastest = min(theirs, key=lambda r: r["median_ms"])
            speedups.append(fastest["median_ms"] / ours["median_ms"])
            ready.append(ours["first_call_s"] / fastest["first_call_s"])
            modes.append(TORCH_COMPILE_MODES[fastest["mode"]] or "default")
    return speedups, ready, modes


def versus_cell(speedups: list[float], ready: list[float], modes: list[str]) -> str:
    """eqsat's speed against torch.compile's best mode per round, and its plan-ready time as a share of the compile."""
    if not speedups:
        return "-"
    times = " / ".join(f"{s:.2f}x" for s in speedups)
    shares = " / ".join(f"{r:.2f}" for r in ready)
    return f"{times} as fast as {_joined(modes)}; plan ready in {shares} of the compile time"


def table(rows: list[Row], models: list[str], modes: list[str]) -> str:
    """The markdown table: a row per model, a column per mode, and eqsat against torch.compile's best mode."""
    versus = "eqsat" in modes and bool(set(modes) & set(TORCH_COMPILE_MODES))
    header = [TITLES[m] for m in modes] + ["eqsat vs torch.compile's best mode"] * versus
    lines = ["| model | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for model in models:
        cells = [cell(best_per_round(rows, model, mode)) for mode in modes]
        if versus:
            cells.append(versus_cell(*eqsat_against_compile(rows, model)))
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    """The CPU's model name and count, for the table's caption."""
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    return f"{names[0] if names else cpu}, {os.cpu_count()} CPUs"


def caption(settings: Settings, rounds: int, load_before: float, rows: list[Row]) -> str:
    """Date, machine, load, versions and settings: what a table in RESULTS.md says it was measured under."""
    versions = ", ".join(sorted({row["version"] for row in rows if "version" in row}))
    return (
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {machine()}, load average {load_before:.1f} before "
        f"the run, {versions or 'no versions reported'}: batch {settings.batch}, {settings.size}x{settings.size}, "
        f"{settings.threads} threads, {rounds} round(s) of {settings.seconds:g} s per measurement; latency per round "
        "(median), first call = cold compile (eqsat: until its plan is ready)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benches.peers", description=__doc__.splitlines()[0])
    defaults = Settings()
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="timed calls per measurement, s")
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--size", type=int, default=defaults.size, help="image height and width")
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument(
        "--max-compile", type=float, default=defaults.max_compile, help="a longer first call is skipped, s"
    )
    parser.add_argument("--json", type=Path, help="save the rows and the table here")
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "MODEL"), help=argparse.SUPPRESS)  # one measurement
    parser.add_argument("--format", default="native", choices=(*MEMORY_FORMATS, "native"), help=argparse.SUPPRESS)
    return parser


def _chosen(parser: argparse.ArgumentParser, given: str, known: Iterable[str], what: str) -> list[str]:
    chosen = [name.strip() for name in given.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        parser.error(f"unknown {what}: {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    settings = Settings(args.batch, args.size, args.seconds, args.threads, args.max_compile)
    if args.worker:
        return worker_main(*args.worker, args.format, settings)
    models = _chosen(parser, args.models, MODELS, "models")
    modes = _chosen(parser, args.modes, MODES, "modes")
    if missing := missing_extras(modes):
        print(missing, file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    if load_before > BUSY_LOAD:
        print(f"load average {load_before:.1f}: {BUSY_WARNING}", file=sys.stderr, flush=True)
    if set(modes) & set(TORCH_COMPILE_MODES):
        warm_up_torch(settings)
    rows = run_bench(models, modes, settings, args.rounds)
    text = table(rows, models, modes)
    title = caption(settings, args.rounds, load_before, rows)
    print(f"\n{title}\n\n{text}")
    if args.json:
        saved = {"caption": title, "settings": asdict(settings), "rows": rows, "table": text}
        args.json.write_text(json.dumps(saved, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
