"""Alternative kernel implementations: other ways to compute an op of the op table that XLA runs faster on some
devices and shapes (eqsat/ops/table.py's entries marked `alternative` lower through these; rules/kernels.egg puts each
beside the op it can replace, and the timing cache chooses)."""

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from math import prod
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

if TYPE_CHECKING:
    from eqsat.ops.table import ArgReduceAttrs, ConvAttrs, PoolAttrs

Shape = tuple[int, ...]
# the name scope of each check for values out of range and the fallback it decides on (the overflow watch's,
# backends/lower.py, and the one-hot kernels' below): eqsat/plans/sharding.py leaves their collectives out
OVERFLOW_WATCH = "eqsat_overflow_watch"
# set while a plan is lowered for its figures alone (common_path): the checks its fallbacks would decide on
_COMMON_PATH_CHECKS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("eqsat_common_path")


@contextlib.contextmanager
def common_path() -> Iterator[list[Any]]:
    """Lower without the fallbacks that run only on values out of range or not finite (kept_unless's loops, the
    max pool's recomputation): what an ordinary call runs, for XLA's static cost analysis, which counts a fallback's
    body as if it ran. Yields the checks that decide on them, traced values a caller returns from the program it
    traces (they run on every call). For tpu-check's figures, never for a program that runs."""
    checks: list[Any] = []
    token = _COMMON_PATH_CHECKS.set(checks)
    try:
        yield checks
    finally:
        _COMMON_PATH_CHECKS.reset(token)


def _on_common_path(check: Any) -> bool:
    """Under common_path: keep the check and say so (the caller builds no fallback)."""
    checks = _COMMON_PATH_CHECKS.get(None)
    if checks is not None:
        checks.append(check)
    return checks is not None


def conv_dimension_numbers(rank: int) -> lax.ConvDimensionNumbers:
    """The layout every Conv of the op table is in, for any number of spatial axes: x (batch, spatial..., features),
    w (spatial..., in, out), the output as x. Capture transposes other layouts into it (XLA folds the transposes)."""
    spatial = tuple(range(1, rank - 1))
    return lax.ConvDimensionNumbers(
        (0, rank - 1, *spatial), (rank - 1, rank - 2, *range(rank - 2)), (0, rank - 1, *spatial)
    )


def conv(a: "ConvAttrs", x: Any, w: Any) -> Any:
    """The convolution itself (lax.conv_general_dilated in the table's layout)."""
    return lax.conv_general_dilated(
        x,
        w,
        a.strides,
        tuple(zip(a.pad_low, a.pad_high, strict=True)),
        a.lhs_dilation,
        a.rhs_dilation,
        conv_dimension_numbers(x.ndim),
        feature_group_count=a.feature_groups,
        batch_group_count=a.batch_groups,
    )


def repeated_channels(x: Any, out_channels: int) -> Any:
    """x with each channel (its last axis) repeated out_channels / C times: with a channel multiplier m, output
    channel o reads input channel o // m."""
    channels = x.shape[-1]
    if out_channels == channels:
        return x
    m = out_channels // channels
    return lax.reshape(lax.broadcast_in_dim(x, (*x.shape, m), tuple(range(x.ndim))), (*x.shape[:-1], out_channels))


