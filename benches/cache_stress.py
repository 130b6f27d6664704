"""Caches on shared storage (issue 41): processes of many threads writing one cache directory at once.

    python -m benches.cache_stress --processes 4 --threads 8 --seconds 60
    python -m benches.cache_stress --dir /mnt/nfs/eqsat-stress      # a directory of a network file system

Each thread, until the time is up, stores a plan (eqsat/plans/plan_store.py `save`) under a key every writer shares and
under one of its own, loads each back, and measures two kernels into the timing cache, one of its own and one
every writer shares (extract/timing.py `measure`, which saves the cache as planning does; a made-up device, its
timer a stub). The processes start together. Then the directory is read: every plan file must be whole (its digest
matching), the timing cache must hold every kernel any writer measured, no temporary file may be left, and no writer
may have warned (a cache reported unwritable), failed, or failed to load a plan it had just stored.
"""

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time
import warnings
from collections import Counter
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from eqsat.egraph.saturate import StopReason
from eqsat.extract import timing
from eqsat.extract.cost import Cost, load_profile, node_key
from eqsat.extract.plan import Plan, PlanNode
from eqsat.plans import plan_store
from eqsat.plans.plan_json import plan_from_dict
from eqsat.support.errors import EqsatWarning

DEVICE = "stress:shared"  # a made-up device: its timing cache is this bench's alone
SHARED = 4  # keys every writer writes (plans and kernels), beside each thread's own
_STARTUP_S = 120  # for the processes to import jax and meet


def _plan(inputs: int) -> Plan:
    """A plan of `inputs` inputs: plans of other sizes make files of other lengths, so that two writes mixed in one
    file would show."""
    node = PlanNode("Var", (), ("x",), (inputs,), "float32", Cost(), False)
    return Plan("cpu", [node] * inputs, [0], [], Cost(), Cost(), StopReason.NOT_PLANNED)


def _kernel(process: int, thread: int, n: int) -> timing.Wanted:
    """A kernel for the timing cache, its shape naming who measures it (0, 0: every writer)."""
    shape = (process, thread, n)
    return timing.Wanted(node_key("Dot", (), [shape], "float32"), "Dot", (), (shape,), "float32", ("float32",))


def _writer(process: int, thread: int, deadline: float, tally: Counter, measured: list[str]) -> None:
    """One thread's writes until the deadline: plans and kernels, shared and its own."""
    profile = load_profile("cpu")
    cache = timing.cache_for(DEVICE)

    def timer(wanted: timing.Wanted) -> float:
        measured.append(wanted.key)
        return 1e-3 * (1 + process)

    n = 0
    try:
        while time.monotonic() < deadline:
            for key in (f"shared-{n % SHARED}", f"p{process}-t{thread}-{n % SHARED}"):
                plan_store.save(key, _plan(1 + (n + thread) % 9), profile)
                tally["plans written"] += 1
                tally["plans not loaded back"] += plan_store.load(key, profile) is None
            kernels = [_kernel(process + 1, thread + 1, n), _kernel(0, 0, n % SHARED)]
            tally["timing caches written"] += timing.measure(cache, kernels, 60.0, timer)["measured"] > 0
            n += 1
    except Exception as error:  # reported, not raised: a thread's traceback would not reach the report
        tally["errors"] += 1
        tally[f"error: {type(error).__name__}: {error}"] += 1


def _process(directory: str, process: int, threads: int, seconds: float, start: Barrier, results: Any) -> None:
    """One process of `threads` writers, started with the others; puts its tallies, the kernels it measured and the
    warnings it raised on `results`."""
    os.environ["EQSAT_CACHE_DIR"] = directory
    os.environ["EQSAT_PLAN_STORE"] = "on"
    tallies = [Counter() for _ in range(threads)]
    measured: list[list[str]] = [[] for _ in range(threads)]
    with warnings.catch_warnings(record=True) as caught:  # set before the threads start: it records theirs too
        warnings.simplefilter("always")
        start.wait(timeout=_STARTUP_S)
        deadline = time.monotonic() + seconds
        writers = [
            threading.Thread(target=_writer, args=(process, t, deadline, tallies[t], measured[t]))
            for t in range(threads)
        ]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
    said = [str(w.message) for w in caught if issubclass(w.category, EqsatWarning)]
    results.put((sum(tallies, Counter()), [key for keys in measured for key in keys], said))


def run(directory: Path, processes: int, threads: int, seconds: float) -> dict[str, Any]:
    """Write `directory` from `processes` processes of `threads` threads each for `seconds`, then read it: counts of
    what was written and of what went wrong, and the first warnings and errors."""
    context = multiprocessing.get_context("spawn")  # fresh interpreters, as separate jobs would be
    start, results = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=_process, args=(str(directory), p, threads, seconds, start, results))
        for p in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        reports = [results.get(timeout=seconds + _STARTUP_S) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    tally = sum((t for t, _, _ in reports), Counter())
    measured = {key for _, keys, _ in reports for key in keys}
    said = [message for _, _, messages in reports for message in messages]
    corrupt, lost = _read_back(directory, measured)
    errors = [name for name in tally if name.startswith("error: ")]
    return {
        "files written": tally["plans written"] + tally["timing caches written"],
        "plans written": tally["plans written"],
        "timing caches written": tally["timing caches written"],
        "kernels measured": len(measured),
        "corrupt files": corrupt,
        "lost entries": lost,
        "temporary files left": len(list(directory.rglob("*.tmp"))),
        "plans not loaded back": tally["plans not loaded back"],
        "warnings": len(said),
        "errors": tally["errors"],
        "first problems": said[:3] + errors[:3],
    }


def _read_back(directory: Path, measured: set[str]) -> tuple[int, int]:
    """The corrupt files in the cache directory (plan files that do not parse or match their digest, plan files set
    aside, a timing cache that does not parse), and the measured kernels its timing cache lacks."""
    corrupt = len(list(directory.rglob("*.rejected")))
    for path in (directory / "plans").glob("*.json"):
        try:
            data = json.loads(path.read_bytes())
            content = {k: v for k, v in data.items() if k != "digest"}
            plan_from_dict(data["plan"])
            corrupt += data["digest"] != plan_store.content_digest(content)
        except (ValueError, KeyError, AttributeError):
            corrupt += 1
    try:
        stored = timing.parse((directory / "timing" / timing.cache_path(DEVICE).name).read_bytes(), "timing cache")
    except (OSError, ValueError):
        return corrupt + 1, len(measured)
    return corrupt, len(measured - stored.entries.keys())


def failed(report: dict[str, Any]) -> bool:
    wrong = ("corrupt files", "lost entries", "temporary files left", "plans not loaded back", "warnings", "errors")
    return any(report[name] for name in wrong)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8, help="writer threads per process")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--dir", type=Path, help="the cache directory to write (default: a new temporary one)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eqsat-cache-stress-") as scratch:
        directory = options.dir or Path(scratch)
        report = run(directory, options.processes, options.threads, options.seconds)
    for name, value in report.items():
        print(f"{name}: {value}")
    raise SystemExit(1 if failed(report) else 0)


if __name__ == "__main__":
    main()
