"""Kernel selection for pools, grouped convolutions and tiny batched matmuls (rules/kernels.egg): each alternative
lowering computes what the primitive it replaces does, egglog's shapes agree with jax's, and pooling layers of the
JAX libraries are captured and rewritten."""

import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.capture.ir import Graph
from eqsat.capture.jaxpr import capture
from eqsat.egraph.rule_sources import collect
from eqsat.egraph.saturate import Saturation, Snapshot, saturate
from eqsat.ops.table import OPS, ConvAttrs, infer

RNG = np.random.default_rng(0)
NHWC = ("NHWC", "HWIO", "NHWC")


def normal(*shape: int, dtype: str = "float32") -> jax.Array:
    return jnp.asarray(RNG.standard_normal(shape).astype(dtype))


def pool_attrs(window: tuple, strides: tuple, padding: tuple) -> tuple:
    return window, strides, tuple(lo for lo, _ in padding), tuple(hi for _, hi in padding)


POOLS = [  # (input shape, window, strides, padding): NHWC and NCHW, overlapping and strided, uneven padding
    ((2, 9, 8, 5), (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0))),
    ((2, 9, 8, 5), (1, 3, 3, 1), (1, 1, 1, 1), ((0, 0), (0, 0), (0, 0), (0, 0))),
    ((1, 7, 7, 3), (1, 2, 3, 1), (1, 2, 1, 1), ((0, 0), (0, 1), (2, 0), (0, 0))),
    ((2, 4, 10, 11), (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0), (0, 0), (0, 1), (0, 1))),
    ((1, 5, 5, 2), (1, 5, 5, 1), (1, 1, 1, 1), ((0, 0), (0, 0), (0, 0), (0, 0))),  # a global pool
]


@pytest.mark.parametrize("kind", ["max", "sum"])
@pytest.mark.parametrize(("shape", "window", "strides", "padding"), POOLS)
def test_sliced_pool_agrees_with_reduce_window(kind: str, shape: tuple, window: tuple, strides: tuple, padding: tuple):
    x = normal(*shape)
    init, fn = (-jnp.inf, lax.max) if kind == "max" else (0.0, lax.add)
    want = lax.reduce_window(x, init, fn, window, strides, padding)
    attrs = pool_attrs(window, strides, padding)
    name = f"Pool{kind.title()}"
    for op in (name, f"{name}Sliced"):
        got = OPS[op].lower(attrs, x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=op)


def test_sliced_max_pool_of_integers_pads_with_the_lowest_value():
    x = jnp.asarray(RNG.integers(-50, 50, (1, 5, 5, 2)), jnp.int32)
    attrs = pool_attrs((1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = lax.reduce_window(x, jnp.iinfo(jnp.int32).min, lax.max, *attrs[:2], ((0, 0), (1, 1), (1, 1), (0, 0)))
    np.testing.assert_array_equal(OPS["PoolMaxSliced"].lower(attrs, x), want)


GROUPED = [  # (x shape, w shape, conv attrs: strides, pads, lhs and rhs dilation, groups)
    ((2, 7, 6, 4), (3, 3, 2, 6), ConvAttrs((1, 1), (1, 1), (1, 1), (1, 1), (1, 1), 2, 1)),
    ((2, 7, 6, 4), (3, 2, 2, 4), ConvAttrs((2, 1), (0, 1), (1, 0), (1, 1), (2, 1), 2, 1)),
    ((1, 8, 8, 12), (3, 3, 3, 8), ConvAttrs((2, 2), (1, 1), (1, 1), (1, 1), (1, 1), 4, 1)),
    ((1, 5, 5, 6), (1, 1, 2, 9), ConvAttrs((1, 1), (0, 0), (0, 0), (1, 1), (1, 1), 3, 1)),
    ((2, 9, 6), (3, 2, 6), ConvAttrs((1,), (2,), (0,), (1,), (1,), 3, 1)),  # 1-D, causal
    ((1, 4, 5, 3, 4), (2, 3, 2, 2, 6), ConvAttrs((1, 2, 1), (1, 1, 0), (0, 1, 1), (2, 1, 1), (1, 1, 2), 2, 1)),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), GROUPED)
def test_patch_conv_agrees_with_grouped_conv(x_shape: tuple, w_shape: tuple, attrs: tuple):
    x, w = normal(*x_shape), normal(*w_shape)
    want = OPS["Conv"].lower(attrs, x, w)
    got = OPS["PatchConv"].lower(attrs, x, w)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("a_shape", "b_shape"), [((64, 4, 4), (64, 4, 4)), ((3, 5, 2, 7), (3, 5, 7, 1))])
def test_broadcast_batch_dot_agrees_with_batch_dot(a_shape: tuple, b_shape: tuple):
    a, b = normal(*a_shape), normal(*b_shape)
    want = jnp.einsum("...ij,...jk->...ik", a, b)
    np.testing.assert_allclose(OPS["BcastBatchDot"].lower((), a, b), want, rtol=1e-5, atol=1e-5)


