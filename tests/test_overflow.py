"""No plan overflows where the original does not (issue 24, item 4 and must-be-true 3): a plan that relies on rules
marked `; @real` checks the rewritten values the rest of the program reads for inf/NaN on device, in the same XLA
program, and runs the original where any is."""

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import eqsat
from eqsat.backends.lower import with_overflow_watch
from eqsat.extract.changes import plan_summary

KEPT = eqsat.Limits(guard_seconds=0, measure_seconds=0)  # what runs is the plan, not whichever timed faster
WATCH_LOOP = "stablehlo.while"  # how the watch's fallback (a loop run at most once) reads in the lowered program


def _chain(a: Any, b: Any, v: Any) -> Any:
    return (a @ b) @ v


def _args(n: int, m: int = 8) -> tuple[Any, ...]:
    rng = np.random.default_rng(0)
    return tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((n, n), (n, n), (n, m)))


def _scaled(a: Any, b: Any, v: Any) -> tuple[Any, ...]:
    """The reproducer's magnitudes: B @ v overflows float32 (1e40), (A @ B) @ v stays near 1e12."""
    return a * 1e-30, b * 1e30, v * 1e10


def test_the_scaled_chain_gives_jax_jits_finite_results() -> None:
    """Reproducer item 4: (A@B)@v at 1024x1024 (v 1024x8), re-associated (about 50x faster) and kept; on inputs
    scaled to 1e-30 / 1e30 / 1e10 every result of the plan was inf or NaN where jax.jit's are finite."""
    args = _args(1024)
    fast = eqsat.optimize(_chain, background=False)
    np.testing.assert_allclose(fast(*args), _chain(*args), rtol=1e-3, atol=1e-2)
    plan = fast.plan(*args)
    assert plan.fallback is None and plan.rewritten_ops() == {"Dot": 2}
    want = jax.jit(_chain)(*_scaled(*args))
    assert np.isfinite(want).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(fast(*_scaled(*args)), want, rtol=1e-5)
    assert "dot-assoc-right" in plan.overflow_watch
    assert (
        "overflow watch   rewritten values" in plan.summary()
        and "dot-assoc-right" in plan_summary(plan)["overflow watch"]
    )


def test_a_product_the_new_order_flushes_to_zero_runs_the_original() -> None:
    """Fuzz seed 2036 case 259: x @ (W1 @ W2) re-associated, on inputs scaled so that the new order's intermediate
    (1e-50) falls below the smallest float32 and is flushed to zero, while every value of the original's order
    is a normal float: the plan gave 0 where jax.jit gives about 1e-30."""
    args = _args(64, 2)
    tiny = (args[0] * 1e20, args[1] * 1e-30, args[2] * 1e-20)  # B @ v is about 1e-50, A @ B about 1e-10
    fast = eqsat.optimize(_chain, limits=KEPT, background=False)
    np.testing.assert_allclose(fast(*args), _chain(*args), rtol=1e-3, atol=1e-2)  # validated on this call
    assert fast.plan(*args).overflow_watch and fast.plan(*args).fallback is None
    want = jax.jit(_chain)(*tiny)
    assert float(jnp.min(jnp.abs(want))) > 0
    np.testing.assert_allclose(fast(*tiny), want, rtol=1e-5)


def test_the_guard_passes_the_plans_results_through_without_a_copy() -> None:
    """A lax.cond whose branch returns the plan's results copies each of them (XLA:CPU: 80 ms for the 262 MB
    gradient of an LM loss); the watch's loop keeps them in place."""
    args = _args(64, 8)
    fast = eqsat.optimize(_chain, limits=KEPT, background=False)
    assert fast.plan(*args).overflow_watch
    compiled = fast.lower(*args).compile().as_text()
    assert WATCH_LOOP.removeprefix("stablehlo.") in compiled
    assert not [line for line in compiled.splitlines() if "f32[64,8]{1,0} copy(" in line]


def test_the_guard_holds_under_vmap_jit_grad_and_in_a_scan_body() -> None:
    args = _args(64, 2)
    scaled = _scaled(*args)
    fast = eqsat.optimize(_chain, limits=KEPT, background=False)
    assert fast.plan(*args).overflow_watch
    np.testing.assert_allclose(jax.jit(fast)(*scaled), _chain(*scaled), rtol=1e-5)
    # under vmap one check covers the batch: the cond stays a cond, not a select that runs both programs
    batch = tuple(jnp.stack([x, 2 * x]) for x in scaled)
    np.testing.assert_allclose(jax.vmap(fast)(*batch), jax.vmap(_chain)(*batch), rtol=1e-5)
    assert WATCH_LOOP in jax.jit(jax.vmap(fast)).lower(*batch).as_text()
    loss = lambda *xs: jnp.sum(fast(*xs) ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.grad(loss)(*args)[0], jax.grad(lambda *xs: jnp.sum(_chain(*xs) ** 2))(*args)[0])

    def scanned(a: Any, b: Any, v: Any) -> Any:  # the body is re-planned; the scan's results are watched
        return lax.scan(lambda c, _: (c, _chain(a, b, v)), 0.0, None, length=2)[1]

    in_scan = eqsat.optimize(scanned, limits=KEPT, background=False)
    plan = in_scan.plan(*args)
    assert plan.stats["bodies_rewritten"] == 1 and "dot-assoc-right" in plan.overflow_watch
    np.testing.assert_allclose(in_scan(*scaled), scanned(*scaled), rtol=1e-5)