def accumulating(x: Any) -> Any:
    """x in the dtype sums accumulate in: bf16/f16 accumulate in f32, as XLA's conv kernels do; integers in their own
    type, as XLA's do."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def conv_input(a: "ConvAttrs", x: Any) -> Any:
    """x as the convolution's window sees it: lhs-dilated (zeros between neighbours) and padded along the spatial
    axes, in one lax.pad (negative padding crops)."""
    spatial = [(lo, hi, d - 1) for lo, hi, d in zip(a.pad_low, a.pad_high, a.lhs_dilation, strict=True)]
    return lax.pad(x, lax.full((), 0, x.dtype), [(0, 0, 0), *spatial, (0, 0, 0)])


def window_taps(
    x: Any, window: Shape, strides: Shape, dilation: Shape | None = None, out: Shape | None = None
) -> Iterator[tuple[tuple[int, ...], Any]]:
    """Each offset of a window sliding over every axis of x (already padded), with the strided slice of x it reads at
    every window position: out[p] of the result at offset k is x[p * stride + k * dilation]. `out`: how many
    positions per axis (default: as many as fit)."""
    dilation = dilation or (1,) * x.ndim
    if out is None:
        out = tuple(
            (n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(x.shape, window, strides, dilation, strict=True)
        )
    for offset in np.ndindex(*window):
        start = tuple(int(k) * d for k, d in zip(offset, dilation, strict=True))
        limit = tuple(b + s * (n - 1) + 1 for b, s, n in zip(start, strides, out, strict=True))
        yield tuple(int(k) for k in offset), lax.slice(x, start, limit, strides)


def _conv_taps(a: "ConvAttrs", x: Any, kernel: Shape) -> Iterator[tuple[tuple[int, ...], Any]]:
    """The kernel's spatial offsets, each with the slice of the conv's input it multiplies: [n, out..., channels]."""
    for offset, tap in window_taps(conv_input(a, x), (1, *kernel, 1), (1, *a.strides, 1), (1, *a.rhs_dilation, 1)):
        yield offset[1:-1], tap


def shifted_conv(a: "ConvAttrs", x: Any, w: Any) -> Any:
    """A convolution of few input channels per group (a depthwise conv's one, an RGB stem's three), any rank, as a sum
    of shifted, strided slices of the padded input times weight rows, one per tap and input channel of the group:
    XLA fuses it into one loop, where XLA:CPU's depthwise kernel runs one to three orders of magnitude below roofline
    (docs/kernel-gaps.md) and its conv kernel vectorizes three input channels poorly."""
    *kernel, per_group, out_channels = w.shape
    total = None
    for c in range(per_group):
        # input channel c of each group; output channel o reads its group's: (o // (O / groups)) * per_group + c
        xc = accumulating(lax.slice_in_dim(x, c, None, per_group, axis=x.ndim - 1))
        if per_group == 1:  # a depthwise conv's channels repeated once, before slicing (1.1x faster with a multiplier)
            xc = repeated_channels(xc, out_channels)
        for offset, tap in _conv_taps(a, xc, kernel):
            # a few channels' taps repeated after slicing, so that XLA broadcasts each in the loop (3x faster for an
            # RGB stem); a no-op where they were repeated before
            term = repeated_channels(tap, out_channels) * w[(*offset, c)].astype(xc.dtype)
            total = term if total is None else total + term
    return total.astype(x.dtype)


def patch_conv(a: "ConvAttrs", x: Any, w: Any) -> Any:
    """A grouped convolution (several input channels per group) of any rank as the kernel's shifted, strided slices
    of the padded input stacked and one contraction batched over the groups; XLA:CPU's grouped conv kernel is
    sometimes slower."""
    groups = a.feature_groups
    *kernel, per_group, out_channels = w.shape
    taps = [tap for _, tap in _conv_taps(a, x, kernel)]
    n, *out, _ = taps[0].shape
    r, k = len(out), prod(kernel)
    patches = lax.reshape(jnp.stack(taps, axis=r + 1), (n, *out, k, groups, per_group))
    weights = lax.reshape(w, (k, per_group, groups, out_channels // groups))
    dtype = jnp.result_type(x.dtype, w.dtype)
    acc = jnp.promote_types(dtype, jnp.float32)  # bf16/f16 accumulate in f32 as the conv kernel does, f64 in f64
    # contract taps and channels, batched over groups: [groups, n, out..., out_channels / groups]
    y = lax.dot_general(patches, weights, (((r + 1, r + 3), (0, 1)), ((r + 2,), (2,))), preferred_element_type=acc)
    y = lax.transpose(y, (1, *range(2, r + 2), 0, r + 2))
    return lax.reshape(y, (n, *out, out_channels)).astype(dtype)


def dot_conv(_a: "ConvAttrs", x: Any, w: Any) -> Any:
    """A conv whose window covers its whole input (unpadded, undilated, one group: every spatial axis of its output
    is 1) as one matrix product, out[b, 1..., o] = sum over s, i of x[b, s, i] * w[s, i, o]: the weight gradient of
    a 1x1 conv, which XLA:CPU's conv kernel runs 2-6x slower than its GEMM (benches/RESULTS.md, session 16)."""
    r = x.ndim
    y = _accumulated_dot(x, w, (tuple(range(1, r)), tuple(range(r - 1))))
    return lax.reshape(y, (x.shape[0], *(1,) * (r - 2), w.shape[-1]))


