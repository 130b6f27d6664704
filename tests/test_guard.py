"""Never slower than jax.jit: a plan is timed against the original after validation and kept only if faster."""

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat import guard
from eqsat.measure import Comparison

GUARDED = eqsat.Limits(guard_seconds=0.05, measure_seconds=0)


def _chain() -> Any:
    """(A @ B) @ v, a new function each time: plans are shared by every optimize() of one function."""
    return lambda a, b, v: (a @ b) @ v


def _args(n: int) -> list[Any]:
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((n, n), (n, n), (n, 2))]


def _clock(monkeypatch: pytest.MonkeyPatch, ratios: tuple[float, float, float]) -> list[int]:
    """A fake clock: every measurement reports these (lower quartile, median, upper quartile) ratios."""
    calls = []

    def compare(baseline: Any, candidate: Any, args: tuple, seconds: float, **_: Any) -> Comparison:
        calls.append(1)
        baseline(), candidate()  # both run, as the real measurement runs them
        low, mid, high = ratios
        return Comparison(1e-3, 1e-3 / mid, mid, low, high, 8)

    monkeypatch.setattr(guard, "compare", compare)
    return calls


def test_a_plan_not_faster_beyond_noise_is_dropped_and_says_what_was_measured(monkeypatch):
    calls = _clock(monkeypatch, (0.9, 1.1, 1.3))
    fast = eqsat.optimize(_chain(), limits=GUARDED)
    args = _args(64)
    np.testing.assert_allclose(fast(*args), (args[0] @ args[1]) @ args[2], rtol=2e-3, atol=1e-3)
    plan = fast.plan(*args)
    assert plan.rewritten_ops() and plan.measured["kept"] is False and plan.measured["ratio"] == 1.1
    assert "not faster beyond noise: the original runs" in plan.fallback and "measured 1.10x" in plan.summary()
    entry = next(iter(fast._cache.values()))
    assert entry.call is entry.original
    fast(*args)
    assert len(calls) == 1  # measured once per plan


def test_a_faster_plan_is_kept(monkeypatch):
    _clock(monkeypatch, (1.4, 1.6, 1.9))
    fast = eqsat.optimize(_chain(), limits=GUARDED)
    args = _args(64)
    fast(*args)
    plan = fast.plan(*args)
    assert plan.measured["kept"] and plan.fallback is None
    entry = next(iter(fast._cache.values()))
    assert entry.call is not entry.original


def test_the_prepared_plan_is_what_gets_timed(monkeypatch):
    calls = _clock(monkeypatch, (0.8, 0.95, 1.1))
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
    assert plan.measured["kept"] and plan.measured["ratio"] > 1 and plan.measured["rounds"] >= 5, plan.measured


def test_a_zero_budget_measures_nothing():
    fast = eqsat.optimize(_chain(), limits=eqsat.Limits(guard_seconds=0, measure_seconds=0))
    args = _args(64)
    fast(*args)
    assert fast.plan(*args).measured is None and fast.plan(*args).fallback is None
