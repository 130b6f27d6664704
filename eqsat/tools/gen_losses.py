"""Generators of random cross-entropy losses and their gradients (rules/losses.egg): the label's log-probability
picked with take_along_axis or summed against a one-hot row, labels drawn from a float input (negative and
out-of-range ones included, which take_along_axis wraps or fills with NaN and one_hot turns into a row of zeros)."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from hypothesis import strategies as st
from jax import lax

from eqsat.tools.program import DrawFn, Program, dims


def _labels(v: Any, depth: int) -> Any:
    return jnp.floor(v * depth).astype(jnp.int32)


def _log_probs(x: Any, softmax: bool) -> Any:
    return jax.nn.log_softmax(x) if softmax else x


def _picked(x: Any, v: Any, fill: str, softmax: bool) -> Any:
    """The label's (log-)probability per row, as take_along_axis (fill "nan": its own; "zero": mode="fill") or as a
    one-hot row sum ("one_hot"), [B..., 1]."""
    labels, depth = _labels(v, x.shape[-1]), x.shape[-1]
    if fill == "one_hot":
        return jnp.sum(jax.nn.one_hot(labels, depth, dtype=x.dtype) * _log_probs(x, softmax), -1, keepdims=True)
    mode = {"nan": {}, "zero": {"mode": "fill", "fill_value": 0}}[fill]
    return jnp.take_along_axis(_log_probs(x, softmax), labels[..., None], -1, **mode)


def _rows(draw: DrawFn, prog: Program) -> tuple[int, int]:
    """Logits [B..., V] (rank 1-3, V 1-6) and a float input the labels [B...] are drawn from."""
    x = prog.fresh(dims(draw, draw(st.integers(1, 3))))
    return x, prog.fresh(prog.shapes[x][:-1])


def _loss(fill: str, grad: bool) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_loss(draw, prog, fill, grad)


def _gen_loss(draw: DrawFn, prog: Program, fill: str, grad: bool) -> int:
    """The pick of log_softmax(x) (or of x) at the labels; with grad, the gradient with respect to x of the picks
    weighted per row (the scatter-add or one-hot rows of the cotangent, through log_softmax's gradient)."""
    x, v = _rows(draw, prog)
    softmax = grad or draw(st.booleans())
    label = f"{'grad_' * grad}pick_{fill}{'_log_softmax' * softmax}"
    if not grad:
        return prog.apply(label, lambda a, b: _picked(a, b, fill, softmax), x, v)
    weights = prog.fresh((*prog.shapes[v], 1))

    def gradient(a: Any, b: Any, w: Any) -> Any:
        return jax.grad(lambda a: jnp.sum(_picked(a, b, fill, softmax) * w))(a)

    return prog.apply(label, gradient, x, v, weights)


def _gen_row_broadcast(draw: DrawFn, prog: Program) -> int:
    """A one-hot row sum of a value per row broadcast along the last axis, kept [B..., 1] or from [B...]: what a
    one-hot cotangent's row sums are."""
    x, v = _rows(draw, prog)
    shape, keep = prog.shapes[x], draw(st.booleans())
    r = prog.fresh((*shape[:-1], 1) if keep else shape[:-1])

    def row_sum(b: Any, c: Any) -> Any:
        rows = jnp.broadcast_to(c, shape) if keep else lax.broadcast_in_dim(c, shape, tuple(range(len(shape) - 1)))
        return jnp.sum(jax.nn.one_hot(_labels(b, shape[-1]), shape[-1], dtype=c.dtype) * rows, -1)

    return prog.apply(f"one_hot_row_sum_of_{'kept' if keep else 'flat'}_rows", row_sum, v, r)


LOSSES: dict[str, Callable[[DrawFn, Program], int]] = {
    "TakeAlong": _loss("nan", grad=False),
    "TakeAlong-zero": _loss("zero", grad=False),
    "one-hot-loss": _loss("one_hot", grad=False),
    "PutAlong": _loss("nan", grad=True),
    "KeepInRange": _loss("one_hot", grad=True),
    "one-hot-row-broadcast": _gen_row_broadcast,
}
