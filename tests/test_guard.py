"""Never slower than jax.jit: a plan is timed against the original after validation; measured slower with
confidence it is refused, faster it is kept, undecided it runs where the cost model predicts a clear gain."""

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.numerics import guard
from eqsat.numerics.measure import Comparison
from eqsat.plans.plan_life import Event, State

GUARDED = eqsat.Limits(guard_seconds=0.05, measure_seconds=0)


def _chain() -> Any:
    """(A @ B) @ v, a new function each time: plans are shared by every optimize() of one function."""
    return lambda a, b, v: (a @ b) @ v


def _args(n: int) -> list[Any]:
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((n, n), (n, n), (n, 2))]


def _clock(monkeypatch: pytest.MonkeyPatch, ratios: list[float]) -> list[int]:
    """A fake clock: every measurement's rounds give these ratios (original time / plan time), stopping where
    the sequential test decides."""
    calls = []

    def interleaved(baseline: Any, candidate: Any, args: tuple, seconds: float, decided: Any, **_: Any) -> Comparison:
        calls.append(1)
        baseline(), candidate()  # both run, as the real measurement runs them
        rounds = next((ratios[:n] for n in range(3, len(ratios)) if decided(ratios[:n])), ratios)
        return Comparison.of([1e-3] * len(rounds), [1e-3 / r for r in rounds], rounds)

    monkeypatch.setattr(guard, "interleaved", interleaved)
    return calls


NOISY = [0.8, 1.3, 1.1, 0.9, 1.4, 1.2, 0.95, 1.25, 1.05, 0.85]  # 6 of 10 faster: a coin could do that
# within one round's noise (guard.CLEAR_RATIO): only the count of rounds decides, at 7 of 7
SLOWER = [0.8, 0.85, 0.9, 0.95, 0.8, 0.85, 0.8, 0.7, 0.9, 0.8]
FASTER = [1.15, 1.2, 1.1, 1.25, 1.3, 1.15, 1.2, 1.1, 1.2, 1.15]
CLEARLY_FASTER = [5.5, 5.7, 5.8, 5.6, 5.9, 5.4, 5.7, 5.5, 5.6, 5.8]  # MobileNetV2's plan: decided by its size


def test_a_plan_measured_slower_with_confidence_is_dropped_and_says_what_was_measured(monkeypatch):
    calls = _clock(monkeypatch, SLOWER)
    fast = eqsat.optimize(_chain(), limits=GUARDED)
    args = _args(64)
    np.testing.assert_allclose(fast(*args), (args[0] @ args[1]) @ args[2], rtol=2e-3, atol=1e-3)
    plan = fast.plan(*args)
    assert plan.rewritten_ops() and plan.measured["kept"] is False and plan.measured["decision"] == "slower"
    assert plan.measured["rounds"] == 7 and plan.measured["confidence"] > 0.99  # stopped once decided
    assert "slower with 99% confidence: the original runs" in plan.fallback and "faster in 0 of 7" in plan.summary()
    entry = next(iter(fast._calls.cache.values()))
    assert entry.running is entry.original
    fast(*args)
    assert len(calls) == 1  # measured once per plan
    assert guard.refused_for_good(plan.measured)


def _guarded_plan(n: int) -> tuple[Any, Any]:
    """The chain at n x n planned under the guard (the clock faked by the caller): its plan, and what runs."""
    fast = eqsat.optimize(_chain(), limits=GUARDED)
    args = _args(n)
    fast(*args)
    plan = fast.plan(*args)
    entry = next(iter(fast._calls.cache.values()))
    return plan, entry.running is not entry.original


def test_an_undecided_measurement_keeps_a_plan_predicted_clearly_faster(monkeypatch):
    _clock(monkeypatch, NOISY)
    plan, runs_plan = _guarded_plan(256)
    assert plan.predicted_speedup >= guard.CLEAR_PREDICTION
    assert plan.measured["decision"] == "undecided" and plan.measured["kept"] and plan.measured["rounds"] == 10
    assert not guard.refused_for_good(plan.measured) and runs_plan


def test_an_undecided_measurement_of_a_marginal_prediction_runs_the_original_but_stores_no_refusal(monkeypatch):
    _clock(monkeypatch, NOISY)
    monkeypatch.setattr(guard, "CLEAR_PREDICTION", 1e9)  # no prediction is clear
    plan, runs_plan = _guarded_plan(64)
    assert plan.measured["decision"] == "undecided" and not plan.measured["kept"] and not runs_plan
    assert "live calls run the plan and the original in turn" in plan.fallback
    assert not guard.refused_for_good(plan.measured)


