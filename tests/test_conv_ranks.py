"""One convolution for every rank (issue 26): a conv with 1, 2 or 3 spatial axes, any dimension numbers, padding
(causal included), lhs and rhs dilation, feature or batch groups is captured as one Conv, its egglog shape agrees
with jax's, its alternatives (shifted sum, patches, shifted weight gradient, sliced pools) compute what it does,
gradients get them, and what the table cannot model stays opaque."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.capture.jaxpr import capture
from eqsat.egraph.check import evaluate
from eqsat.egraph.rule_sources import collect
from eqsat.egraph.saturate import Saturation, saturate
from eqsat.extract.plan import BATCH_GROUPED, LHS_HOLES, PADDED_CONV
from eqsat.ops.table import OPS, ConvAttrs, infer

RNG = np.random.default_rng(26)
LAYOUTS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}
CONVS = ("Conv", "ShiftConv", "PatchConv", "ShiftConvBG", "PhaseConv", "DotConv", "PointwiseDot")

# the watched conv forms: where an inf or NaN weight or cotangent meets them otherwise than XLA's conv (issue 42)
FENCED = {"depthwise-grad-shifted", "transposed-phases", LHS_HOLES, BATCH_GROUPED, PADDED_CONV}


def normal(*shape: int) -> jax.Array:
    return jnp.asarray(RNG.standard_normal(shape), jnp.float32)


def conv(x: Any, w: Any, strides: tuple, padding: Any, groups: int, dims: tuple | None = None, **kw: Any) -> Any:
    dims = dims or LAYOUTS[len(strides)]
    return lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=dims, feature_group_count=groups, **kw)


CASES = {  # name -> (x shape, w shape, fn of (x, w))
    "1d depthwise causal": ((2, 17, 6), (4, 1, 6), lambda x, w: conv(x, w, (1,), [(3, 0)], 6)),
    "1d depthwise multiplier strided": ((1, 16, 3), (3, 1, 6), lambda x, w: conv(x, w, (2,), "SAME", 3)),
    "1d grouped NCW": ((2, 6, 11), (4, 3, 3), lambda x, w: conv(x, w, (1,), "VALID", 2, ("NCW", "OIW", "NCW"))),
    "1d transposed": ((1, 7, 4), (3, 4, 4), lambda x, w: conv(x, w, (1,), [(2, 2)], 1, lhs_dilation=(2,))),
    "2d depthwise dilated": (
        (1, 9, 8, 4), (3, 3, 1, 4), lambda x, w: conv(x, w, (1, 1), "SAME", 4, rhs_dilation=(2, 1)),
    ),
    "2d RGB stem strided": ((2, 17, 17, 3), (3, 3, 3, 8), lambda x, w: conv(x, w, (2, 2), [(0, 1), (0, 1)], 1)),
    "3d depthwise": ((1, 5, 6, 7, 4), (3, 3, 3, 1, 4), lambda x, w: conv(x, w, (1, 1, 1), "SAME", 4)),
    "3d depthwise strided lhs-dilated": (
        (1, 4, 5, 4, 3), (2, 3, 2, 1, 3),
        lambda x, w: conv(x, w, (2, 1, 1), [(1, 0), (1, 1), (0, 1)], 3, lhs_dilation=(1, 2, 1)),
    ),
    "3d grouped NCDHW": (
        (1, 4, 5, 4, 6), (4, 2, 3, 2, 3),
        lambda x, w: conv(x, w, (1, 2, 1), "SAME", 2, ("NCDHW", "OIDHW", "NCDHW")),
    ),
}  # fmt: skip


def _conv_nodes(graph: Any) -> list[ConvAttrs]:
    return [ConvAttrs(*n.attrs) for n in graph.nodes if n.op == "Conv"]


@pytest.mark.parametrize("name", CASES)
def test_a_conv_of_any_rank_is_one_conv_and_its_alternatives_agree(name: str):
    x_shape, w_shape, fn = CASES[name]
    x, w = normal(*x_shape), normal(*w_shape)
    graph = capture(jax.make_jaxpr(fn)(x, w))
    assert len(_conv_nodes(graph)) == 1 and not any(n.op == "Op" for n in graph.nodes)
    values = evaluate(graph, [x, w])
    np.testing.assert_allclose(values[graph.outputs[0]], fn(x, w), rtol=1e-5, atol=1e-5)
    node = next(n for n in graph.nodes if n.op == "Conv")
    xs = [values[i] for i in node.inputs]
    attrs = ConvAttrs(*node.attrs)
    assert infer("Conv", attrs, tuple((v.shape, "float32") for v in xs)) == (node.shape, "float32")
    want = OPS["Conv"].lower(attrs, *xs)
    alternatives = ["PhaseConv"] if attrs.lhs_dilation[0] > 1 else []
    per_group = xs[1].shape[-2]
    if attrs.feature_groups > 1 and per_group > 1:
        alternatives.append("PatchConv")
    if per_group == 1 or (per_group <= 4 and x.ndim == 4):  # a depthwise conv, a 2-d RGB stem
        alternatives.append("ShiftConv")
    for op in alternatives:
        np.testing.assert_allclose(OPS[op].lower(attrs, *xs), want, rtol=1e-5, atol=1e-5, err_msg=op)


def test_egglog_shapes_of_convs_and_pools_of_every_rank_agree_with_jax():
    x1, w1, x3, w3 = normal(2, 17, 6), normal(4, 1, 6), normal(1, 5, 6, 7, 4), normal(2, 3, 3, 2, 4)

    def f(x1: Any, w1: Any, x3: Any, w3: Any) -> tuple:
        a = conv(x1, w1, (1,), [(3, 0)], 6)
        b = conv(x3, w3, (1, 2, 1), "SAME", 2, rhs_dilation=(2, 1, 1))
        c = lax.reduce_window(x3, -jnp.inf, lax.max, (1, 2, 3, 2, 1), (1, 2, 2, 1, 1), "SAME")
        d = lax.reduce_window(x1, 0.0, lax.add, (1, 3, 1), (1, 2, 1), "VALID")
        e = lax.conv_transpose(x3, jnp.tile(w3, (1, 1, 1, 2, 1)), (2, 1, 2), "SAME", dimension_numbers=LAYOUTS[3])
        g = jax.grad(lambda w: jnp.sum(conv(x3, w, (1, 1, 1), "VALID", 1) ** 2))(jnp.ones((1, 1, 1, 4, 3)))
        return a, b, c, d, e, g, jax.grad(lambda w: jnp.sum(conv(x1, w, (2,), "SAME", 6) ** 2))(w1)

    graph = capture(jax.make_jaxpr(f)(x1, w1, x3, w3))
    snapshot = saturate(graph, collect(), Saturation(iterations=4, nodes=4000, seconds=20.0))
    seen = set()
    for node in snapshot.nodes:
        if node.op not in (*CONVS, "PoolMax", "PoolSum", "PoolMaxSliced", "PoolSumSliced"):
            continue
        seen.add(node.op)
        attrs = tuple(tuple(v) if isinstance(v, list) else v for v in node.attrs)
        avals = tuple((snapshot.shape[c], snapshot.dtype[c]) for c in node.children)
        assert snapshot.shape.get(node.eclass) == infer(node.op, attrs, avals)[0], node
    assert seen >= {*CONVS, "PoolMaxSliced", "PoolSumSliced"}


def test_value_and_grad_of_1d_and_3d_depthwise_nets_get_the_shifted_kernels(decide_timings):
    x1, w1 = normal(2, 32, 8), normal(4, 1, 8) * 0.5
    x3, w3 = normal(1, 6, 8, 8, 4), normal(3, 3, 3, 1, 4) * 0.3

    def loss(x1: Any, w1: Any, x3: Any, w3: Any) -> Any:
        temporal = jax.nn.silu(conv(x1, w1, (1,), [(3, 0)], 8))  # causal, as Mamba's
        volume = jnp.tanh(conv(x3, w3, (2, 1, 1), "SAME", 4))
        pooled = lax.reduce_window(volume, 0.0, lax.add, (1, 2, 2, 2, 1), (1, 2, 2, 2, 1), "VALID") / 8
        return jnp.sum(temporal**2) + jnp.sum(pooled**2)

    plan = _planned_with_alternatives_winning(
        jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), (x1, w1, x3, w3), decide_timings
    )
    assert plan.fallback is None
    kernels = sorted(n.op for n in plan.nodes if n.op in CONVS)
    # two forward convs and their input gradients shifted (the strided one's may take its phases), both weight
    # gradients shifted: no XLA conv left
    assert kernels in (["ShiftConv"] * 4 + ["ShiftConvBG"] * 2, ["PhaseConv"] + ["ShiftConv"] * 3 + ["ShiftConvBG"] * 2)
    assert "PoolSumSliced" in {n.op for n in plan.nodes}
    assert set(plan.overflow_watch) <= FENCED  # only the forms that meet an inf weight otherwise than XLA's conv


@pytest.mark.parametrize(
    "params",
    [{"precision": lax.Precision.HIGHEST}, {"preferred_element_type": jnp.float32}],
    ids=["precision", "preferred_element_type"],
)
def test_a_conv_the_table_cannot_model_stays_opaque(params: dict):
    x, w = normal(2, 17, 6), normal(4, 1, 6)

    def f(x: Any, w: Any) -> Any:
        return conv(x, w, (1,), [(3, 0)], 6, **params)

    graph = capture(jax.make_jaxpr(f)(x, w))
    assert not _conv_nodes(graph)
    assert [graph.opaque[n.attrs[0]].primitive.name for n in graph.nodes if n.op == "Op"] == ["conv_general_dilated"]
    np.testing.assert_allclose(eqsat.optimize(f)(x, w), jax.jit(f)(x, w), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("stride", [2, 3])
def test_the_phases_of_a_transposed_conv_compute_it(rank: int, stride: int):
    # every kernel size against the stride, and padding that pads, crops or both: phases with no tap or no output
    n = 5 if rank < 3 else 3
    for k in range(1, 5):
        for low, high in ((0, 0), (k - 1, k - 1), (1, 2), (-1, 0), (2, -1)):
            x, w = normal(2, *(n,) * rank, 4), normal(*(k,) * rank, 2, 6)
            attrs = ConvAttrs((1,) * rank, (low,) * rank, (high,) * rank, (stride,) * rank, (1,) * rank, 2, 1)
            shape = infer("Conv", attrs, ((x.shape, "float32"), (w.shape, "float32")))
            if shape is None:  # the window does not fit
                continue
            got, want = OPS["PhaseConv"].lower(attrs, x, w), OPS["Conv"].lower(attrs, x, w)
            assert got.shape == want.shape == shape[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{k} {low} {high}")


def test_a_flax_conv_transpose_decoder_gets_the_phase_form(decide_timings):
    nn = pytest.importorskip("flax.linen")

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            for channels in (16, 8):
                x = nn.relu(nn.ConvTranspose(channels, (4, 4), strides=(2, 2), padding="SAME")(x))
            return x

    x = normal(2, 8, 8, 16)
    params = Decoder().init(jax.random.PRNGKey(0), x)
    eqsat.optimize(Decoder().apply).plan(params, x)
    decide_timings(alternatives_win=True)
    fast = eqsat.optimize(lambda p, x: Decoder().apply(p, x))
    np.testing.assert_allclose(fast(params, x), jax.jit(Decoder().apply)(params, x), rtol=1e-5, atol=1e-5)
    assert [n.op for n in fast.plan(params, x).nodes if n.op in CONVS] == ["PhaseConv"] * 2


def test_the_weight_gradients_of_1x1_convs_of_every_rank_are_one_matrix_product(decide_timings):
    """A 1x1 conv's weight gradient is a conv whose window covers its whole input: DotConv, one dot_general over
    its spatial and batch axes; a strided or padded 1x1 conv's is not (its window does not cover the input)."""
    (x1, w1), (x3, w3), (x2, w2) = _pointwise_operands()

    def loss(w1: Any, w3: Any, w2: Any) -> Any:
        pointwise = jnp.tanh(conv(x1, w1, (1,), "VALID", 1)) + jnp.sum(jnp.tanh(conv(x3, w3, (1, 1, 1), "VALID", 1)))
        strided = jnp.tanh(conv(x2, w2, (2, 2), "VALID", 1))
        return jnp.sum(pointwise**2) + jnp.sum(strided**2)

    plan = _planned_with_alternatives_winning(jax.grad(loss, argnums=(0, 1, 2)), (w1, w3, w2), decide_timings)
    assert plan.rules_fired["whole-window-dot"] == 2 and sum(n.op == "DotConv" for n in plan.nodes) == 2
    assert set(plan.overflow_watch) <= FENCED  # only the forms that meet an inf weight otherwise than XLA's conv


