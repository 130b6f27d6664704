"""Caches on shared storage (issue 41): threads and processes writing one cache directory, the same keys and
different ones, leave every file whole, lose no timing and warn of nothing."""

import json
import threading
import warnings

from benches import cache_stress
from eqsat.extract import cost, timing
from eqsat.support.errors import EqsatWarning

THREADS = 8


def _in_threads(work, count: int = THREADS) -> list[str]:
    """Run work(k) in `count` threads at once; the EqsatWarnings they raised."""
    with warnings.catch_warnings(record=True) as caught:  # global: records the threads' warnings too
        warnings.simplefilter("always")
        threads = [threading.Thread(target=work, args=(k,)) for k in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return [str(w.message) for w in caught if issubclass(w.category, EqsatWarning)]


def test_threads_writing_one_file_leave_it_whole(tmp_path, monkeypatch):
    """Threads of one process shared a temporary file (named by the process id): a rename failed ("No such file or
    directory: '<key>.json.15068.tmp' -> '<key>.json'") and warned that the cache was unwritable, and two writes
    mixed in one file left it two JSON documents long."""
    monkeypatch.setattr(cost, "_UNWRITABLE", [])  # as in a fresh process: a failure warns
    path = tmp_path / "plans" / "shared.json"
    kept: list[bool] = []

    def write(k: int) -> None:
        for n in range(200):
            kept.append(cost.keep_cache_file(path, json.dumps({"writer": k, "pad": "x" * (n % 7 * 100 + k)})))

    assert _in_threads(write) == []
    assert all(kept) and len(kept) == THREADS * 200
    assert json.loads(path.read_text())["writer"] in range(THREADS)
    assert [p.name for p in path.parent.iterdir()] == ["shared.json"]  # no temporary file left


def test_timing_caches_saved_at_once_keep_every_entry(tmp_path):
    """Each writer (a cache of its own, as each process holds one) saves what it measured: the file holds every
    entry any of them measured, not the last writer's alone."""
    path = tmp_path / "timing" / "shared.json"
    caches = [timing.TimingCache("cpu:shared", timing.versions(), path=path) for _ in range(THREADS)]
    measured = set()

    def save(k: int) -> None:
        for n in range(25):
            key = cost.node_key("Dot", (), [(k, n)], "float32")
            with caches[k].lock:
                caches[k].entries[key] = 1e-3
            measured.add(key)
            caches[k].save()

    assert _in_threads(save) == []
    stored = timing.parse(path.read_bytes(), str(path))
    assert measured - stored.entries.keys() == set() and len(measured) == THREADS * 25


def test_processes_of_threads_share_one_cache_directory(tmp_path):
    """Three processes of four threads, storing plans (plan_store.save, loaded back) and measuring kernels (the
    timing cache's measure and save) under shared keys and their own, for two seconds (benches/cache_stress.py;
    each process waited for within a timeout)."""
    report = cache_stress.run(tmp_path, processes=3, threads=4, seconds=2)
    assert report["plans written"] > 0 and report["kernels measured"] > 0
    assert not cache_stress.failed(report), report
