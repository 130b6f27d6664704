"""Cross-entropy losses (issue 26 item 4): take_along_axis along the last axis and its gradient's scatter-add are
captured as TakeAlong / PutAlong, and rules/losses.egg rewrites the pick of a log_softmax (take_along_axis, or a
one-hot row sum as optax and keras write it) so that the log-probabilities are never computed, gradients too; the
plans give jax.jit's values, large logits and labels out of range included."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqsat
from eqsat.capture.jaxpr import capture
from eqsat.ops.kernels import keep_in_range, put_along, take_along

DEPTH = 1000  # large enough that the cost model sees the passes saved


def _take(x: jax.Array, y: jax.Array) -> jax.Array:
    return -jnp.take_along_axis(jax.nn.log_softmax(x), y[..., None], -1).mean()


def _one_hot(x: jax.Array, y: jax.Array) -> jax.Array:
    return -jnp.sum(jax.nn.one_hot(y, x.shape[-1]) * jax.nn.log_softmax(x), -1).mean()


def _optax_one_hot(x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy(x, jax.nn.one_hot(y, x.shape[-1])).mean()


def _masked(x: jax.Array, y: jax.Array) -> jax.Array:
    """A padded batch's loss: the mean over the labels that are not padding (-1)."""
    mask = (y >= 0).astype(x.dtype)
    picked = jnp.take_along_axis(jax.nn.log_softmax(x), jnp.maximum(y, 0)[..., None], -1)[..., 0]
    return -(picked * mask).sum() / mask.sum()


FORMS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "take": _take,
    "one_hot": _one_hot,
    "optax_one_hot": _optax_one_hot,
    "masked": _masked,
}


def _inputs(scale: float = 1.0, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(scale * rng.standard_normal((2, 32, DEPTH)), jnp.float32)
    labels = rng.integers(0, DEPTH, (2, 32))
    labels[0, :2] = -1  # padding in the masked form
    return logits, jnp.asarray(labels, jnp.int32)


def _check(fn: Callable[..., Any], args: tuple, rtol: float = 2e-6) -> eqsat.Plan:
    fast = eqsat.optimize(fn)
    got, want = fast(*args), jax.jit(fn)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(jnp.nanmax(jnp.abs(w))))
    plan = fast.plan(*args)
    assert plan.fallback is None
    return plan


@pytest.mark.parametrize("form", FORMS)
def test_the_loss_picks_the_label_without_the_log_softmax(form: str):
    plan = _check(FORMS[form], _inputs())
    rewritten = plan.rewritten_ops()
    assert rewritten.get("TakeAlong") and rewritten.get("LogSumExp"), rewritten
    assert not [n for n in plan.nodes if n.op == "Sub" and n.shape == (2, 32, DEPTH)]  # no log-probabilities


@pytest.mark.parametrize("form", FORMS)
def test_its_gradient_sums_no_row_of_the_cotangent(form: str):
    """value_and_grad with respect to the logits: the label's pick and the cotangent's row sums (the one-hot rows
    or the scattered ones, whose sums are the cotangent where the label is in range) come without a full pass."""
    plan = _check(jax.value_and_grad(FORMS[form]), _inputs())
    assert plan.rewritten_ops().get("KeepInRange"), plan.rewritten_ops()
    full = [n for n in plan.nodes if n.op in ("Neg", "ReduceSum") and n.shape == (2, 32, DEPTH)]
    assert not full


@pytest.mark.parametrize("form", ["take", "one_hot"])
def test_large_logits_give_jax_jits_values(form: str):
    """Logits of order 1e4, where exp of them overflows: the plan subtracts the row's max as the original does."""
    args = _inputs(scale=1e4)
    _check(FORMS[form], args, rtol=1e-6)
    value, grad = eqsat.optimize(jax.value_and_grad(FORMS[form]))(*args)
    want_value, want_grad = jax.jit(jax.value_and_grad(FORMS[form]))(*args)
    assert np.isfinite(value) and np.isfinite(np.asarray(grad)).all()
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-9)


def test_labels_out_of_range_keep_their_meaning():
    """take_along_axis wraps -1 to the last class and fills NaN past the end; one_hot of either is a row of zeros,
    which adds nothing to the loss; neither adds anything to the gradient."""
    logits, labels = _inputs()
    labels = labels.at[0, 0].set(-1).at[1, 3].set(DEPTH + 5)
    take_rows = lambda x, y: jnp.take_along_axis(jax.nn.log_softmax(x), y[..., None], -1)[..., 0]  # noqa: E731
    one_hot_rows = lambda x, y: jnp.sum(jax.nn.one_hot(y, DEPTH) * jax.nn.log_softmax(x), -1)  # noqa: E731
    for rows in (take_rows, one_hot_rows):  # the loss of each position
        assert _check(rows, (logits, labels)).rewritten_ops().get("TakeAlong")
        _check(jax.value_and_grad(lambda x, y, rows=rows: rows(x, y).sum()), (logits, labels))
    assert np.isnan(eqsat.optimize(_take)(logits, labels))  # as jax.jit: the label past the end is NaN


def test_the_picks_lower_as_jax_computes_them():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 5)), jnp.float32)
    ids = jnp.asarray([[[0], [4], [5]], [[-1], [2], [3]]], jnp.int32)
    picked = take_along(("nan",), x, ids)
    np.testing.assert_array_equal(picked[0, :2, 0], [x[0, 0, 0], x[0, 1, 4]])
    assert np.isnan(picked[0, 2, 0]) and np.isnan(picked[1, 0, 0])  # out of range, -1 not wrapped
    assert float(take_along(("zero",), x, ids)[1, 0, 0]) == 0.0
    scattered = put_along((), jnp.zeros_like(x), ids, jnp.ones((2, 3, 1)))
    assert float(scattered.sum()) == 4.0 and float(scattered[0, 1, 4]) == 1.0  # two ids out of range dropped
    np.testing.assert_array_equal(keep_in_range((5,), jnp.ones((2, 3, 1)), ids)[..., 0], [[1, 1, 0], [0, 1, 1]])


def test_take_along_axis_and_its_gradient_are_captured():
    logits, labels = _inputs()
    graph = capture(jax.make_jaxpr(jax.value_and_grad(_take))(logits, labels))
    ops = [node.op for node in graph.nodes]
    assert "TakeAlong" in ops and "PutAlong" in ops
    assert not [o for o in graph.opaque if o.primitive.name in ("gather", "scatter-add")]


@pytest.mark.parametrize(
    "other",
    [
        lambda x, i: jnp.take_along_axis(x, i[..., None], -1, mode="clip"),  # clipped, not filled
        lambda x, i: jnp.take_along_axis(x, i[..., None] % 2, 0),  # along another axis
        lambda x, i: jnp.take(x, i, axis=0),  # rows of a table
    ],
)
def test_other_gathers_stay_opaque(other: Callable[..., Any]):
    x, ids = _inputs()
    graph = capture(jax.make_jaxpr(other)(x, ids))
    assert "TakeAlong" not in [node.op for node in graph.nodes]
    fast = eqsat.optimize(other)
    np.testing.assert_array_equal(fast(x, ids), jax.jit(other)(x, ids))
