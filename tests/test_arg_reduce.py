"""Kernel selection for argmax / argmin: captured as ArgReduce, with ArgReduceMasked (a max, then the first
position equal to it) beside it; the same index on ties, NaNs, infinities and integers, and the plan follows the
timing cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.capture import capture
from eqsat.ops import OPS

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