def test_the_sign_test_decides_both_ways_and_only_past_chance():
    assert guard.sign_test(7, 7)[0] == "faster" and guard.sign_test(0, 7)[0] == "slower"
    assert guard.sign_test(6, 6)[0] == "undecided"  # 1.6%: not 99% sure
    assert guard.sign_test(10, 11)[0] == "faster" and guard.sign_test(9, 10)[0] == "undecided"
    assert guard.sign_test(3, 3) == ("undecided", pytest.approx(0.875))


def test_the_size_test_decides_a_gain_or_loss_beyond_noise_in_every_round_and_nothing_else():
    assert guard.decide(CLEARLY_FASTER[:3])[::2] == ("faster", "size") and guard.decide(CLEARLY_FASTER[:3])[1] > 0.99
    assert guard.decide([1 / r for r in CLEARLY_FASTER[:3]])[::2] == ("slower", "size")
    assert guard.decide(FASTER[:6])[0] == "undecided"  # every round faster, but by noise-sized gains
    assert guard.decide([5.5, 5.7, 0.9])[0] == "undecided"  # one round the other way
    assert guard.decide([2.0, 9.0, 1.5])[0] == "undecided"  # beyond noise on average, but too spread to be sure
    assert guard.decide([5.5, 5.7])[0] == "undecided"  # two rounds are never enough


def test_a_clearly_faster_plan_is_decided_on_its_first_call_not_by_live_calls(monkeypatch):
    _clock(monkeypatch, CLEARLY_FASTER)
    plan, runs_plan = _guarded_plan(64)
    assert plan.measured["decision"] == "faster" and plan.measured["rounds"] == 3 and not plan.measured["live"]
    assert "confidence (every round, beyond noise): kept" in plan.summary() and runs_plan
    assert "100%" not in plan.summary()  # a t-test's tiny p reads ">99.9%", never certainty


def test_a_faster_plan_is_kept(monkeypatch):
    _clock(monkeypatch, FASTER)
    plan, runs_plan = _guarded_plan(64)
    assert plan.measured["kept"] and plan.measured["decision"] == "faster" and plan.fallback is None
    assert plan.measured["rounds"] == 7 and runs_plan


def test_the_prepared_plan_is_what_gets_timed(monkeypatch):
    calls = _clock(monkeypatch, SLOWER)
    fast = eqsat.optimize(lambda w, x: x @ w[0] + x @ w[1], params_argnums=0, limits=GUARDED)
    rng = np.random.default_rng(1)
    w = [jnp.asarray(rng.standard_normal((128, 128)), jnp.float32) for _ in range(2)]
    x = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
    run = fast.prepare(w)
    np.testing.assert_allclose(run(x), x @ w[0] + x @ w[1], rtol=2e-3, atol=1e-2)
    plan = fast.plan(w, x)
    assert plan.rewritten_ops() and plan.measured["kept"] is False and "the original runs" in plan.fallback
    fast.prepare(w)(x)
    assert len(calls) == 1


def test_on_the_real_clock_a_large_gain_is_kept():
    """(A @ B) @ v as A @ (B @ v): 256x256 matrices, over 10x fewer flops; kept under any load."""
    fast = eqsat.optimize(_chain(), limits=eqsat.Limits(guard_seconds=0.2, measure_seconds=0))
    args = _args(256)
    fast(*args)
    plan = fast.plan(*args)
    assert plan.measured["kept"] and plan.measured["ratio"] > 1 and plan.measured["rounds"] >= 3, plan.measured


def test_a_zero_budget_measures_nothing():
    fast = eqsat.optimize(_chain(), limits=eqsat.Limits(guard_seconds=0, measure_seconds=0))
    args = _args(64)
    fast(*args)
    assert fast.plan(*args).measured is None and fast.plan(*args).fallback is None


def _live_clock(monkeypatch: pytest.MonkeyPatch, ratios: list[float]) -> list[int]:
    """Live calls' rounds give these ratios in turn: a round is two live calls, one of each program (each runs, as
    a real live call runs it). Returns a list that grows by one at each live call of the plan: one per round."""
    rounds, plan_calls = iter(ratios), []

    def live_timed(program: Any, plan: bool) -> tuple[Any, float]:
        out = program()
        if not plan:
            return out, 1e-3
        plan_calls.append(1)
        return out, 1e-3 / next(rounds)

    monkeypatch.setattr(guard, "live_timed", live_timed)
    return plan_calls


