"""Alternative kernel implementations: other ways to compute an op of the op table that XLA runs faster on some
devices and shapes (eqsat/ops.py's entries marked `alternative` lower through these; rules/kernels.egg puts each
beside the op it can replace, and the timing cache chooses)."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax


def repeated_channels(x: Any, out_channels: int) -> Any:
    """NHWC x with each channel repeated out_channels / C times: with a channel multiplier m, output channel o
    reads input channel o // m."""
    n, h, wd, channels = x.shape
    if out_channels == channels:
        return x
    m = out_channels // channels
    return lax.reshape(lax.broadcast_in_dim(x, (n, h, wd, channels, m), (0, 1, 2, 3)), (n, h, wd, out_channels))


def accumulating(x: Any) -> Any:
    """x in the dtype sums accumulate in: bf16/f16 accumulate in f32, as XLA's conv kernels do."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def spatially_padded(x: Any, pads: tuple[int, int, int, int]) -> Any:
    pt, pb, pl, pr = pads
    return lax.pad(x, lax.full((), 0, x.dtype), [(0, 0, 0), (pt, pb, 0), (pl, pr, 0), (0, 0, 0)])


def shifted_conv(attrs: tuple, x: Any, w: Any) -> Any:
    """A depthwise convolution (one input channel per group) as a sum of shifted, strided slices of the padded
    input times weight rows: XLA fuses it into one loop, where XLA:CPU's depthwise kernel runs far below roofline."""
    kh, kw, _, out_channels = w.shape
    xa = accumulating(repeated_channels(x, out_channels))
    total = None
    for (i, j), tap in conv_taps(attrs, xa, kh, kw):
        tap = tap * w[i, j, 0].astype(xa.dtype)
        total = tap if total is None else total + tap
    return total.astype(x.dtype)


def conv_taps(attrs: tuple, x: Any, kh: int, kw: int) -> list[tuple[tuple[int, int], Any]]:
    """The kernel offsets (i, j) of an NHWC conv with these attributes, each with the strided slice of the padded
    input it multiplies: [n, ho, wo, channels]."""
    sh, sw, pt, pb, pl, pr, dh, dw, _groups = attrs
    xp = spatially_padded(x, (pt, pb, pl, pr))
    ho = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    taps = []
    for i in range(kh):
        for j in range(kw):
            limit = (x.shape[0], i * dh + sh * (ho - 1) + 1, j * dw + sw * (wo - 1) + 1, x.shape[3])
            taps.append(((i, j), lax.slice(xp, (0, i * dh, j * dw, 0), limit, (1, sh, sw, 1))))
    return taps


def shifted_conv_bg(attrs: tuple, x: Any, w: Any) -> Any:
    """A ConvBG with one batch row per group, the weight gradient of a depthwise conv, as one fused
    multiply-reduction per output position. In canonical terms x is (C, H, W, N) (the forward input, batch and
    channels swapped) and w (kh', kw', N, O) (the output cotangent); out[0, i, j, o] = sum over n, h, v of
    xpad[n, i*sh + h*dh, j*sw + v*dw, o // m] * g[n, h, v, o], m = O / C. XLA:CPU's batch-grouped kernel is as slow
    as its depthwise one."""
    sh, sw, pt, pb, pl, pr, dh, dw, _groups = attrs
    kh, kw, n, out_channels = w.shape
    nhwc = lax.transpose(x, (3, 1, 2, 0))
    xp = spatially_padded(accumulating(repeated_channels(nhwc, out_channels)), (pt, pb, pl, pr))
    g = lax.transpose(w, (2, 0, 1, 3)).astype(xp.dtype)  # (N, kh', kw', O)
    ho = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    rows = []
    for i in range(ho):
        for j in range(wo):
            start = (0, i * sh, j * sw, 0)
            limit = (n, i * sh + dh * (kh - 1) + 1, j * sw + dw * (kw - 1) + 1, out_channels)
            rows.append(lax.reduce_sum(lax.slice(xp, start, limit, (1, dh, dw, 1)) * g, (0, 1, 2)))
    return lax.reshape(jnp.stack(rows), (1, ho, wo, out_channels)).astype(x.dtype)


def take_rows(_attrs: tuple, table: Any, ids: Any) -> Any:
    """Rows of `table` by index, zero where the index is out of range: what one_hot(ids) @ table computes."""
    rows = jnp.take(table, ids, axis=0, mode="fill", fill_value=0)
    return jnp.where((ids >= 0)[..., None], rows, jnp.zeros((), table.dtype))