def _saturated(fn: Callable[..., Any], *args: Any) -> tuple[Graph, Snapshot]:
    graph = capture(jax.make_jaxpr(fn)(*args))
    return graph, saturate(graph, collect(), Saturation(iterations=4, nodes=2000, seconds=10.0))


def test_egglog_shapes_agree_with_the_lowerings():
    # every new op the rules create gets the shape jax.eval_shape gives its lowering (and none where it is ill-typed)
    x, w, a = normal(2, 9, 8, 4), normal(3, 3, 2, 6), normal(16, 4, 3)

    def f(x: jax.Array, w: jax.Array, a: jax.Array) -> tuple:
        m = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 2, 1), (1, 2, 1, 1), ((0, 0), (1, 0), (0, 1), (0, 0)))
        s = lax.reduce_window(x, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 2, 1), "VALID")
        c = lax.conv_general_dilated(x, w, (2, 1), "SAME", rhs_dilation=(1, 2), dimension_numbers=NHWC,
                                     feature_group_count=2)  # fmt: skip
        return m, s, c, jnp.einsum("bij,bjk->bik", a, jnp.swapaxes(a, 1, 2))

    _, snapshot = _saturated(f, x, w, a)
    new = {"PoolMax", "PoolSum", "PoolMaxSliced", "PoolSumSliced", "PatchConv", "BcastBatchDot"}
    seen = set()
    for node in snapshot.nodes:
        if node.op not in new:
            continue
        seen.add(node.op)
        attrs = tuple(tuple(v) if isinstance(v, list) else v for v in node.attrs)
        avals = tuple((snapshot.shape[c], snapshot.dtype[c]) for c in node.children)
        assert snapshot.shape.get(node.eclass) == infer(node.op, attrs, avals)[0], node
    assert seen == new


def _fired(plan: eqsat.Plan) -> str:
    return plan.summary().split("rules fired")[1].split("\n")[0]