def _called(fast: Any, args: list[Any], times: int) -> Any:
    for _ in range(times):
        np.testing.assert_allclose(fast(*args), (args[0] @ args[1]) @ args[2], rtol=2e-3, atol=1e-2)
    return next(iter(fast._calls.cache.values()))


def test_an_undecided_plan_runs_on_and_live_calls_decide_it_faster(monkeypatch):
    """Issue 27: an undecided measurement is no refusal; live calls take turns running the plan and the original,
    timed, until the test decides (issue 41: no call runs both)."""
    _clock(monkeypatch, NOISY)
    live = _live_clock(monkeypatch, FASTER * 3)
    fast = eqsat.optimize(_chain(), limits=GUARDED)
    args = _args(256)
    entry = _called(fast, args, 1)
    assert entry.state is State.TRIAL and entry.running is not entry.original  # predicted clearly faster: it runs
    entry = _called(fast, args, 2 * 12)
    plan = fast.plan(*args)
    assert entry.state is State.KEPT and plan.measured["decision"] == "faster" and plan.fallback is None
    assert plan.measured["source"] == "live calls" and plan.measured["rounds"] == 10 + len(live)
    assert 5 <= len(live) < 12 and "the last on live calls" in guard.describe(plan.measured)
    calls = fast._calls
    assert not calls.plans.measuring and not calls.owed()  # settled: calls take jax.jit's path again
    fast(*args)
    assert calls.quiet == calls.plans.epoch and len(live) < 12


def test_while_undecided_each_live_call_runs_one_program_in_turn(monkeypatch):
    """Issue 41: no live call runs both programs (a call costs at most the slower one); the plan and the original
    take turns, the order alternating between rounds, and every call gives the program's results."""
    _clock(monkeypatch, NOISY)
    ran, timed = [], guard.live_timed
    monkeypatch.setattr(guard, "live_timed", lambda program, plan: (ran.append(plan), timed(program, plan))[1])
    fast = eqsat.optimize(_chain(), limits=GUARDED)
    args = _args(64)
    entry = _called(fast, args, 7)  # the first validates and measures (undecided); six live calls follow
    assert entry.undecided and entry.plan.measured["rounds"] == 13  # NOISY's 10 and three live rounds
    assert ran == [True, False, False, True, True, False]


def test_a_call_staged_into_a_scan_body_is_no_live_call(monkeypatch):
    """Fuzz seed 2050, case 6292: a scan body that closes over arrays calls the function on values, yet jax.jit
    stages that call into the body. A live call ran it at once instead, outside the loop, where XLA computes a
    dilated conv otherwise (its holes times an inf weight: NaN where jax.jit's loop body skips them). While
    undecided, such a call runs what the entry's state says, in the trace, as jax.jit's does."""
    _clock(monkeypatch, NOISY)
    ran, timed = [], guard.live_timed
    monkeypatch.setattr(guard, "live_timed", lambda program, plan: (ran.append(plan), timed(program, plan))[1])
    fast = eqsat.optimize(_chain(), limits=GUARDED)
    args = _args(64)
    entry = _called(fast, args, 1)
    assert entry.undecided and not ran
    staged = lax.scan(lambda c, _: (c, fast(*args)), 0, None, length=2)[1]
    assert not ran and entry.undecided  # staged into the body: nothing timed
    np.testing.assert_allclose(staged, np.stack([_chain()(*args)] * 2), rtol=1e-4, atol=1e-4)
    fast(*args)
    assert ran == [True]  # a call at the top level is still a live call


@pytest.mark.parametrize("background", [False, True])
def test_an_undecided_plan_the_original_runs_for_is_refused_once_live_calls_find_it_slower(
    monkeypatch, tmp_path, background
):
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQSAT_PLAN_STORE", "on")
    _clock(monkeypatch, NOISY)
    _live_clock(monkeypatch, SLOWER * 3)
    monkeypatch.setattr(guard, "CLEAR_PREDICTION", 1e9)  # no prediction is clear: the original runs meanwhile
    fast = eqsat.optimize(_chain(), limits=GUARDED, background=background)
    args = _args(64)
    fast(*args)
    fast.plan(*args)  # built in the background: the original ran the first call, and runs while measured
    assert _called(fast, args, 1).state is State.MEASURING
    entry = _called(fast, args, 2 * 20)  # 6 of 10 rounds faster first: 15 slower ones decide
    plan = fast.plan(*args)
    assert entry.state is State.ORIGINAL and entry.history[-2:] == [Event.SLOWER, Event.STORED]
    assert guard.refused_for_good(plan.measured) and "slower with 99% confidence" in plan.fallback