def scatter_rows(attrs: tuple, rows: Any, ids: Any) -> Any:
    """A zero table of `depth` rows with rows[n] added into row ids[n]: what one_hot(ids, depth).T @ rows computes,
    an embedding's gradient. An id outside [0, depth) adds nothing, as its one-hot row is all zeros; jnp's indexing
    would wrap a negative one, so every such id is sent past the end, where mode="drop" drops it."""
    (depth,) = attrs
    table = jnp.zeros((depth, *rows.shape[1:]), rows.dtype)
    return table.at[jnp.where((ids >= 0) & (ids < depth), ids, depth)].add(rows, mode="drop")


def masked_arg_reduce(attrs: tuple, x: Any) -> Any:
    """The same index as the first position holding the max (min): a max, then a min of the positions equal to it,
    two fused reductions where XLA:CPU's one (value, index) reduction runs 6-10x slower (benches/RESULTS.md). A NaN
    is the extreme, as for lax.argmax: the max is then NaN, and the first NaN's position is taken."""
    kind, axis, index_dtype = attrs
    extreme = (lax.reduce_max if kind == "max" else lax.reduce_min)(x, (axis,))
    hit = x == lax.broadcast_in_dim(extreme, x.shape, tuple(d for d in range(x.ndim) if d != axis))
    if jnp.issubdtype(x.dtype, jnp.inexact):
        hit = hit | (x != x)
    positions = lax.broadcasted_iota(np.dtype(index_dtype), x.shape, axis)
    past_end = lax.full(x.shape, x.shape[axis], np.dtype(index_dtype))
    return lax.reduce_min(lax.select(hit, positions, past_end), (axis,))


def pool_init(fn: str, dtype: Any) -> Any:
    """The identity a window pads with: 0 for a sum, the lowest value (-inf for floats) for a max. A numpy scalar:
    lax.reduce_window binds reduce_window_max / _sum only for a concrete identity, a traced one stays generic."""
    if fn == "sum":
        return np.zeros((), dtype)
    return np.array(-np.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


def sliced_pool(fn: str) -> Callable[..., Any]:
    """The same window reduction as a max / sum over one strided slice of the padded input per window offset:
    XLA fuses it into one loop, where XLA:CPU's reduce_window runs 2-5x slower (DESIGN.md §2b)."""

    def lower(attrs: tuple, x: Any) -> Any:
        window, strides, low, high = (tuple(a) for a in attrs)
        xp = lax.pad(x, pool_init(fn, x.dtype), [(lo, hi, 0) for lo, hi in zip(low, high, strict=True)])
        out = tuple((size - k) // s + 1 for size, k, s in zip(xp.shape, window, strides, strict=True))
        total = None
        for offset in np.ndindex(*window):
            limit = tuple(o + s * (n - 1) + 1 for o, s, n in zip(offset, strides, out, strict=True))
            tap = lax.slice(xp, tuple(int(o) for o in offset), limit, strides)
            total = tap if total is None else (lax.max(total, tap) if fn == "max" else lax.add(total, tap))
        return total

    return lower


def patch_conv(attrs: tuple, x: Any, w: Any) -> Any:
    """A grouped convolution (several input channels per group) as the kh*kw shifted, strided slices of the padded
    input stacked and one contraction batched over the groups; XLA:CPU's grouped conv kernel is sometimes slower."""
    groups = attrs[8]
    kh, kw, cg, out_channels = w.shape
    taps = [tap for _, tap in conv_taps(attrs, x, kh, kw)]
    n, ho, wo, _ = taps[0].shape
    og = out_channels // groups
    patches = lax.reshape(jnp.stack(taps, axis=3), (n, ho, wo, kh * kw, groups, cg))
    kernel = lax.reshape(w, (kh * kw, cg, groups, og))
    # contract taps and channels, batched over groups: [g, n, ho, wo, og]
    dtype = jnp.result_type(x.dtype, w.dtype)
    acc = jnp.promote_types(dtype, jnp.float32)  # bf16/f16 accumulate in f32 as the conv kernel does, f64 in f64
    y = lax.dot_general(patches, kernel, (((3, 5), (0, 1)), ((4,), (2,))), preferred_element_type=acc)
    y = lax.transpose(y, (1, 2, 3, 0, 4))
    return lax.reshape(y, (n, ho, wo, out_channels)).astype(dtype)


def broadcast_batch_dot(_attrs: tuple, a: Any, b: Any) -> Any:
    """A batched matmul of tiny matrices as a broadcast multiply and a sum over the contracted axis: one fused loop,
    where XLA:CPU runs one small GEMM per batch element."""
    n = a.ndim
    left = lax.expand_dims(a, (n,))  # [B..., M, K, 1]
    right = lax.expand_dims(b, (n - 2,))  # [B..., 1, K, N]
    return lax.reduce_sum(lax.mul(left, right), (n - 1,))