def pointwise_dot(_a: "ConvAttrs", x: Any, w: Any) -> Any:
    """A 1x1 conv (stride 1, unpadded, undilated, one group) as one matrix product over the channels, out[b, s, o] =
    sum over i of x[b, s, i] * w[1..., i, o]: XLA:CPU's conv kernel runs the pointwise convs of MobileNet and
    EfficientNet 1.1-1.6x slower than its GEMM (benches/RESULTS.md, session 17)."""
    return _accumulated_dot(x, lax.reshape(w, w.shape[-2:]), ((x.ndim - 1,), (0,)))


def _accumulated_dot(x: Any, w: Any, contracting: tuple[tuple[int, ...], tuple[int, ...]]) -> Any:
    """dot_general of x and w over these axes, accumulated as the conv kernel does (bf16 and f16 in f32, f64 in f64),
    in their result type."""
    dtype = jnp.result_type(x.dtype, w.dtype)
    acc = jnp.promote_types(dtype, jnp.float32)
    return lax.dot_general(x, w, (contracting, ((), ())), preferred_element_type=acc).astype(dtype)


def bg_operand_layouts(rank: int) -> tuple[Shape, Shape]:
    """The axis orders shifted_conv_bg transposes its operands into first: the forward input (C, S..., N) back to
    (N, S..., C), the cotangent (K..., N, O) back to (N, K..., O). Capture made both from these orders (jax's
    layouts -> the table's), so in a program XLA folds each pair of transposes."""
    return (rank - 1, *range(1, rank - 1), 0), (rank - 2, *range(rank - 2), rank - 1)


def shifted_conv_bg(a: "ConvAttrs", x: Any, w: Any) -> Any:
    """A conv with one batch row per batch group (the weight gradient of a depthwise conv), of any rank, as one fused
    multiply-reduction per output position. x is the forward input with batch and channels swapped, (C, S..., N),
    and w the output cotangent as a kernel, (K..., N, O); out[0, p, o] = sum over n, k of
    xpad[n, p * stride + k * dilation, o // m] * g[n, k, o], m = O / C. XLA:CPU's batch-grouped kernel is as slow as
    its depthwise one."""
    *kernel, _, out_channels = w.shape
    rank = x.ndim
    x_order, w_order = bg_operand_layouts(rank)
    forward = lax.transpose(x, x_order)  # (N, S..., C)
    xp = conv_input(a, accumulating(repeated_channels(forward, out_channels)))
    g = lax.transpose(w, w_order).astype(xp.dtype)  # (N, K..., O)
    out = tuple(
        (n - d * (k - 1) - 1) // s + 1
        for n, k, s, d in zip(xp.shape[1:-1], kernel, a.strides, a.rhs_dilation, strict=True)
    )
    # the output positions are the offsets of a window of the output's size, dilated by the stride, whose slices step
    # by the forward dilation over the kernel's extent
    positions = window_taps(
        xp, (1, *out, 1), (1, *a.rhs_dilation, 1), (1, *a.strides, 1), (xp.shape[0], *kernel, xp.shape[-1])
    )
    rows = [lax.reduce_sum(tap * g, tuple(range(rank - 1))) for _, tap in positions]
    return lax.reshape(jnp.stack(rows), (1, *out, out_channels)).astype(x.dtype)


