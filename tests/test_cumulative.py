"""Cumulative ops (issue 26 item 3): lax.cumsum, cumprod, cummax, cummin and cumlogsumexp are captured as
(Cumulative kind axis reverse x), their blocked form computes the same values (exactly where the combine is
associative in the dtype), and a plan that picks the blocked form agrees with jax.jit, gradients included."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.capture.jaxpr import capture
from eqsat.ops.cumulative import KINDS, blocked, cumulative
from eqsat.ops.table import BlockedCumulativeAttrs, CumulativeAttrs, infer

SCANS = {"sum": lax.cumsum, "prod": lax.cumprod, "max": lax.cummax, "min": lax.cummin, "logsumexp": lax.cumlogsumexp}


def _values(shape: tuple[int, ...], dtype: Any, kind: str, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(rng.integers(-5, 6, shape), dtype)
    if kind == "prod":  # near 1, so that a long product neither vanishes nor overflows
        return jnp.asarray(rng.uniform(0.9, 1.1, shape), dtype)
    return jnp.asarray(rng.standard_normal(shape), dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("block", [1, 4, 16])
def test_blocked_computes_the_cumulative_op(kind: str, axis: int, reverse: int, block: int):
    x = _values((37, 5, 19), jnp.float32, kind)  # axes that blocks of 4 and 16 do not divide: padded
    want = SCANS[kind](x, axis, bool(reverse))
    got = blocked(BlockedCumulativeAttrs(kind, axis, reverse, block), x)
    assert got.shape == want.shape and got.dtype == want.dtype
    if kind in ("max", "min"):
        np.testing.assert_array_equal(got, want)  # max and min are associative in floating point
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int8, jnp.uint8])
def test_integer_blocked_form_is_exact_even_where_it_wraps(kind: str, dtype: Any):
    """Integer add and multiply wrap modulo 2^bits, and are associative there: the blocked form is exactly equal,
    on the overflowing path too."""
    rng = np.random.default_rng(1)
    info = jnp.iinfo(dtype)
    x = jnp.asarray(rng.integers(info.min, int(info.max) + 1, (3, 100)), dtype)
    for reverse in (0, 1):
        want = SCANS[kind](x, 1, bool(reverse))
        np.testing.assert_array_equal(blocked(BlockedCumulativeAttrs(kind, 1, reverse, 16), x), want)


def test_nan_and_infinities_pass_through_as_in_lax():
    x = jnp.asarray([1.0, jnp.nan, -jnp.inf, 2.0, jnp.inf, -1.0] * 6, jnp.float32)
    for kind in ("max", "min", "sum"):
        for reverse in (0, 1):
            want = SCANS[kind](x, 0, bool(reverse))
            np.testing.assert_array_equal(blocked(BlockedCumulativeAttrs(kind, 0, reverse, 4), x), want)


@pytest.mark.parametrize(
    ("fn", "kind"),
    [
        (lambda x: jnp.cumsum(x, 1), "sum"),
        (lambda x: jnp.cumprod(x, 0), "prod"),
        (lambda x: lax.cummax(x, 1, reverse=True), "max"),
        (lambda x: lax.cummin(x, 0), "min"),
        (lambda x: lax.cumlogsumexp(x, 1), "logsumexp"),
    ],
)
def test_captured_as_a_table_op(fn: Any, kind: str):
    graph = capture(jax.make_jaxpr(fn)(jnp.ones((4, 6), jnp.float32)))
    ops = [(node.op, node.attrs) for node in graph.nodes]
    assert [CumulativeAttrs(*attrs).kind for op, attrs in ops if op == "Cumulative"] == [kind]
    assert "Op" not in [op for op, _ in ops]


def test_associative_scan_is_left_as_its_own_slices_and_adds():
    """lax.associative_scan binds no cumulative primitive: its strided slices, adds, pads and concatenates are
    captured as they are (none of it is a Cumulative)."""
    graph = capture(jax.make_jaxpr(lambda x: lax.associative_scan(jnp.add, x, axis=1))(jnp.ones((4, 64))))
    assert "Cumulative" not in {node.op for node in graph.nodes}


def _optimized_with_blocks(fn: Any, args: tuple, decide_timings: Any) -> eqsat.Optimized:
    """optimize(fn) once the timing cache says the blocked forms win (which wins on a loaded machine is load's
    call; the speed-up is benches/kernels.py's claim)."""
    limits = eqsat.Limits(seconds=120, measure_seconds=120)
    eqsat.optimize(fn, limits=limits).plan(*args)
    assert "CumulativeBlocked" in decide_timings(alternatives_win=True)
    return eqsat.optimize(lambda *a: fn(*a), limits=limits)


@pytest.mark.parametrize(
    ("kind", "axis", "reverse", "dtype"),
    [
        ("sum", 1, 0, jnp.float32),
        ("sum", 0, 1, jnp.int32),
        ("prod", 1, 1, jnp.float32),
        ("prod", 1, 0, jnp.int32),
        ("max", 0, 0, jnp.float32),
        ("min", 1, 1, jnp.int32),
        ("logsumexp", 1, 0, jnp.float32),
    ],
)
def test_a_plan_with_the_blocked_form_agrees_with_jit(kind: str, axis: int, reverse: int, dtype: Any, decide_timings):
    x = _values((70, 70), dtype, kind)

    def fn(x: jax.Array) -> jax.Array:
        return SCANS[kind](x * 2, axis, bool(reverse))

    fast = _optimized_with_blocks(fn, (x,), decide_timings)
    plan = fast.plan(x)
    assert plan.fallback is None and plan.rules_fired[f"cumulative-{'prod-' * (kind == 'prod')}blocked"] == 1
    # sums and logsumexps stay in range in any order: only a float product's blocks are watched for overflow
    assert bool(plan.overflow_watch) == (kind == "prod" and jnp.issubdtype(dtype, jnp.floating))
    assert [node.op for node in plan.nodes if node.op.startswith("Cumulative")] == ["CumulativeBlocked"]
    got, want = fast(x), jax.jit(fn)(x)
    if jnp.issubdtype(dtype, jnp.integer) or kind in ("max", "min"):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_through_the_blocked_form(decide_timings):
    """The gradient of a cumsum is a reverse cumsum: optimize(grad) gets the blocked form for both, and
    grad(optimize) differentiates the blocked one."""
    x = _values((3, 96), jnp.float32, "sum")

    def loss(x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(jnp.cumsum(x, 1)) ** 2)

    grad = jax.grad(loss)
    fast_grad = _optimized_with_blocks(grad, (x,), decide_timings)
    plan = fast_grad.plan(x)
    assert plan.fallback is None
    assert sorted(BlockedCumulativeAttrs(*n.attrs).reverse for n in plan.nodes if n.op == "CumulativeBlocked") == [
        0,
        1,
    ]  # forward and backward
    np.testing.assert_allclose(fast_grad(x), jax.jit(grad)(x), rtol=1e-4, atol=1e-5)
    fast = eqsat.optimize(loss)
    assert any(n.op == "CumulativeBlocked" for n in fast.plan(x).nodes)
    np.testing.assert_allclose(jax.grad(fast)(x), grad(x), rtol=1e-4, atol=1e-5)


def test_a_short_axis_keeps_the_primitive():
    x = _values((4, 20), jnp.float32, "sum")
    plan = eqsat.optimize(lambda x: jnp.cumsum(x, 1)).plan(x)
    assert "cumulative-blocked" not in plan.rules_fired or plan.rules_fired["cumulative-blocked"] == 0
    assert [node.op for node in plan.nodes if node.op.startswith("Cumulative")] == ["Cumulative"]


def test_an_unknown_kind_is_refused_where_it_is_lowered():
    x = jnp.ones((4, 70), jnp.float32)
    for lower, attrs in (
        (cumulative, CumulativeAttrs("mean", 1, 0)),
        (blocked, BlockedCumulativeAttrs("mean", 1, 0, 32)),
    ):
        with pytest.raises(ValueError, match="kind 'mean': the kinds are sum, prod"):
            lower(attrs, x)
    assert infer("CumulativeBlocked", ("mean", 1, 0, 32), (((4, 70), "float32"),)) is None
