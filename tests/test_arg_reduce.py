"""Kernel selection for argmax / argmin: captured as ArgReduce, with ArgReduceMasked (a max, then the first
position equal to it) beside it; the same index on ties, NaNs, infinities and integers, and the plan follows the
timing cache."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.capture.jaxpr import capture
from eqsat.ops import kernels
from eqsat.ops.table import OPS

NAN, INF = np.nan, np.inf
SPECIAL = np.array(  # NaNs (the first one wins), all -inf, infinities beside a NaN, signed zeros
    [[1, NAN, 3, NAN], [2, 2, 1, 0], [-INF, -INF, -INF, -INF], [INF, 1, INF, NAN], [0.0, -0.0, 0.0, -1]], np.float32
)


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_masked_form_gives_the_same_index(kind: str, axis: int, dtype: str):
    rng = np.random.default_rng(axis)
    tied = np.floor(rng.standard_normal((6, 4)) * 2)  # many ties: the first position must win
    x = jnp.asarray(np.concatenate([tied, SPECIAL]) if dtype != "int32" else tied, dtype)
    want = (jnp.argmax if kind == "max" else jnp.argmin)(x, axis=axis)
    attrs = (kind, axis, "int32")
    for op in ("ArgReduce", "ArgReduceMasked"):
        got = OPS[op].lower(attrs, x)
        assert got.dtype == jnp.int32
        np.testing.assert_array_equal(got, want, err_msg=op)


def test_argmax_and_argmin_are_captured():
    x = jnp.ones((3, 5))
    graph = capture(jax.make_jaxpr(lambda x: (jnp.argmax(x, -1), jnp.argmin(x, 0)))(x))
    reduces = [n.attrs for n in graph.nodes if n.op == "ArgReduce"]
    assert reduces == [("max", 1, "int32"), ("min", 0, "int32")]


@pytest.mark.parametrize("alternatives_win", [True, False])
def test_the_plan_follows_the_timing_cache(decide_timings, alternatives_win):
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 2000)), jnp.float32)

    def top(x):
        return jnp.argmax(x, axis=-1), jnp.argmin(x, axis=0)

    eqsat.optimize(lambda x: top(x)).plan(x)  # measures: the cache holds both forms' keys
    assert decide_timings(alternatives_win) == {"ArgReduce", "ArgReduceMasked"}
    fast = eqsat.optimize(lambda x: top(x))
    for got, want in zip(fast(x), top(x), strict=True):
        np.testing.assert_array_equal(got, want)
    ops = [node.op for node in fast.plan(x).nodes]
    assert ops.count("ArgReduceMasked" if alternatives_win else "ArgReduce") == 2, ops


class DropsNaN:
    """jax.lax as a machine whose reduce_max / reduce_min of floats drop NaNs: XLA:CPU's do on some (issue 42), not
    on this one."""

    def __getattr__(self, name: str) -> Any:
        return getattr(lax, name)

    @staticmethod
    def reduce_max(x: jax.Array, axes: tuple) -> jax.Array:
        return lax.reduce_max(_nan_to(x, -INF), axes)

    @staticmethod
    def reduce_min(x: jax.Array, axes: tuple) -> jax.Array:
        return lax.reduce_min(_nan_to(x, INF), axes)


def _nan_to(x: jax.Array, value: float) -> jax.Array:
    return lax.select(x != x, lax.full_like(x, value), x) if jnp.issubdtype(x.dtype, jnp.inexact) else x


def special_rows(n: int = 8) -> np.ndarray:
    """Rows of n: one NaN at every position before, at and after the max and the min; then all NaN, all -inf,
    all +inf, infinities beside NaNs, signed zeros, all equal, ties, the largest finite values and subnormals."""
    rows = []
    for shift in range(n):  # the max at shift - 1, the min at shift
        for p in range(n):
            row = np.roll(np.arange(n, dtype=np.float64) - n // 2, shift)
            row[p] = NAN
            rows.append(row)
    tiny, huge = 1e-40, 3e38  # float32's subnormal and near its largest (both infinities in narrower floats)
    specials = [[NAN] * n, [-INF] * n, [INF] * n, [INF, NAN, -INF, NAN], [-INF, -INF, NAN, INF], [-0.0, 0.0, -0.0, 0.0],
                [0.0, -0.0, 0.0, -0.0], [-0.0] * n, [2.0] * n, [1, 3, 3, 1, -2, -2], [huge, -huge, huge, -huge],
                [tiny, -tiny, 0.0, tiny, -tiny], [-tiny, 0.0, -0.0, tiny]]  # fmt: skip
    rows += [(row * n)[:n] for row in specials]
    return np.array(rows)


@pytest.mark.parametrize("lax_of", ["this machine", "NaN-dropping"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_masked_form_gives_jits_index_on_special_values(lax_of: str, dtype: str, monkeypatch):
    rows = special_rows()
    x = jnp.asarray(np.stack([rows, rows[::-1]]), jnp.float32).astype(dtype)  # rows along axis 2, columns along 1
    wants = {(kind, axis): jax.jit(jnp.argmax if kind == "max" else jnp.argmin, static_argnums=1)(x, axis)
             for kind in ("max", "min") for axis in (1, 2)}  # fmt: skip
    if lax_of == "NaN-dropping":
        monkeypatch.setattr(kernels, "lax", DropsNaN())
    for (kind, axis), want in wants.items():
        got = jax.jit(lambda x, attrs=(kind, axis, "int32"): OPS["ArgReduceMasked"].lower(attrs, x))(x)
        np.testing.assert_array_equal(got, want, err_msg=f"arg{kind} along {axis}")


@pytest.mark.parametrize("lax_of", ["this machine", "NaN-dropping"])
def test_a_plan_made_without_nans_gives_jits_index_on_nans(decide_timings, lax_of: str, monkeypatch):
    # issue 42: the plan is made and validated on a first call without NaN; later calls hold one every 97 elements
    rng = np.random.default_rng(1)
    clean = rng.standard_normal((16, 128, 64)).astype(np.float32)
    dirty = clean.copy()
    dirty.reshape(-1)[::97] = NAN

    def top(x: jax.Array) -> tuple:
        return jnp.argmax(x, axis=-1), jnp.argmin(x, axis=1)

    if lax_of == "NaN-dropping":
        monkeypatch.setattr(kernels, "lax", DropsNaN())
    eqsat.optimize(lambda x: top(x)).plan(clean)  # the cache holds both forms' keys
    decide_timings(alternatives_win=True)
    fast = eqsat.optimize(lambda x: top(x))  # a function of its own: optimize(top) would share the plan above
    fast(clean)
    assert [node.op for node in fast.plan(clean).nodes].count("ArgReduceMasked") == 2
    for got, want in zip(fast(jnp.asarray(dirty)), jax.jit(top)(dirty), strict=True):
        np.testing.assert_array_equal(got, want)