def all_finite(x: Any) -> Any:
    """Whether every element of x is finite, by its float32 sum: inf or NaN where any element is (or where finite
    elements' sum overflows: then false, for a check that only picks a slower exact path). One reduction (64 MB:
    2.4 ms); x * 0 before it, exact where a sum overflows, made XLA:CPU write the product out first (27 ms)."""
    return jnp.isfinite(jnp.sum(x, dtype=jnp.float32))


def kept_unless(ok: Any, results: list[Any], fallback: Callable[[], list[Any]]) -> list[Any]:
    """results where ok, else fallback()'s, as a loop that runs the fallback at most once: a lax.cond whose branch
    passes `results` through copies each of them (XLA:CPU, 80 ms for a 262 MB gradient), a loop's carry stays in
    place. Under common_path: results alone."""
    if _on_common_path(ok):
        return results

    def fall_back(_: tuple) -> tuple:
        return [lax.convert_element_type(v, r.dtype) for v, r in zip(fallback(), results, strict=True)], True

    kept, _ = lax.while_loop(lambda carry: jnp.logical_not(carry[1]), fall_back, (results, ok))
    return kept


def _one_hot_product_unless_finite(operand: Any, fast: Any, one_hot_product: Callable[[], Any]) -> Any:
    """fast where `operand` is finite, else the one-hot product itself: jax.jit's dot multiplies every zero of the
    one-hot by every element, so an inf or NaN anywhere in a column makes the whole column NaN (0 x inf), which no
    gather or scatter computes. One pass over the operand, where the product would read it for every row. In the
    overflow watch's name scope: its check's all-reduce and the product's loop are not collectives a sharded plan
    adds (eqsat/plans/sharding.py collectives); fast, computed by the caller, stays outside the loop, where XLA joins
    its all-reduce with the program's."""
    with jax.named_scope(OVERFLOW_WATCH):
        return kept_unless(all_finite(operand), [fast], lambda: [one_hot_product()])[0]


def take_rows(_attrs: tuple, table: Any, ids: Any) -> Any:
    """Rows of `table` by index, zero where the index is out of range: what one_hot(ids) @ table computes, the
    product itself where the table holds an inf or NaN."""

    def gathered() -> Any:
        rows = jnp.take(table, ids, axis=0, mode="fill", fill_value=0)
        return jnp.where((ids >= 0)[..., None], rows, jnp.zeros((), table.dtype))

    return _one_hot_product_unless_finite(
        table, gathered(), lambda: jax.nn.one_hot(ids, table.shape[0], dtype=table.dtype) @ table
    )


def scatter_rows(attrs: tuple, rows: Any, ids: Any) -> Any:
    """A zero table of `depth` rows with rows[n] added into row ids[n]: what one_hot(ids, depth).T @ rows computes,
    an embedding's gradient (the product itself where the rows hold an inf or NaN). An id outside [0, depth) adds
    nothing, as its one-hot row is all zeros; jnp's indexing would wrap a negative one, so every such id is sent past
    the end, where mode="drop" drops it."""
    (depth,) = attrs

    def scattered() -> Any:
        table = jnp.zeros((depth, *rows.shape[1:]), rows.dtype)
        return table.at[jnp.where((ids >= 0) & (ids < depth), ids, depth)].add(rows, mode="drop")

    def product() -> Any:
        return jnp.tensordot(jax.nn.one_hot(ids, depth, dtype=rows.dtype), rows, axes=(0, 0))

    return _one_hot_product_unless_finite(rows, scattered(), product)


# The fill value of a pick outside [0, depth): NaN is jnp.take_along_axis's own, 0 what a one-hot row sum gives
PICK_FILLS = {"nan": float("nan"), "zero": 0.0}


