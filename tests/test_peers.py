"""benches/peers.py without torch: the message naming the extra, the bench's schedule and its table from fake
workers, and a worker's give-up on a long first call."""

import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from benches import peer_workers, peers

REPO = Path(__file__).resolve().parents[1]


def _lacking(*names: str):
    """find_spec as it answers where `names` are not installed."""
    return lambda name: None if name in names else object()


def test_missing_torch_is_one_line_naming_the_extra(monkeypatch, capsys):
    monkeypatch.setattr(peers.importlib.util, "find_spec", _lacking("torch", "torchvision"))
    assert peers.main(["--models", "MobileNetV3Small", "--modes", "eager,eqsat"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "benches.peers needs torch, torchvision: pip install -e .[peers]"


def test_jax_modes_alone_need_no_torch(monkeypatch):
    monkeypatch.setattr(peers.importlib.util, "find_spec", _lacking("torch", "torchvision"))
    assert peers.missing_extras(["jax", "eqsat"]) is None
    assert peers.missing_extras(["compile"]) == "benches.peers needs torch, torchvision: pip install -e .[peers]"
    monkeypatch.setattr(peers.importlib.util, "find_spec", _lacking("keras"))
    assert peers.missing_extras(["eqsat"]) == "benches.peers needs keras: pip install -e .[models]"


def test_unknown_model_is_refused():
    with pytest.raises(SystemExit):
        peers.main(["--models", "ResNet9000"])


class FakeWorkers:
    """Fixed results: torch.compile faster channels-last, max-autotune past the compile limit, eqsat ahead."""

    LATENCY_MS: ClassVar[dict[tuple[str, str], float]] = {
        ("eager", "contiguous"): 40.0,
        ("eager", "channels_last"): 30.0,
        ("compile", "contiguous"): 20.0,
        ("compile", "channels_last"): 10.0,
        ("jax", "native"): 50.0,
        ("eqsat", "native"): 8.0,
    }

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, mode: str, model: str, memory_format: str, settings: peer_workers.Settings) -> dict:
        self.calls.append((mode, model, memory_format))
        if mode == peer_workers.WARM_UP:
            return {"warmed": True}
        if mode == "max-autotune":
            return {"skipped": "torch.compile's max-autotune compile exceeded 600 s"}
        first = {"compile": 30.0, "eqsat": 6.0}.get(mode, 0.5)
        result = {"first_call_s": first, "median_ms": self.LATENCY_MS[mode, memory_format], "calls": 10}
        result["version"] = "torch 0.0" if mode in peer_workers.TORCH_MODES else "jax 0.0"
        if mode == "eqsat":
            result["plan"] = {"runs": "plan", "guard_ratio": 3.0, "fallback": None}
        return result


def test_schedule_alternates_modes_and_does_not_retry_a_skip(capsys):
    fake = FakeWorkers()
    rows = peers.run_bench(["MobileNetV2"], list(peer_workers.MODES), peer_workers.Settings(), 2, runner=fake)
    per_round = [(m, f) for m in peer_workers.MODES for f in peers.formats_of(m)]
    assert [r["round"] for r in rows] == [1] * len(per_round) + [2] * len(per_round)
    assert [(r["mode"], r["format"]) for r in rows] == per_round * 2
    autotuned = [c for c in fake.calls if c[0] == "max-autotune"]
    assert autotuned == [
        ("max-autotune", "MobileNetV2", "contiguous"),
        ("max-autotune", "MobileNetV2", "channels_last"),
    ]
    assert "earlier round" in rows[-3]["skipped"]  # round 2's max-autotune, channels_last
    assert "round 2 MobileNetV2 eqsat native: 8.00 ms" in capsys.readouterr().err


def test_table_takes_the_faster_format_and_the_best_compile_mode():
    modes = list(peer_workers.MODES)
    rows = peers.run_bench(["MobileNetV2"], modes, peer_workers.Settings(), 2, runner=FakeWorkers())
    best = peers.best_per_round(rows, "MobileNetV2", "compile")
    assert [(r["format"], r["median_ms"]) for r in best] == [("channels_last", 10.0)] * 2
    speedups, ready, best_modes = peers.eqsat_against_compile(rows, "MobileNetV2")
    assert speedups == [10.0 / 8.0] * 2 and ready == [6.0 / 30.0] * 2 and best_modes == ["default"] * 2

    text = peers.table(rows, ["MobileNetV2"], modes)
    header, rule, line = text.strip().splitlines()
    assert header.split(" | ")[1:3] == ["torch eager", "torch.compile"]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "MobileNetV2"
    assert cells[1] == "30.0 / 30.0 ms (first call 0.50 / 0.50 s; channels_last)"
    assert cells[2] == "10.0 / 10.0 ms (first call 30 / 30 s; channels_last)"
    assert cells[3] == "not run: torch.compile's max-autotune compile exceeded 600 s"
    assert cells[4] == "50.0 / 50.0 ms (first call 0.50 / 0.50 s)"
    assert cells[5] == "8.0 / 8.0 ms (plan ready 6.0 / 6.0 s; plan runs)"
    assert cells[6] == "1.25x / 1.25x as fast as default; plan ready in 0.20 / 0.20 of the compile time"
    assert rule.count("|---") == len(cells)


def test_no_ratio_without_both_sides():
    rows = peers.run_bench(["ConvNeXtTiny"], ["eager", "jax"], peer_workers.Settings(), 1, runner=FakeWorkers())
    text = peers.table(rows, ["ConvNeXtTiny"], ["eager", "jax"])
    assert "eqsat vs" not in text and text.count("|---") == 3


def test_a_first_call_past_the_limit_is_reported_as_skipped():
    code = (
        "import time; from benches.peer_workers import until_ready; "
        "until_ready(lambda: time.sleep(30), 0.2, 'torch.compile max-autotune'); print('not reached')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0
    assert json.loads(done.stdout) == {"skipped": "torch.compile max-autotune exceeded 0.2 s"}


def test_latency_is_a_median_of_at_least_the_minimum_calls():
    median, calls = peer_workers.latency_ms(lambda: None, seconds=0.0)
    assert calls == peer_workers.MIN_CALLS and 0 <= median < 1


def test_warm_up_runs_once_before_the_rounds_and_reports_a_failure(capsys):
    calls = []

    def failing(mode: str, model: str, memory_format: str, settings: peer_workers.Settings) -> dict:
        calls.append((mode, model, memory_format))
        return {"error": "no C++ compiler"}

    peers.warm_up_torch(peer_workers.Settings(), runner=failing)
    assert calls == [(peer_workers.WARM_UP, "-", "native")]
    assert "torch.compile's warm-up failed: no C++ compiler" in capsys.readouterr().err


def test_a_worker_without_an_answer_says_why():
    assert peers._answer(0, 'warming\n{"median_ms": 2.0}\n', "") == {"median_ms": 2.0}
    failed = peers._answer(1, "", "Traceback ...\nModuleNotFoundError: No module named 'keras'\n")
    assert failed == {"error": "exit status 1: ModuleNotFoundError: No module named 'keras'"}
    assert peers._answer("worker ran past 1500 s", "", "") == {"error": "worker ran past 1500 s"}


def test_main_prints_and_saves_the_table(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(peers.importlib.util, "find_spec", _lacking())
    fake = FakeWorkers()
    monkeypatch.setattr(peers, "warm_up_torch", lambda settings: fake(peer_workers.WARM_UP, "-", "native", settings))
    bench = peers.run_bench
    monkeypatch.setattr(peers, "run_bench", lambda *args: bench(*args, runner=fake))
    saved = tmp_path / "peers.json"
    argv = ["--models", "MobileNetV3Small", "--modes", "compile,eqsat", "--rounds", "1", "--json", str(saved)]
    assert peers.main([*argv, "--batch", "1", "--size", "96"]) == 0
    assert fake.calls[0] == (peer_workers.WARM_UP, "-", "native")  # before any measurement
    printed = capsys.readouterr().out
    result = json.loads(saved.read_text())
    assert result["table"] in printed and result["caption"] in printed
    assert "jax 0.0, torch 0.0: batch 1, 96x96, 2 threads, 1 round(s)" in result["caption"]
    assert result["settings"]["size"] == 96 and len(result["rows"]) == 3
    assert "| MobileNetV3Small | 10.0 ms (first call 30 s; channels_last) | 8.0 ms" in result["table"]