def test_results_the_original_gives_as_inf_or_nan_come_back_as_it_gives_them() -> None:
    a, b, v = _args(64, 2)
    a = a.at[0, 0].set(jnp.inf).at[5, 3].set(jnp.nan)
    fast = eqsat.optimize(_chain, limits=KEPT, background=False)
    np.testing.assert_array_equal(fast(a, b, v), jax.jit(_chain)(a, b, v))


def test_plans_without_real_rules_or_without_inexact_values_have_no_guard() -> None:
    """The watch is paid only where a @real rule fired and the rewritten values can be inf: two GEMMs of one
    input merged into one (concatenation rules, exact) and an integer chain re-associated have none."""
    x, w1, w2 = (jnp.ones(s) for s in ((64, 32), (32, 32), (32, 32)))
    merged = eqsat.optimize(lambda x, a, b: (x @ a, x @ b), limits=KEPT, background=False)
    ints = tuple(jnp.ones(s, jnp.int32) for s in ((64, 64), (64, 64), (64, 2)))
    integer = eqsat.optimize(_chain, limits=KEPT, background=False)
    for fast, args in ((merged, (x, w1, w2)), (integer, ints)):
        plan = fast.plan(*args)
        assert plan.rewritten_ops() and plan.fallback is None and not plan.overflow_watch
        assert WATCH_LOOP not in fast.lower(*args).as_text() and "overflow watch" not in plan.summary()
    assert {"dot-assoc-right", "dot-assoc-left"} & set(integer.plan(*ints).rules_fired)


def test_a_plan_that_uses_no_real_rule_that_fired_has_no_guard() -> None:
    """(x + y) @ w expands by distributivity (a @real rule fires) and the extraction keeps the one GEMM; the naive
    softmax after it becomes the stable one (`; @rounding`). The plan uses no @real rule, so nothing is watched
    (ConvNeXtTiny's plan paid 13-15 % for such a watch); the distributivity case keeps its watch."""

    def f(x: Any, y: Any, w: Any) -> Any:
        h = jnp.exp((x + y) @ w)
        return h / jnp.sum(h, axis=1, keepdims=True)

    rng = np.random.default_rng(0)
    args = tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((256, 64), (256, 64), (64, 128)))
    fast = eqsat.optimize(f, limits=KEPT, background=False)
    plan = fast.plan(*args)
    assert plan.rewritten_ops().get("Softmax") and plan.fallback is None
    assert plan.stats.get("unwatched") == 1.0 and not plan.overflow_watch
    assert WATCH_LOOP not in fast.lower(*args).as_text()
    np.testing.assert_allclose(fast(*args), jax.jit(f)(*args), rtol=1e-4, atol=1e-6)
    factored = eqsat.optimize(lambda x, a, b: x @ a + x @ b, limits=KEPT, background=False)
    x, a, b = (jnp.ones(s) for s in ((64, 32), (32, 32), (32, 32)))
    assert factored.plan(x, a, b).overflow_watch  # x @ (a + b): the @real rule is what the plan runs


def test_the_guard_differentiates_as_the_plan_where_finite_and_as_the_original_where_not() -> None:
    """What `prepare` runs has no derivatives of the original around it: grad and jvp go through the watch."""
    watched = with_overflow_watch(lambda a, b, v: [a @ (b @ v), a @ (b @ v)], lambda a, b, v: [_chain(a, b, v)], 1)
    args = _args(16, 2)
    for xs in (args, _scaled(*args)):
        want = jax.grad(lambda *x: jnp.sum(jnp.sin(_chain(*x))), argnums=(0, 1, 2))(*xs)
        got = jax.grad(lambda *x: jnp.sum(jnp.sin(watched(*x)[0])), argnums=(0, 1, 2))(*xs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * float(jnp.max(jnp.abs(w))))
        tangent = jax.jvp(lambda *x: watched(*x)[0], xs, xs)[1]
        np.testing.assert_allclose(tangent, jax.jvp(_chain, xs, xs)[1], rtol=1e-3, atol=1e-3)