def test_library_pools_are_captured_and_rewritten():
    flax = pytest.importorskip("flax.linen")
    hk = pytest.importorskip("haiku")
    eqx = pytest.importorskip("equinox")
    x = normal(2, 12, 12, 6)
    chw = normal(6, 12, 12)

    def f(x: jax.Array, chw: jax.Array) -> tuple:
        return (
            flax.max_pool(x, (3, 3), (2, 2), "SAME"),
            flax.avg_pool(x, (3, 3), (1, 1), "SAME", count_include_pad=False),
            hk.max_pool(x, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
            hk.avg_pool(x, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
            eqx.nn.MaxPool2d(3, 2, padding=1)(chw),
            eqx.nn.AvgPool2d(2, 2)(chw),
        )

    graph = capture(jax.make_jaxpr(f)(x, chw))
    ops = [n.op for n in graph.nodes]
    assert ops.count("PoolMax") == 3 and ops.count("PoolSum") >= 4  # avg pools without padding count by a sum
    assert not any(n.op == "Op" and "reduce_window" in graph.opaque[n.attrs[0]].primitive.name for n in graph.nodes)
    fast = eqsat.optimize(f)
    for got, want in zip(fast(x, chw), jax.jit(f)(x, chw), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert "pool-max-sliced" in _fired(fast.plan(x, chw)) and "pool-sum-sliced" in _fired(fast.plan(x, chw))


def test_keras_pools_are_captured():
    if os.environ.get("KERAS_BACKEND", "jax") != "jax":
        pytest.skip("keras runs another backend here")
    os.environ["KERAS_BACKEND"] = "jax"
    keras = pytest.importorskip("keras")
    x = normal(2, 8, 8, 3)
    layers = [keras.layers.MaxPooling2D(3, 2, padding="same"), keras.layers.AveragePooling2D(2, 2)]
    graph = capture(jax.make_jaxpr(lambda x: [layer(x) for layer in layers])(x))
    assert {"PoolMax", "PoolSum"} <= {n.op for n in graph.nodes}


def test_pooled_grouped_net_rewrites_and_matches_jit():
    x, w1, w2 = normal(2, 16, 16, 8), normal(3, 3, 4, 16), normal(3, 3, 4, 16)
    a = normal(256, 4, 4)

    def net(x: jax.Array, w1: jax.Array, w2: jax.Array, a: jax.Array) -> tuple:
        y = lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=2)
        y = lax.reduce_window(jax.nn.relu(y), -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
        z = lax.conv_general_dilated(y, w2, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=4)
        z = lax.reduce_window(z, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME") / 9.0
        return jnp.mean(z, axis=(1, 2)), a @ a

    fast = eqsat.optimize(net)
    for got, want in zip(fast(x, w1, w2, a), jax.jit(net)(x, w1, w2, a), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    fired = _fired(fast.plan(x, w1, w2, a))
    for rule in ("pool-max-sliced", "pool-sum-sliced", "grouped-patches", "tiny-batchdot-broadcast"):
        assert rule in fired, fired


@pytest.mark.parametrize("op", ["PoolMax", "PoolSum"])
def test_pool_lowering_binds_the_pool_primitive_under_a_trace(op: str):
    # a traced identity would bind the generic reduce_window: slower, and not captured again as a pool
    attrs = pool_attrs((1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    jaxpr = jax.make_jaxpr(jax.jit(lambda x: OPS[op].lower(attrs, x)))(normal(1, 6, 6, 2))
    names = {e.primitive.name for e in jaxpr.jaxpr.eqns[0].params["jaxpr"].eqns}
    assert names == {"reduce_window_max" if op == "PoolMax" else "reduce_window_sum"}


NAN, INF = np.nan, np.inf
REDUCE_WINDOW = lax.reduce_window  # what jax binds, kept before a test stands in another machine's


def nan_dropping_reduce_window(x: jax.Array, init: Any, fn: Callable[..., Any], *args: Any) -> jax.Array:
    """lax.reduce_window as on a machine whose max pool drops NaNs (issue 42's XLA:CPU: no NaN where lax.max and
    numpy give 2,703; this machine's propagates them, like lax.max)."""
    if fn is lax.max and jnp.issubdtype(x.dtype, jnp.inexact):
        x = lax.select(x != x, lax.full_like(x, -INF), x)
    return REDUCE_WINDOW(x, init, fn, *args)


def special_windows() -> np.ndarray:
    """[1, 2, 2 * windows, 1]: 2x2 windows side by side, each with a NaN at every position beside finite values,
    infinities and NaNs; then all NaN, all -inf, +inf, signed zeros in each order, and ties."""
    windows = []
    for companions in ([1, 2, 3], [-INF, -INF, -INF], [INF, 1, 2], [NAN, 1, -INF], [0.0, -0.0, 5], [-7, -8, -9]):
        for p in range(4):
            windows.append([*companions[:p], NAN, *companions[p:]])
    windows += [[NAN] * 4, [-INF] * 4, [INF, -INF, 0, 1], [-0.0] * 4, [2.0] * 4]
    windows += [[0.0 if i == p else -0.0 for i in range(4)] for p in range(4)]  # one +0 among -0s, at each place
    cells = np.array(windows, np.float32).reshape(-1, 2, 2)  # [window, row, column]
    return cells.transpose(1, 0, 2).reshape(1, 2, -1, 1)


@pytest.mark.parametrize("machine", ["this one", "NaN-dropping"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_sliced_max_pool_gives_jits_answer_on_special_values(machine: str, dtype: str, monkeypatch):
    if machine == "NaN-dropping":
        monkeypatch.setattr(lax, "reduce_window", nan_dropping_reduce_window)
    specials = jnp.asarray(special_windows()).astype(dtype)
    noisy = np.array(normal(2, 9, 8, 5))
    noisy.reshape(-1)[::7] = NAN  # overlapping padded windows with NaNs
    for x, (window, strides, padding) in (
        (specials, ((1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4)),
        (jnp.asarray(noisy).astype(dtype), POOLS[0][1:]),
    ):
        attrs = pool_attrs(window, strides, padding)
        want = jax.jit(lambda x, attrs=attrs: OPS["PoolMax"].lower(attrs, x))(x)  # jax.jit's reduce_window_max
        got = jax.jit(lambda x, attrs=attrs: OPS["PoolMaxSliced"].lower(attrs, x))(x)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # -0 and +0, -inf and +inf
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("machine", ["this one", "NaN-dropping"])
def test_a_pool_plan_made_without_nans_gives_jits_answer_on_nans(decide_timings, machine: str, monkeypatch):
    # issue 42: flax's nn.max_pool(x, (2, 2), (2, 2)), planned on a first call without NaN, then called with some
    def pool(x: jax.Array) -> jax.Array:
        return REDUCE_WINDOW(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    clean = normal(4, 16, 16, 8)
    dirty = np.array(clean)
    dirty.reshape(-1)[::37] = NAN
    if machine == "NaN-dropping":  # the plan's lowerings run on that machine; capture sees reduce_window_max
        monkeypatch.setattr(lax, "reduce_window", nan_dropping_reduce_window)
    eqsat.optimize(lambda x: pool(x)).plan(clean)  # the cache holds both forms' keys
    decide_timings(alternatives_win=True)
    fast = eqsat.optimize(lambda x: pool(x))  # a function of its own: optimize(pool) would share the plan above
    fast(clean)
    assert "PoolMaxSliced" in [node.op for node in fast.plan(clean).nodes]
    want = jax.jit(lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"))(dirty)
    assert np.isnan(want).any() == (machine == "this one")
    np.testing.assert_array_equal(fast(jnp.asarray(dirty)), want)
