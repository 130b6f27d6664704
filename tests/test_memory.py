"""Memory planning: liveness, offset planning, memory-aware order, XLA's figures, budgets, donation."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from benches.models.registry import MODELS
from eqsat.backends import memory as M
from eqsat.backends.fusion import fused_values
from eqsat.extract.cost import load_profile


@functools.cache
def _model_plan(name: str, scale: str = "small"):
    w = MODELS[name](scale)
    return eqsat.optimize(w.fn, params_argnums=w.params_argnums).plan(*w.args)


def _disjoint(intervals: list[M.Interval], offsets: list[int]) -> bool:
    """No two values live at one step share a byte of the arena."""
    live = [(iv, off) for iv, off in zip(intervals, offsets, strict=True) if iv.size]
    for k, (a, oa) in enumerate(live):
        for b, ob in live[k + 1 :]:
            if a.start <= b.end and b.start <= a.end and oa < ob + b.size and ob < oa + a.size:
                return False
    return True


def test_liveness_of_a_small_plan() -> None:
    x = jnp.ones((4, 8), jnp.float32)
    w = jnp.ones((8, 16), jnp.float32)
    plan = eqsat.optimize(lambda x, w: jnp.tanh(x @ w) * 2.0 + 1.0).plan(x, w)
    nodes, last = plan.nodes, len(plan.nodes) - 1
    for donated in (False, True):
        intervals = M.liveness(plan, donated=donated)
        assert [iv.node for iv in intervals] == list(range(len(nodes)))
        for iv, node in zip(intervals, nodes, strict=True):
            assert iv.size == int(np.prod(node.shape)) * np.dtype(node.dtype).itemsize
            consumers = [i for i, n in enumerate(nodes) if iv.node in n.inputs]
            if node.op == "Var":
                assert iv.start == 0
                assert iv.end == (max(consumers) if donated and consumers else last)
            else:
                assert iv.start == iv.node
                assert iv.end == (last if iv.node in plan.outputs else max(consumers))
    out = plan.outputs[0]
    assert M.liveness(plan)[out].size == 4 * 16 * 4
    # arguments kept by the caller count at every step; the lower bound covers inputs + the result at least
    assert M.lower_bound(M.liveness(plan)) >= (4 * 8 + 8 * 16 + 4 * 16) * 4


def test_liveness_counts_multi_result_calls_on_their_gets() -> None:
    x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8)
    plan = eqsat.optimize(lambda x: jax.lax.top_k(x * 2.0, 3)).plan(x)
    intervals = M.liveness(plan)
    gets = [i for i, n in enumerate(plan.nodes) if n.op == "Get"]
    assert len(gets) == 2
    for g in gets:
        call = plan.nodes[g].inputs[0]
        assert intervals[call].size == 0  # the tuple value: its results are counted on the Gets
        assert intervals[g].start == call and intervals[g].size == 4 * 3 * 4
    with pytest.raises(ValueError, match="topological"):
        M.liveness(plan, list(reversed(range(len(plan.nodes)))))


def test_lower_bound_and_best_fit_by_hand() -> None:
    intervals = [M.Interval(0, 100, 0, 1), M.Interval(1, 50, 1, 2), M.Interval(2, 100, 2, 3), M.Interval(3, 0, 0, 3)]
    assert M.lower_bound(intervals) == 150
    offsets, arena = M.best_fit(intervals)
    assert arena == 150 and _disjoint(intervals, offsets)
    assert M.best_fit(intervals, align=64)[1] == 128 + 64  # sizes 128, 64, 128


@pytest.mark.parametrize("name", sorted(MODELS))
def test_best_fit_near_lower_bound_and_schedule_no_worse(name: str) -> None:
    plan = _model_plan(name)
    intervals = M.liveness(plan)
    bound = M.lower_bound(intervals)
    offsets, arena = M.best_fit(intervals)
    assert bound <= arena <= 1.05 * bound
    assert _disjoint(intervals, offsets)
    order = M.memory_schedule(plan)
    assert sorted(order) == list(range(len(plan.nodes)))
    assert M.schedule_peak(plan, order) <= M.schedule_peak(plan)  # liveness() also checks it is topological
    report = M.memory_report(plan)  # values elementwise chains keep inside their fusions have no buffer there
    fused = M.liveness(plan, fused=fused_values(plan, load_profile(plan.target)))
    assert report.planned_peak == M.best_fit(fused)[1] <= arena and report.lower_bound == M.lower_bound(fused)
    assert "lower bound" in report.summary()


def test_xla_figure_is_consistent() -> None:
    x = jnp.ones((64, 32), jnp.float32)
    w = jnp.ones((32, 32), jnp.float32)

    def f(x, w):
        return jnp.tanh(x @ w) @ w

    fig = M.xla_figure(f, (x, w))
    assert fig["argument"] == (64 * 32 + 32 * 32) * 4 and fig["output"] == 64 * 32 * 4 and fig["alias"] == 0
    assert fig["temp"] >= 0 and fig["total"] == fig["argument"] + fig["output"] - fig["alias"] + fig["temp"] > 0
    assert M.xla_figure(f, (x, w)) == fig  # deterministic
    assert M.xla_figure(f, (x, w), M.MEMORY_OPTIMIZED)["argument"] == fig["argument"]  # the option is accepted
    donation = M.donation_figures(f, (x, w), donate_argnums=0)  # x and the result have one shape
    assert donation["donated"]["alias"] == 64 * 32 * 4
    assert donation["saved"] == donation["plain"]["total"] - donation["donated"]["total"]
    report = M.MemoryReport(1, 1, 1, fig, ["donation"])
    assert "XLA" in report.summary() and "donation" in report.summary()


def _residual_mlp(layers: int = 8, batch: int = 256, width: int = 32):
    def loss(params, x):
        for w in params:
            x = x + jnp.tanh(x @ w)
        return jnp.mean(x**2)

    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.standard_normal((width, width)) / 6, jnp.float32) for _ in range(layers)]
    return loss, (params, jnp.asarray(rng.standard_normal((batch, width)), jnp.float32))


def _check_budget(fn, args, loss, fraction: float = 0.7) -> M.BudgetReport:
    unconstrained = M.xla_figure(fn, args)
    budget = int(fraction * unconstrained["total"])
    fn2, report = eqsat.fit_budget(fn, args, budget, loss=loss)
    assert report.fits, report.tried
    assert report.unconstrained == unconstrained
    assert report.achieved["total"] <= budget
    assert M.xla_figure(fn2, args, M.MEMORY_OPTIMIZED if "scheduler" in report.mechanism else None) == report.achieved
    for want, have in zip(jax.tree_util.tree_leaves(fn(*args)), jax.tree_util.tree_leaves(fn2(*args)), strict=True):
        np.testing.assert_allclose(np.asarray(have), np.asarray(want), rtol=2e-4, atol=1e-6)
    return report


def test_fit_budget_rematerializes_a_training_step() -> None:
    loss, args = _residual_mlp()
    report = _check_budget(jax.value_and_grad(loss), args, loss)
    assert "segments" in report.mechanism


def test_fit_budget_keeps_a_function_that_fits() -> None:
    loss, args = _residual_mlp(layers=2, batch=8)
    fn = jax.value_and_grad(loss)
    _, report = M.fit_budget(fn, args, 10**9)
    assert report.fits and report.mechanism == "jax.jit" and len(report.tried) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_best_fit_full_scale(name: str) -> None:
    plan = _model_plan(name, "full")
    intervals = M.liveness(plan)
    bound = M.lower_bound(intervals)
    assert bound <= M.best_fit(intervals)[1] <= 1.05 * bound
    assert M.schedule_peak(plan, M.memory_schedule(plan)) <= M.schedule_peak(plan)


@pytest.mark.slow
def test_fit_budget_full_train_step() -> None:
    w = MODELS["train_step"]("full")  # 4 layers; fn is jax.value_and_grad(loss), which keeps loss as __wrapped__
    _check_budget(w.fn, w.args, w.fn.__wrapped__)


def test_optimize_with_a_budget_rematerializes_a_gradient() -> None:
    """optimize(jax.value_and_grad(loss), memory_budget=...) fits 70% of XLA's figure through remat segments."""
    loss, args = _residual_mlp()
    step = jax.value_and_grad(loss)
    budget = int(0.7 * M.xla_figure(step, args)["total"])
    fast = eqsat.optimize(step, memory_budget=budget)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fitting: no over-budget warning
        got = fast(*args)
    for want, have in zip(jax.tree_util.tree_leaves(step(*args)), jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(have), np.asarray(want), rtol=2e-4, atol=1e-6)
    memory = fast.plan(*args).memory
    assert memory.xla["total"] <= budget
    assert any("segments" in step for step in memory.applied)
