"""Multi-host JAX on this machine: 2 and 4 processes started with jax.distributed on localhost (CPU, gloo), each
optimizing the same program over global arrays (tests/multihost_programs.py). In every mix of plan states each run
finishes within its timeout, gives jax.jit's results, and every process runs the same program at every call
(EQSAT_CHECK_LOCKSTEP gathers a fingerprint of what each call ran and raises where the processes differ)."""

import socket
from pathlib import Path

import pytest

from tests.multihost_programs import launch

TIMEOUT = 240.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run(tmp_path: Path, case: str, caches: list[str], extra: tuple = (), env: dict | None = None) -> list[dict]:
    dirs = [tmp_path / name for name in caches]
    return launch(len(caches), case, dirs, _port(), TIMEOUT, ["--size=64", *extra], env)


def _agree(reports: list[dict], tolerance: float = 1e-5) -> None:
    """Every process: results as jax.jit's at every call, and the same plan as process 0."""
    for report in reports:
        assert len(report["differences"]) == 3 and max(report["differences"]) <= tolerance, report
        assert (report["rewritten"], report["fallback"]) == (reports[0]["rewritten"], reports[0]["fallback"])


@pytest.mark.parametrize("case", ["sum", "train", "tp"])
def test_cold_processes_with_caches_of_their_own_run_one_plan(tmp_path: Path, case: str) -> None:
    reports = _run(tmp_path, case, ["host0", "host1"])
    _agree(reports)
    assert reports[0]["rewritten"] and reports[0]["fallback"] is None  # each case has a plan that runs


@pytest.mark.parametrize("case", ["sum", "train", "tp"])
def test_four_processes_sharing_one_cache_run_one_plan(tmp_path: Path, case: str) -> None:
    reports = _run(tmp_path, case, ["shared"] * 4)
    _agree(reports)
    assert reports[0]["rewritten"] and reports[0]["fallback"] is None
    if case == "sum":
        assert reports[0]["rewritten"] == {"Add": 11, "Dot": 1}  # sum(x @ b for b in B) as x @ sum(B)


def test_parameters_prepared_in_every_process_run_one_plan(tmp_path: Path) -> None:
    """The tensor-parallel projections with their weights prepared (x @ (w1 + w2), the sum computed once)."""
    reports = _run(tmp_path, "tp", ["a", "b"], ("--prepared",))
    _agree(reports)
    assert reports[0]["rewritten"] and reports[0]["fallback"] is None


def test_a_host_with_another_eqsat_runs_the_original_with_every_other(tmp_path: Path) -> None:
    """Process 1's eqsat is another version: it cannot take process 0's plan, so no process runs it."""
    reports = _run(tmp_path, "sum", ["a", "b"], env={1: {"TEST_OTHER_VERSION": "1"}})
    _agree(reports)
    assert "process 1 cannot run process 0's plan (made by eqsat" in reports[0]["fallback"]


def test_a_host_with_a_stored_plan_beside_a_cold_one(tmp_path: Path) -> None:
    """The case that crashed one process and hung the other: process 0 loads its stored plan, process 1 is new."""
    _run(tmp_path, "sum", ["host0", "host1"])
    assert list((tmp_path / "host0" / "plans").glob("*.json"))  # process 0 kept its plan
    assert not (tmp_path / "host1" / "plans").exists()  # the others keep none: process 0 decides
    _agree(_run(tmp_path, "sum", ["host0", "new"]))
    _agree(_run(tmp_path, "sum", ["new0", "host0"]))  # and a cold process 0 beside a warm process 1


def test_a_guard_that_disagrees_between_processes_refuses_the_plan_everywhere(tmp_path: Path) -> None:
    """Process 1's clock says the plan is 50x slower: the slowest process's rounds decide, in both (slower, or on a
    loaded machine where a round's hiccup keeps the tests from deciding, undecided with the median 50x slower)."""
    guard = {"EQSAT_GUARD_SECONDS": "1"}
    reports = _run(tmp_path, "sum", ["a", "b"], env={0: guard, 1: {**guard, "EQSAT_TEST_PLAN_CLOCK": "50"}})
    _agree(reports)
    assert reports[0]["guard"] == reports[1]["guard"] in ("slower", "undecided")
    assert "the original runs" in reports[0]["fallback"]


def test_planning_in_the_background_lands_at_the_same_call_everywhere(tmp_path: Path) -> None:
    background = {"EQSAT_BACKGROUND": "1", "EQSAT_GUARD_SECONDS": "0.3"}
    reports = _run(tmp_path, "sum", ["a", "b"], env={0: background, 1: background})
    _agree(reports)
    assert reports[0]["guard"] in ("faster", "undecided")


@pytest.mark.parametrize("where", ["global", "local"])
def test_a_rule_wrong_on_one_process_values_is_refused_in_every_process(tmp_path: Path, where: str) -> None:
    """max(x, 0) -> x is wrong where x < 0: only process 1's shard (global) or its own values (local) hold such."""
    reports = _run(tmp_path, "rule", ["a", "b"], ("--local",) if where == "local" else ())
    for report in reports:
        assert max(report["differences"]) == 0.0 and "differed from the original" in report["fallback"], report
    assert "max-is-left" in reports[1]["fallback"]  # the process that saw it names the rule


def test_two_processes_split_the_kernel_measurements_and_both_keep_them(tmp_path: Path) -> None:
    """Issue 41 item 5: six depthwise convolutions, each measured against its shifted-sum form: each process
    measures the rivals of three, and both timing caches end with all twelve kernels."""
    reports = _run(tmp_path, "conv", ["host0", "host1"], ("--size=128",))
    _agree(reports)
    assert {k: reports[0]["measured"][k] for k in ("measured", "measured_elsewhere")} == {
        "measured": 6.0,
        "measured_elsewhere": 6.0,
    }
    assert [r["kernels_kept"] for r in reports] == [12, 12]


def test_the_lockstep_check_stops_processes_that_ran_different_programs(tmp_path: Path) -> None:
    """EQSAT_CHECK_LOCKSTEP is a check that can fail: a process that reports another program stops both."""
    with pytest.raises(RuntimeError, match="the processes ran different programs at one call"):
        _run(tmp_path, "sum", ["a", "b"], env={1: {"TEST_OTHER_PROGRAM": "1"}})