def along_last_axis(rank: int) -> tuple[lax.GatherDimensionNumbers, lax.ScatterDimensionNumbers]:
    """The dimension numbers of jnp.take_along_axis along the last axis of a rank-`rank` array (the leading axes
    batch axes, one index per position), and of its transpose, the scatter-add of its gradient."""
    batch, last = tuple(range(rank - 1)), (rank - 1,)
    return (
        lax.GatherDimensionNumbers((), last, last, operand_batching_dims=batch, start_indices_batching_dims=batch),
        lax.ScatterDimensionNumbers((), last, last, operand_batching_dims=batch, scatter_indices_batching_dims=batch),
    )


def take_along(attrs: tuple, x: Any, ids: Any) -> Any:
    """(TakeAlong fill x ids): x[..., ids[..., k]] for x [B..., V] and ids [B..., K] (B... the same), `fill` where an
    id is outside [0, V): the gather of jnp.take_along_axis(x, ids, -1, mode="fill"), less its wrapping of negative
    ids (capture keeps that in the ids)."""
    (fill,) = attrs
    gather, _ = along_last_axis(x.ndim)
    return lax.gather(
        x, ids[..., None], gather, (1,) * x.ndim, mode=lax.GatherScatterMode.FILL_OR_DROP, fill_value=PICK_FILLS[fill]
    )


def put_along(_attrs: tuple, x: Any, ids: Any, updates: Any) -> Any:
    """(PutAlong x ids updates): x with updates[..., k] added at x[..., ids[..., k]], ids outside [0, V) dropped: the
    scatter-add of take_along's gradient."""
    _, scatter = along_last_axis(x.ndim)
    return lax.scatter_add(x, ids[..., None], updates, scatter, mode=lax.GatherScatterMode.FILL_OR_DROP)


def keep_in_range(attrs: tuple, x: Any, ids: Any) -> Any:
    """(KeepInRange depth x ids): x where 0 <= ids < depth, else 0: a one-hot row's sum of x, which is x at the id
    and nothing where the id is out of range."""
    (depth,) = attrs
    return jnp.where((ids >= 0) & (ids < depth), x, jnp.zeros((), x.dtype))


