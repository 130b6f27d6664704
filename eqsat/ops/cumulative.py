"""Cumulative ops (lax.cumsum, cumprod, cummax, cummin, cumlogsumexp) and their blocked two-level form.

XLA:CPU lowers a cumulative op along an axis of length n to a reduce_window whose window is the whole axis: each
output element reads every element before it, n^2 / 2 combines per row. The blocked form cumulates within blocks
of b elements (b combines per element), cumulates the n / b block totals the same way, and combines each block
with the total of the blocks before it (docs/kernel-gaps.md: 4-4.6x on a cumsum over 1024). The op table
(eqsat/ops/table.py) captures the primitives as (Cumulative kind axis reverse x) and rules/kernels.egg puts
(CumulativeBlocked kind axis reverse block x) beside it at a few block sizes, which the timing cache prices.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np
from jax import lax

if TYPE_CHECKING:
    from eqsat.ops.table import BlockedCumulativeAttrs, CumulativeAttrs

# kind -> the lax cumulative op, the reduction it cumulates and how two partial results combine
_SCANS: dict[str, Callable[..., Any]] = {
    "sum": lax.cumsum,
    "prod": lax.cumprod,
    "max": lax.cummax,
    "min": lax.cummin,
    "logsumexp": lax.cumlogsumexp,
}
_COMBINE: dict[str, Callable[[Any, Any], Any]] = {
    "sum": lax.add,
    "prod": lax.mul,
    "max": lax.max,
    "min": lax.min,
    "logsumexp": jnp.logaddexp,
}
KINDS = tuple(_SCANS)
PRIMITIVES = {f"cum{kind}": kind for kind in KINDS}  # the jax primitive of each kind: cumsum -> "sum"


def identity(kind: str, dtype: Any) -> np.ndarray:
    """The element that combines with any x to x: a numpy scalar of dtype."""
    dtype = np.dtype(dtype)
    floating = jnp.issubdtype(dtype, jnp.inexact)
    if kind == "sum":
        return np.zeros((), dtype)
    if kind == "prod":
        return np.ones((), dtype)
    if kind in ("max", "logsumexp"):
        return np.array(-np.inf if floating else jnp.iinfo(dtype).min, dtype)
    return np.array(np.inf if floating else jnp.iinfo(dtype).max, dtype)


def _scan(kind: str) -> Callable[..., Any]:
    if kind not in _SCANS:
        raise ValueError(f"a cumulative op of kind {kind!r}: the kinds are {', '.join(KINDS)}")
    return _SCANS[kind]


def cumulative(a: "CumulativeAttrs", x: Any) -> Any:
    """(Cumulative kind axis reverse x): the lax primitive of that kind along the axis, backwards if reverse."""
    return _scan(a.kind)(x, a.axis, bool(a.reverse))


def _unrolled(x: Any, axis: int, reverse: bool, combine: Callable[[Any, Any], Any]) -> Any:
    """The cumulation along a short axis as a chain of combines of its slices, concatenated: XLA fuses it into one
    loop, where its reduce_window of the same window runs 2-3x slower (benches/RESULTS.md, issue 26)."""
    parts = [lax.slice_in_dim(x, k, k + 1, axis=axis) for k in range(x.shape[axis])]
    if reverse:
        parts.reverse()
    running = [parts[0]]
    for part in parts[1:]:
        running.append(combine(running[-1], part))
    if reverse:
        running.reverse()
    return lax.concatenate(running, axis)


def blocked(a: "BlockedCumulativeAttrs", x: Any) -> Any:
    """(CumulativeBlocked kind axis reverse block x): the same values, cumulated within blocks of `block` elements
    along the axis (unrolled), each block then combined with the total of the blocks before it (after it, if
    reverse). The axis is padded at its end to whole blocks with the kind's identity, which changes no output
    element before it."""
    kind, axis, reverse, block = a.kind, a.axis, a.reverse, a.block
    scan = _scan(kind)
    if not 0 <= axis < x.ndim or block < 1:
        raise ValueError(f"CumulativeBlocked along axis {axis} of {x.shape} in blocks of {block}")
    n = x.shape[axis]
    blocks = -(-n // block)
    pad = [(0, 0, 0)] * x.ndim
    pad[axis] = (0, blocks * block - n, 0)
    padded = lax.pad(x, identity(kind, x.dtype), pad)
    split = lax.reshape(padded, (*x.shape[:axis], blocks, block, *x.shape[axis + 1 :]))
    combine = _COMBINE[kind]
    within = _unrolled(split, axis + 1, bool(reverse), combine)
    # each block's total is its own cumulation's last element (first, if reverse)
    totals = lax.index_in_dim(within, 0 if reverse else block - 1, axis + 1, keepdims=False)
    running = scan(totals, axis, bool(reverse))
    # what the blocks before each one combine to: the running totals shifted by one block, the identity first
    shift = [(0, 0, 0)] * totals.ndim
    shift[axis] = (-1, 1, 0) if reverse else (1, -1, 0)
    before = lax.pad(running, identity(kind, x.dtype), shift)
    out = combine(within, lax.expand_dims(before, (axis + 1,)))
    return lax.slice_in_dim(lax.reshape(out, padded.shape), 0, n, axis=axis)