def test_an_undecided_measurement_settles_on_its_median_after_live_rounds(monkeypatch):
    _clock(monkeypatch, NOISY)
    monkeypatch.setattr(guard, "LIVE_ROUNDS", 14)
    _live_clock(monkeypatch, [1.2, 0.9, 1.1, 0.95])  # 2 of 4 faster: still undecided at 14 rounds
    fast = eqsat.optimize(_chain(), limits=GUARDED)
    args = _args(256)
    entry = _called(fast, args, 1 + 2 * 4)
    plan = fast.plan(*args)
    assert plan.measured["rounds"] == 14 and plan.measured["decision"] == "undecided" and not plan.measured["live"]
    assert entry.state is State.KEPT and not guard.refused_for_good(plan.measured)  # median 1.075: the plan
    assert not fast._calls.plans.measuring


def _weighted() -> Any:
    """x @ w[0] + x @ w[1], a new function each time; prepared: x @ (w[0] + w[1]), the sum computed once."""
    return lambda w, x: x @ w[0] + x @ w[1]


@pytest.mark.parametrize(
    "clear, live_ratios, after",
    [
        (True, FASTER, [Event.LEANING, Event.KEPT]),  # the plan runs meanwhile, and on
        (True, SLOWER, [Event.LEANING, Event.SLOWER, Event.STORED]),  # the plan runs, then the original
        (False, FASTER, [Event.UNDECIDED, Event.KEPT]),  # the original runs, then the plan
    ],
)
def test_an_undecided_prepared_plan_is_decided_by_live_calls(monkeypatch, tmp_path, clear, live_ratios, after):
    """Issue 27: prepared plans are guarded the same way; a prepare that was undecided switches to what live calls
    decide, and once settled measures nothing more."""
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQSAT_PLAN_STORE", "on")
    _clock(monkeypatch, NOISY)
    live = _live_clock(monkeypatch, live_ratios * 3)
    if not clear:
        monkeypatch.setattr(guard, "CLEAR_PREDICTION", 1e9)
    fast = eqsat.optimize(_weighted(), params_argnums=0, limits=GUARDED)
    rng = np.random.default_rng(2)
    w = [jnp.asarray(rng.standard_normal((128, 128)), jnp.float32) for _ in range(2)]
    x = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
    original = np.asarray(jax.jit(_weighted())(w, x))  # the plan's sum rounds differently: its results tell it apart
    run, other = fast.prepare(w), fast.prepare(w)
    first, second = np.asarray(run(x)), np.asarray(run(x))  # a live round: one call runs each program
    (entry,) = [e for e in fast._calls.cache.values() if e.prepared]
    assert entry.state is (State.TRIAL if clear else State.MEASURING) and entry.plan.measured["live"]
    assert sorted([np.array_equal(first, original), np.array_equal(second, original)]) == [False, True]
    for _ in range(2 * 20):  # 6 of 10 rounds faster first: 15 slower ones decide
        np.testing.assert_allclose(run(x), original, rtol=2e-3, atol=1e-2)
    assert entry.history[-len(after) :] == after and not entry.undecided
    assert entry.plan.measured["source"] == "live calls" and entry.plan.measured["rounds"] == 10 + len(live)
    assert guard.refused_for_good(entry.plan.measured) is (Event.SLOWER in after)
    rounds = len(live)
    for prepared in (run, other):  # settled: what it runs now, measuring nothing
        results = [np.asarray(prepared(x)) for _ in range(8)]
        assert all(np.array_equal(r, original) is (Event.SLOWER in after) for r in results)
    assert len(live) == rounds


def test_the_size_tests_student_tail_is_scipys():
    from scipy.stats import t as student

    for dof, x in itertools.product(range(1, 40), [0.0, 0.1, 0.5, 1.0, 2.0, 3.5, 7.0, 20.0, 100.0]):
        assert abs(guard.student_sf(x, dof) - float(student.sf(x, dof))) < 1e-12, (dof, x)