def masked_arg_reduce(a: "ArgReduceAttrs", x: Any) -> Any:
    """The index lax.argmax (argmin) gives, as a max (min) and a min over positions: two fused reductions where
    XLA:CPU's one (value, index) reduction runs 6-10x slower (benches/RESULTS.md). The first NaN wins where a row
    holds one, else the first position equal to the extreme (-0 equals +0). Whether the extreme of a row with a NaN
    is NaN is the machine's: XLA:CPU's reduce_max drops NaNs on some (issue 42: a finite max before the NaN won), so
    the extreme is trusted on NaN-free rows only: a NaN at p is coded p, the extreme at p coded n + p, and one min
    of the codes takes a NaN first."""
    axis, n = a.axis, x.shape[a.axis]
    codes = np.dtype(np.int32 if 2 * n < np.iinfo(np.int32).max else np.int64)
    extreme = (lax.reduce_max if a.kind == "max" else lax.reduce_min)(x, (axis,))
    hit = x == lax.broadcast_in_dim(extreme, x.shape, tuple(d for d in range(x.ndim) if d != axis))
    positions = lax.broadcasted_iota(codes, x.shape, axis)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return lax.reduce_min(lax.select(hit, positions, lax.full(x.shape, n, codes)), (axis,)).astype(a.index_dtype)
    later = lax.select(hit, positions + np.array(n, codes), lax.full(x.shape, 2 * n, codes))
    first = lax.reduce_min(lax.select(x != x, positions, later), (axis,))
    return lax.select(first < n, first, first - np.array(n, codes)).astype(a.index_dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def softmax(axis: int, x: Any) -> Any:
    """exp(x - m) / sum(exp(x - m)) with m the largest finite element (0 where none is): jax.nn.softmax subtracts
    the largest element, so a row holding +inf is NaN throughout (inf - inf), where the naive form the rule
    replaces gives 0 beside the NaN; with m finite every special value meets the naive form's arithmetic.
    Where x == m the exponent is 0 by a select, not by x - m: XLA contracts a product that makes x into an FMA with
    the subtraction in one fusion and rounds it in the max's, so x - m was the product's rounding error, at 1e12 as
    much as -65536, and a row's every exponent underflowed to 0 / 0 (fuzz seed 2054, case 9941)."""
    top = jnp.max(jnp.where(jnp.isfinite(x), x, -jnp.inf), axis, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0)
    exp = jnp.exp(jnp.where(x == top, 0, x - top))
    return exp / jnp.sum(exp, axis, keepdims=True)


@softmax.defjvp
def _softmax_jvp(axis: int, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    """Softmax's derivative, y * (dx - sum(y * dx)): the select above would give the largest element none."""
    (x,), (dx,) = primals, tangents
    y = softmax(axis, x)
    return y, y * (dx - jnp.sum(y * dx, axis, keepdims=True))


def pool_init(fn: str, dtype: Any) -> Any:
    """The identity a window pads with: 0 for a sum, the lowest value (-inf for floats) for a max. A numpy scalar:
    lax.reduce_window binds reduce_window_max / _sum only for a concrete identity, a traced one stays generic."""
    if fn == "sum":
        return np.zeros((), dtype)
    return np.array(-np.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


def window_pool(fn: str, a: "PoolAttrs", x: Any) -> Any:
    """reduce_window of lax.max / lax.add over (window, strides, pad_low, pad_high): what jax binds as the
    reduce_window_max / reduce_window_sum primitives (flax, keras, haiku and equinox pools)."""
    padding = tuple(zip(a.pad_low, a.pad_high, strict=True))
    return lax.reduce_window(
        x, pool_init(fn, x.dtype), lax.max if fn == "max" else lax.add, a.window, a.strides, padding
    )


def sliced_pool(fn: str) -> Callable[..., Any]:
    """The same window reduction, of any rank, as a max / sum over one strided slice of the padded input per window
    offset: XLA fuses it into one loop, where XLA:CPU's reduce_window runs 2-5x slower (docs/kernel-gaps.md).
    A float max pool whose result holds a NaN is computed again as reduce_window: what that makes of a NaN is the
    machine's (issue 42: one returned no NaN where lax.max, which propagates them, returned 2,703), so jax.jit's
    answer is computed, not guessed. A NaN-free result means NaN-free windows, where the two agree (infinities, and
    +0 above -0: tests/test_pools.py)."""

    def lower(a: "PoolAttrs", x: Any) -> Any:
        xp = lax.pad(x, pool_init(fn, x.dtype), [(lo, hi, 0) for lo, hi in zip(a.pad_low, a.pad_high, strict=True)])
        xp = xp if fn == "max" else accumulating(xp)  # a float16 sum of large terms overflows midway where f32 does not
        total = None
        for _, tap in window_taps(xp, a.window, a.strides):
            total = tap if total is None else (lax.max(total, tap) if fn == "max" else lax.add(total, tap))
        total = total.astype(x.dtype)
        if fn != "max" or not jnp.issubdtype(x.dtype, jnp.inexact):
            return total
        # NaN seen through a sum: XLA:CPU's any() of a boolean array ran 3x the pool's time, a sum 0.3x; it is NaN
        # wherever an element is (and where +inf and -inf meet: reduce_window then runs, as exact). A cond, not a
        # select: a NaN-free call runs the sliced loop alone.
        nan_seen = jnp.isnan(lax.reduce_sum(accumulating(total), tuple(range(total.ndim))))
        if _on_common_path(nan_seen):
            return total
        return lax.cond(nan_seen, lambda: window_pool(fn, a, x), lambda: total)

    return lower


def broadcast_batch_dot(_attrs: tuple, a: Any, b: Any) -> Any:
    """A batched matmul of tiny matrices as a broadcast multiply and a sum over the contracted axis: one fused loop,
    where XLA:CPU runs one small GEMM per batch element."""
    n = a.ndim
    left = lax.expand_dims(accumulating(a), (n,))  # [B..., M, K, 1]; bf16/f16 in f32, as XLA's dot
    right = lax.expand_dims(accumulating(b), (n - 2,))  # [B..., 1, K, N]
    return lax.reduce_sum(lax.mul(left, right), (n - 1,)).astype(jnp.result_type(a.dtype, b.dtype))


def _phase_axis(p: int, s: int, low: int, n: int, k: int, out: int) -> tuple[slice, tuple[int, int, int], int, int]:
    """Phase p of an axis dilated by s: the kernel taps it reads (k0, k0 + s, ...), the padding (negative: a crop)
    of the undilated input that a stride-1 conv with those taps needs, how many outputs it has and how many taps."""
    first = (low - p) % s
    base = (p - low + first) // s  # the input position its first output's first tap reads
    count = max(0, -(-(out - p) // s))
    length = len(range(first, k, s))
    return slice(first, None, s), (-base, count + length - 1 - n + base, 0), count, length


def phase_conv(a: "ConvAttrs", x: Any, w: Any) -> Any:
    """A convolution with lhs_dilation s (a transposed conv, a strided conv's input gradient) as its s^d phases:
    output position s*q + p reads only the kernel taps k with (p + k - pad_low) divisible by s, so each phase is a
    stride-1 conv of the undilated input with the kernel's taps k0, k0 + s, ... (no multiplications by the
    inserted zeros), and the phases interleave (depth to space). Strided or rhs-dilated windows run as the conv."""
    if any(s != 1 for s in (*a.strides, *a.rhs_dilation)):
        return conv(a, x, w)
    d, kernel, dilation = x.ndim - 2, w.shape[:-2], a.lhs_dilation
    spatial = tuple(zip(x.shape[1:-1], dilation, a.pad_low, a.pad_high, kernel, strict=True))
    out = tuple((n - 1) * s + 1 + lo + hi - k + 1 for n, s, lo, hi, k in spatial)
    longest = tuple(-(-o // s) for o, s in zip(out, dilation, strict=True))  # ceil(out / s)
    stride_one = a._replace(lhs_dilation=(1,) * d, pad_low=(0,) * d, pad_high=(0,) * d)
    shape = (x.shape[0] // a.batch_groups, *longest, w.shape[-1])
    phases = []
    for phase in np.ndindex(*dilation):
        axes = [_phase_axis(p, s, lo, n, k, o) for p, (n, s, lo, _, k), o in zip(phase, spatial, out, strict=True)]
        if any(count == 0 or length == 0 for _, _, count, length in axes):
            phases.append(jnp.zeros(shape, jnp.result_type(x.dtype, w.dtype)))
            continue
        shifted = lax.pad(x, lax.full((), 0, x.dtype), [(0, 0, 0), *(pad for _, pad, _, _ in axes), (0, 0, 0)])
        y = conv(stride_one, shifted, w[(*(taps for taps, _, _, _ in axes), slice(None), slice(None))])
        # a phase with fewer outputs than the longest gets zeros at its end, sliced off after interleaving
        ends = [(0, q - count, 0) for (_, _, count, _), q in zip(axes, longest, strict=True)]
        phases.append(lax.pad(y, lax.full((), 0, y.dtype), [(0, 0, 0), *ends, (0, 0, 0)]))
    stacked = lax.reshape(jnp.stack(phases), (*dilation, *shape))  # (s..., N, Q..., O)
    perm = (d, *(axis for i in range(d) for axis in (d + 1 + i, i)), 2 * d + 1)  # (N, Q1, s1, Q2, s2, ..., O)
    whole = (shape[0], *(q * s for q, s in zip(longest, dilation, strict=True)), shape[-1])
    interleaved = lax.reshape(lax.transpose(stacked, perm), whole)
    return lax.slice(interleaved, (0,) * (d + 2), (shape[0], *out, shape[-1]))