def test_1x1_convs_of_every_rank_are_one_matrix_product_over_the_channels(decide_timings):
    """A 1x1 conv (stride 1, unpadded) is PointwiseDot, one dot_general over the channels; a strided one is not."""
    (x1, w1), (x3, w3), (x2, w2) = _pointwise_operands()

    def layers(x1: Any, x3: Any, x2: Any) -> tuple:
        strided = conv(x2, w2, (2, 2), "VALID", 1)
        return jnp.tanh(conv(x1, w1, (1,), "VALID", 1)), jnp.tanh(conv(x3, w3, (1, 1, 1), "VALID", 1)), strided

    plan = _planned_with_alternatives_winning(layers, (x1, x3, x2), decide_timings)
    assert plan.rules_fired["pointwise-conv-dot"] == 2
    assert sorted(n.op for n in plan.nodes if n.op in CONVS) == ["Conv", "PointwiseDot", "PointwiseDot"]
    assert set(plan.overflow_watch) <= FENCED  # only the forms that meet an inf weight otherwise than XLA's conv


def _pointwise_operands() -> tuple:
    """Inputs and 1x1 kernels of rank 1 and 3 (stride 1 in the tests) and of rank 2 (strided in the tests)."""
    return (
        (normal(2, 16, 6), normal(1, 6, 5) * 0.5),
        (normal(2, 4, 6, 6, 3), normal(1, 1, 1, 3, 4) * 0.5),
        (normal(2, 8, 8, 6), normal(1, 1, 6, 4) * 0.5),  # 6 channels: not an RGB stem
    )


def _planned_with_alternatives_winning(step: Any, args: tuple, decide_timings: Any) -> Any:
    """The plan of step once every kernel it measured is priced so that the alternatives win, its results compared
    with jax.jit's."""
    limits = eqsat.Limits(seconds=300, measure_seconds=300)  # a loaded machine must not cut saturation short
    eqsat.optimize(step, limits=limits).plan(*args)
    decide_timings(alternatives_win=True)
    fast = eqsat.optimize(lambda *a: step(*a), limits=limits)
    got, want = fast(*args), jax.jit(step)(*args)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-4 * float(jnp.max(jnp.abs(a))))
    return fast.plan(*args)
