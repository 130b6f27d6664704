"""Kernel selection for one-hot embeddings: one_hot(ids) @ table as a gather (Take) and, on the gradient side,
one_hot(ids).T @ cotangent as a scatter-add (ScatterRows), whichever the timing cache says is faster; ids out of
range, negative and repeated ones included."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.capture.jaxpr import capture
from eqsat.egraph.check import evaluate
from eqsat.ops.table import OPS

VOCAB, WIDTH = 50, 8
# repeated ids, ids past the end and negative ones (one_hot gives them an all-zero row)
IDS = jnp.asarray([[3, 0, 49, 3], [50, -1, 7, 3], [120, -50, 7, 0]], jnp.int32)
TABLE = jnp.asarray(np.random.default_rng(0).standard_normal((VOCAB, WIDTH)), jnp.float32)


def _loss(table: Any, ids: Any) -> Any:
    return jnp.sum(jnp.tanh(jax.nn.one_hot(ids, VOCAB, dtype=table.dtype) @ table) ** 2)


STEP = jax.value_and_grad(_loss)


@pytest.mark.parametrize("rows_shape", [(12,), (12, 5), (12, 2, 3)])
def test_scatter_rows_is_the_transposed_one_hot_contraction(rows_shape: tuple[int, ...]):
    rows = jnp.asarray(np.random.default_rng(1).standard_normal(rows_shape), jnp.float32)
    ids = IDS.reshape(-1)
    want = jnp.tensordot(jax.nn.one_hot(ids, VOCAB), rows, axes=((0,), (0,)))
    got = OPS["ScatterRows"].lower((VOCAB,), rows, ids)
    assert got.shape == want.shape == (VOCAB, *rows_shape[1:])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_table_gradient_is_captured_as_a_contraction_and_lowers_as_jax_computes_it():
    grad = jax.grad(_loss)
    graph = capture(jax.make_jaxpr(grad)(TABLE, IDS))
    primitives = {graph.op_name(n.op, n.attrs) for n in graph.nodes}
    assert "dot_general" not in primitives  # both contractions are Dots: the backward one over the token axes
    assert [n.op for n in graph.nodes].count("Dot") == 2
    values = evaluate(graph, (TABLE, IDS))
    np.testing.assert_allclose(values[graph.outputs[0]], grad(TABLE, IDS), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("alternatives_win", [True, False])
def test_the_timing_cache_picks_scatter_or_contraction_for_the_gradient(decide_timings, alternatives_win):
    eqsat.optimize(lambda *args: STEP(*args)).plan(TABLE, IDS)  # measures: the cache holds every rival's key
    assert decide_timings(alternatives_win) == {"Dot", "Take", "ScatterRows"}
    fast = eqsat.optimize(lambda *args: STEP(*args))
    got, want = fast(TABLE, IDS), jax.jit(STEP)(TABLE, IDS)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    plan = fast.plan(TABLE, IDS)
    assert plan.fallback is None and plan.stats["timing_measured"] == 0
    assert plan.rules_fired["one-hot-transposed-scatter"] >= 1
    ops = [node.op for node in plan.nodes]
    if alternatives_win:
        assert "ScatterRows" in ops and "Take" in ops and "Dot" not in ops and "OneHot" not in ops
    else:
        assert "ScatterRows" not in ops and "Take" not in ops and ops.count("Dot") == 2


def test_scatter_rows_keeps_its_dtype_and_drops_every_id_out_of_range():
    rows = jnp.ones((4, 3), jnp.bfloat16)
    got = OPS["ScatterRows"].lower((2,), rows, jnp.asarray([-1, 2, 1, 1], jnp.int32))
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), [[0, 0, 0], [2, 2, 2]])
