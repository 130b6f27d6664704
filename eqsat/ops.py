"""The op table: every IR op is declared here once.

Each entry gives the egglog constructor (attributes, then tensor inputs), the egglog rules that derive the
output shape from the input shapes (a node whose shape guard fails gets no shape and is never extracted),
how the op is priced (its cost class), how it lowers to `jax.lax`, which jax primitives capture as it (and how
their parameters become its attributes), and which attributes `rules check` may draw for it. Capture, the egglog
prelude, the cost model, lowering and `rules check` all read this table; a new op is one entry.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache, partial
from math import prod
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat.backends import cumulative

Shape = tuple[int, ...]


class CostClass(StrEnum):
    """How the cost model prices an op (extract/cost.py has one pricing function per class)."""

    SOURCE = "source"  # an input or a constant: nothing to compute
    CONTRACTION = "contraction"  # flops against the roofline, or measured by the timing cache
    ELEMENTWISE = "elementwise"  # fused by XLA: slices and concats too
    BITCAST = "bitcast"  # a row-major reshape: XLA moves no data
    GATHER = "gather"  # reads the rows it returns
    WINDOW = "window"  # a pooling pass: reads its input once, writes its output
    REDUCTION = "reduction"  # an index-returning reduction (argmax) or a cumulative op: reads its input once
    OPAQUE = "opaque"  # a primitive the table does not model: one pass over its data


def _quoted(name: str) -> str:
    if '"' in name or "\\" in name:
        raise ValueError(f"an attribute string may not hold quotes or backslashes: {name!r}")
    return f'"{name}"'


@dataclass(frozen=True)
class Sort:
    """An attribute's egglog sort, and how a value of it is written to egglog, read back from a serialized e-graph's
    literal (an int, a str, or a tuple of the ints a vec holds) and to and from JSON: every place that moves an
    attribute goes through its sort."""

    name: str
    python: type  # also reads a value back from a serialized e-graph's literal (int, str, tuple of ints)
    to_egglog: Callable[[Any], str]
    to_json: Callable[[Any], Any]
    from_json: Callable[[Any], Any]

    def value(self, attr: Any) -> Any:
        """attr as this sort's Python value (numpy integers are ints); a TypeError where it is not one."""
        if self.python is int and isinstance(attr, int | np.integer) and not isinstance(attr, bool):
            return int(attr)
        if self.python is tuple and isinstance(attr, tuple | list):
            return tuple(SORTS["i64"].value(d) for d in attr)
        if self.python is str and isinstance(attr, str):
            return attr
        raise TypeError(f"{attr!r} is not a value of sort {self.name}")


SORTS: dict[str, Sort] = {
    sort.name: sort
    for sort in (
        Sort("i64", int, lambda v: str(int(v)), int, int),
        Sort("String", str, _quoted, str, str),
        Sort("Shape", tuple, lambda v: f"(vec-of {' '.join(str(int(d)) for d in v)})" if v else "(vec-empty)",
             lambda v: [int(d) for d in v], tuple),
    )
}  # fmt: skip


@dataclass(frozen=True)
class OpSpec:
    name: str  # egglog constructor name
    attrs: tuple[str, ...]  # egglog sorts of the leading attribute arguments
    arity: int  # tensor inputs after the attributes
    cost_class: CostClass  # given as the enum or its value; anything else fails when the table is built
    lower: Callable[..., Any] | None  # lower(attrs, *inputs) -> jax value; None for the structural ops
    shape_rules: tuple[str, ...] = ()  # egglog rule bodies; `e` is the node, `sa`/`sb` input shapes
    primitives: tuple[str, ...] = ()  # jax primitives captured as this op
    contracted: Callable[[list[Shape]], int] | None = None  # contraction length per output element
    epilogue: bool = False  # bias and activation on the output: free where the target runs them in the GEMM
    dtype_rule: str | None = None  # egglog rule body setting (dtype e); None: the first input's dtype
    alternative: bool = False  # another implementation of an op, put beside it by rules/kernels.egg
    # a captured primitive's parameters -> this op's attributes (None: not this op); for primitives with parameters
    # that no special capture in eqsat/capture.py handles. Without it only parameterless primitives are captured.
    capture_params: Callable[[dict[str, Any]], tuple | None] | None = None
    # the attribute tuples `rules check` may draw for an input of this shape (all inputs share it); ops without a
    # hand-written generator in eqsat/generators.py are drawn from it (no attributes: the op on random inputs)
    example_attrs: Callable[[Shape], list[tuple]] | None = None
    declaration: str | None = None  # egglog declaration, for a structural op that is not a plain constructor
    # (attrs, input shapes) -> what siblings reading the same first input must share for a merge rule to join
    # them (their place among those siblings goes to egglog: see encode.prelude); None: not mergeable
    merge_key: Callable[[tuple, list[Shape | None]], tuple | None] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost_class", CostClass(self.cost_class))
        unknown = [sort for sort in self.attrs if sort not in SORTS]
        if unknown:
            raise ValueError(f"op {self.name}: attribute sort(s) {unknown} unknown; the sorts are {sorted(SORTS)}")

    def sorts(self, attrs: tuple | list) -> list[Sort]:
        if len(attrs) != len(self.attrs):
            raise TypeError(f"{self.name} takes {len(self.attrs)} attribute(s) {self.attrs}, got {len(attrs)}")
        return [SORTS[sort] for sort in self.attrs]

    def attrs_from_egraph(self, values: tuple) -> tuple:
        """Attributes read back from a serialized e-graph (once per e-node, so without the checks of `value`)."""
        return tuple(sort.python(v) for sort, v in zip(self.sorts(values), values, strict=True))

    def attrs_to_egglog(self, attrs: tuple) -> list[str]:
        return [sort.to_egglog(sort.value(a)) for sort, a in zip(self.sorts(attrs), attrs, strict=True)]

    def attrs_to_json(self, attrs: tuple) -> list[Any]:
        return [sort.to_json(sort.value(a)) for sort, a in zip(self.sorts(attrs), attrs, strict=True)]

    def attrs_from_json(self, values: list[Any]) -> tuple:
        return tuple(sort.from_json(v) for sort, v in zip(self.sorts(values), values, strict=True))

    @property
    def structural(self) -> bool:
        """An input or an opaque call or projection: in the e-graph, never lowered through the table."""
        return self.lower is None

    def signature(self) -> str:
        return " ".join((*self.attrs, *("Tensor",) * self.arity))

    def pattern(self) -> str:
        """The egglog term that matches this op with variables k0.. for attributes and a, b for inputs."""
        names = [f"k{i}" for i in range(len(self.attrs))] + ["a", "b", "c"][: self.arity]
        return f"({self.name} {' '.join(names)})"


def contraction_flops(op: str, in_shapes: list[Shape], out_shape: Shape) -> int:
    """A multiply and an add per output element and contracted index."""
    contracted = OPS[op].contracted
    assert contracted is not None, f"{op} is not a contraction"
    return 2 * prod(out_shape) * contracted(in_shapes)


_SAME = "(rule ((= e {pat}) (= sa (shape a)) (= sb (shape b)) (= sa sb)) ((set (shape e) sa)))"
_SCALAR_RIGHT = "(rule ((= e {pat}) (= sa (shape a)) (= sb (shape b)) (= (vec-length sb) 0)) ((set (shape e) sa)))"
_SCALAR_LEFT = "(rule ((= e {pat}) (= sa (shape a)) (= sb (shape b)) (= (vec-length sa) 0)) ((set (shape e) sb)))"
_UNARY = "(rule ((= e {pat}) (= sa (shape a))) ((set (shape e) sa)))"
_BINARY_RULES = (_SAME, _SCALAR_RIGHT, _SCALAR_LEFT)


def _binary(name: str, fn: Callable[..., Any], primitive: str) -> OpSpec:
    def lower(_attrs: tuple, a: Any, b: Any) -> Any:
        # the shape rules' semantics: equal shapes or a scalar side (lax itself also broadcasts size-1 axes)
        if jnp.shape(a) != jnp.shape(b) and jnp.ndim(a) and jnp.ndim(b):
            raise TypeError(f"{name} of shapes {jnp.shape(a)} and {jnp.shape(b)}")
        return fn(a, b)

    return OpSpec(name, (), 2, "elementwise", lower, _BINARY_RULES, (primitive,))


def _unary(name: str, fn: Callable[..., Any], primitive: str) -> OpSpec:
    return OpSpec(name, (), 1, "elementwise", lambda _attrs, a: fn(a), (_UNARY,), (primitive,))


def _matrix_transpose(x: Any) -> Any:
    n = x.ndim
    return lax.transpose(x, (*range(n - 2), n - 1, n - 2))


def _dot(_attrs: tuple, a: Any, b: Any) -> Any:
    return lax.dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())))


# (Dense activation x w b): activation(x @ w + b), what rules/fusion.egg groups a GEMM, its bias and activation into
ACTIVATIONS: dict[str, Callable[[Any], Any]] = {
    "none": lambda y: y,
    "relu": lambda y: lax.max(y, lax.full((), 0, y.dtype)),
    "tanh": lax.tanh,
    "logistic": lax.logistic,
}


def _dense(attrs: tuple, x: Any, w: Any, b: Any) -> Any:
    y = _dot((), x, w)
    return ACTIVATIONS[attrs[0]](lax.add(y, lax.broadcast_in_dim(b, y.shape, (y.ndim - 1,))))


def _batch_dot(_attrs: tuple, a: Any, b: Any) -> Any:
    batch = tuple(range(a.ndim - 2))
    return lax.dot_general(a, b, (((a.ndim - 1,), (a.ndim - 2,)), (batch, batch)))


CONV_DIMS = ("NHWC", "HWIO", "NHWC")


def _conv(attrs: tuple, x: Any, w: Any, group_param: str = "feature_group_count") -> Any:
    """Conv, or with group_param="batch_group_count" ConvBG (a grouped conv's weight gradient: batch group g of x
    feeds output group g)."""
    sh, sw, pt, pb, pl, pr, dh, dw, groups = attrs
    return lax.conv_general_dilated(
        x,
        w,
        (sh, sw),
        ((pt, pb), (pl, pr)),
        rhs_dilation=(dh, dw),
        dimension_numbers=CONV_DIMS,
        **{group_param: groups},
    )


def _repeated_channels(x: Any, out_channels: int) -> Any:
    """NHWC x with each channel repeated out_channels / C times: with a channel multiplier m, output channel o
    reads input channel o // m."""
    n, h, wd, channels = x.shape
    if out_channels == channels:
        return x
    m = out_channels // channels
    return lax.reshape(lax.broadcast_in_dim(x, (n, h, wd, channels, m), (0, 1, 2, 3)), (n, h, wd, out_channels))


def _accumulating(x: Any) -> Any:
    """x in the dtype sums accumulate in: bf16/f16 accumulate in f32, as XLA's conv kernels do."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _spatially_padded(x: Any, pads: tuple[int, int, int, int]) -> Any:
    pt, pb, pl, pr = pads
    return lax.pad(x, lax.full((), 0, x.dtype), [(0, 0, 0), (pt, pb, 0), (pl, pr, 0), (0, 0, 0)])


def _shifted_conv(attrs: tuple, x: Any, w: Any) -> Any:
    """A depthwise convolution (one input channel per group) as a sum of shifted, strided slices of the padded
    input times weight rows: XLA fuses it into one loop, where XLA:CPU's depthwise kernel runs far below roofline."""
    kh, kw, _, out_channels = w.shape
    xa = _accumulating(_repeated_channels(x, out_channels))
    total = None
    for (i, j), tap in _conv_taps(attrs, xa, kh, kw):
        tap = tap * w[i, j, 0].astype(xa.dtype)
        total = tap if total is None else total + tap
    return total.astype(x.dtype)


def _conv_taps(attrs: tuple, x: Any, kh: int, kw: int) -> list[tuple[tuple[int, int], Any]]:
    """The kernel offsets (i, j) of an NHWC conv with these attributes, each with the strided slice of the padded
    input it multiplies: [n, ho, wo, channels]."""
    sh, sw, pt, pb, pl, pr, dh, dw, _groups = attrs
    xp = _spatially_padded(x, (pt, pb, pl, pr))
    ho = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    taps = []
    for i in range(kh):
        for j in range(kw):
            limit = (x.shape[0], i * dh + sh * (ho - 1) + 1, j * dw + sw * (wo - 1) + 1, x.shape[3])
            taps.append(((i, j), lax.slice(xp, (0, i * dh, j * dw, 0), limit, (1, sh, sw, 1))))
    return taps


def _shifted_conv_bg(attrs: tuple, x: Any, w: Any) -> Any:
    """A ConvBG with one batch row per group, the weight gradient of a depthwise conv, as one fused
    multiply-reduction per output position. In canonical terms x is (C, H, W, N) (the forward input, batch and
    channels swapped) and w (kh', kw', N, O) (the output cotangent); out[0, i, j, o] = sum over n, h, v of
    xpad[n, i*sh + h*dh, j*sw + v*dw, o // m] * g[n, h, v, o], m = O / C. XLA:CPU's batch-grouped kernel is as slow
    as its depthwise one."""
    sh, sw, pt, pb, pl, pr, dh, dw, _groups = attrs
    kh, kw, n, out_channels = w.shape
    nhwc = lax.transpose(x, (3, 1, 2, 0))
    xp = _spatially_padded(_accumulating(_repeated_channels(nhwc, out_channels)), (pt, pb, pl, pr))
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


def _dilate(attrs: tuple, x: Any) -> Any:
    """NHWC x with (dh - 1, dw - 1) zeros between neighbouring rows and columns: a conv's lhs_dilation."""
    dh, dw = attrs
    return lax.pad(x, lax.full((), 0, x.dtype), [(0, 0, 0), (0, 0, dh - 1), (0, 0, dw - 1), (0, 0, 0)])


def _one_hot(attrs: tuple, ids: Any) -> Any:
    depth, dtype = attrs
    return jax.nn.one_hot(ids, depth, dtype=dtype)


def _take_rows(_attrs: tuple, table: Any, ids: Any) -> Any:
    """Rows of `table` by index, zero where the index is out of range: what one_hot(ids) @ table computes."""
    rows = jnp.take(table, ids, axis=0, mode="fill", fill_value=0)
    return jnp.where((ids >= 0)[..., None], rows, jnp.zeros((), table.dtype))


def _scatter_rows(attrs: tuple, rows: Any, ids: Any) -> Any:
    """A zero table of `depth` rows with rows[n] added into row ids[n]: what one_hot(ids, depth).T @ rows computes,
    an embedding's gradient. An id outside [0, depth) adds nothing, as its one-hot row is all zeros; jnp's indexing
    would wrap a negative one, so every such id is sent past the end, where mode="drop" drops it."""
    (depth,) = attrs
    table = jnp.zeros((depth, *rows.shape[1:]), rows.dtype)
    return table.at[jnp.where((ids >= 0) & (ids < depth), ids, depth)].add(rows, mode="drop")


def _arg_reduce(attrs: tuple, x: Any) -> Any:
    """(ArgReduce kind axis index_dtype x): jnp.argmax / jnp.argmin along one axis (lax.argmax / lax.argmin)."""
    kind, axis, index_dtype = attrs
    return (lax.argmax if kind == "max" else lax.argmin)(x, axis, np.dtype(index_dtype))


def _masked_arg_reduce(attrs: tuple, x: Any) -> Any:
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


def _batch_dot_shape_rules(name: str) -> tuple[str, ...]:
    """[B..., M, K] x [B..., K, N] -> [B..., M, N], for BatchDot and its alternative."""
    return (
        f"(rule ((= e ({name} a b)) (= sa (shape a)) (= sb (shape b)) (= n (vec-length sa))"
        " (= n (vec-length sb)) (>= n 3) (= (vec-pop (vec-pop sa)) (vec-pop (vec-pop sb)))"
        " (= (vec-get sa (- n 1)) (vec-get sb (- n 2))))"
        " ((set (shape e) (vec-set sa (- n 1) (vec-get sb (- n 1))))))",
    )


def _window_room(size: str, pad_a: str, pad_b: str, kernel: str, dilation: str) -> str:
    """egglog text of size + pads - (dilation*(kernel-1) + 1): how far the window can slide, >= 0 when it fits."""
    return f"(- (+ {size} (+ {pad_a} {pad_b})) (+ (* {dilation} (- {kernel} 1)) 1))"


_FEATURE_GROUPS = ("(= (vec-get sa 3) (* k8 (vec-get sb 2)))", "(vec-get sa 0)")
# batch groups: x's batch splits into k8 groups (one row each for the shifted form), features are not grouped
_BATCH_GROUPS = ("(= (vec-get sa 3) (vec-get sb 2)) (= 0 (% (vec-get sa 0) k8))", "(/ (vec-get sa 0) k8)")
_BATCH_ROWS = ("(= (vec-get sa 3) (vec-get sb 2)) (= (vec-get sa 0) k8)", "1")


def _conv_shape_rules(name: str, groups: tuple[str, str] = _FEATURE_GROUPS) -> tuple[str, ...]:
    """NHWC x HWIO window arithmetic, for Conv, ConvBG and their alternative implementations; `groups` is the
    grouping's guard and the output batch size."""
    guard, batch = groups
    return (
        f"(rule ((= e ({name} k0 k1 k2 k3 k4 k5 k6 k7 k8 a b)) (= sa (shape a)) (= sb (shape b))"
        f" (= (vec-length sa) 4) (= (vec-length sb) 4) (> k8 0) {guard}"
        " (= 0 (% (vec-get sb 3) k8))"
        f" (= rh {_window_room('(vec-get sa 1)', 'k2', 'k3', '(vec-get sb 0)', 'k6')}) (>= rh 0)"
        f" (= rw {_window_room('(vec-get sa 2)', 'k4', 'k5', '(vec-get sb 1)', 'k7')}) (>= rw 0))"
        f" ((set (shape e) (vec-of {batch} (+ (/ rh k0) 1) (+ (/ rw k1) 1) (vec-get sb 3)))))",
    )


def _pool_init(fn: str, dtype: Any) -> Any:
    """The identity a window pads with: 0 for a sum, the lowest value (-inf for floats) for a max. A numpy scalar:
    lax.reduce_window binds reduce_window_max / _sum only for a concrete identity, a traced one stays generic."""
    if fn == "sum":
        return np.zeros((), dtype)
    return np.array(-np.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


def _pool(fn: str) -> Callable[..., Any]:
    """reduce_window of lax.max / lax.add over (window, strides, pad_low, pad_high): what jax binds as the
    reduce_window_max / reduce_window_sum primitives (flax, keras, haiku and equinox pools)."""

    def lower(attrs: tuple, x: Any) -> Any:
        window, strides, low, high = (tuple(a) for a in attrs)
        reducer = lax.max if fn == "max" else lax.add
        padding = tuple(zip(low, high, strict=True))
        return lax.reduce_window(x, _pool_init(fn, x.dtype), reducer, window, strides, padding)

    return lower


def _sliced_pool(fn: str) -> Callable[..., Any]:
    """The same window reduction as a max / sum over one strided slice of the padded input per window offset:
    XLA fuses it into one loop, where XLA:CPU's reduce_window runs 2-5x slower (DESIGN.md §2b)."""

    def lower(attrs: tuple, x: Any) -> Any:
        window, strides, low, high = (tuple(a) for a in attrs)
        xp = lax.pad(x, _pool_init(fn, x.dtype), [(lo, hi, 0) for lo, hi in zip(low, high, strict=True)])
        out = tuple((size - k) // s + 1 for size, k, s in zip(xp.shape, window, strides, strict=True))
        total = None
        for offset in np.ndindex(*window):
            limit = tuple(o + s * (n - 1) + 1 for o, s, n in zip(offset, strides, out, strict=True))
            tap = lax.slice(xp, tuple(int(o) for o in offset), limit, strides)
            total = tap if total is None else (lax.max(total, tap) if fn == "max" else lax.add(total, tap))
        return total

    return lower


def _pool_shape_rules(name: str) -> tuple[str, ...]:
    """(name window strides low high a): out[i] = (a[i] + low[i] + high[i] - window[i]) / strides[i] + 1, the window
    fitting the padded input on every axis."""
    return _axis_by_axis(
        f"({name} k0 k1 k2 k3 a)",
        "(= (vec-length k0) n) (= (vec-length k1) n) (= (vec-length k2) n) (= (vec-length k3) n)",
        "(= r (- (+ (vec-get sa i) (+ (vec-get k2 i) (vec-get k3 i))) (vec-get k0 i))) (>= r 0) (> (vec-get k1 i) 0)",
        "(+ (/ r (vec-get k1 i)) 1)",
    )


# (distinct-before e i j) for Transpose's permutation k0, entry by entry: entry i is compared with the entries before
# it one at a time, and entry i + 1 starts once entry i differs from all of them
_PERMUTATION_RULES = (
    "(rule ((= e (Transpose k0 a)) (> (vec-length k0) 0)) ((distinct-before e 0 0)))",
    "(rule ((= e (Transpose k0 a)) (distinct-before e i i) (< (+ i 1) (vec-length k0)))"
    " ((distinct-before e (+ i 1) 0)))",
    "(rule ((= e (Transpose k0 a)) (distinct-before e i j) (< j i) (!= (vec-get k0 i) (vec-get k0 j)))"
    " ((distinct-before e i (+ j 1))))",
)


def _axis_by_axis(pattern: str, whole: str, guard: str, dim: str) -> tuple[str, ...]:
    """Shape rules of any rank, egglog having no map over a vector: the output shape is built axis by axis
    ((axes-built e i) holds its first i axes), axis i of input a kept when `guard` holds and sized `dim` (both over
    `sa`, a's shape, and `i`); `whole` guards the whole node (over `n`, a's rank)."""
    head = f"(= e {pattern}) (= sa (shape a)) (= n (vec-length sa))"
    return (
        f"(rule ({head} {whole}) ((set (axes-built e 0) (vec-empty))))",
        f"(rule ({head} (= v (axes-built e i)) (< i n) {guard}) ((set (axes-built e (+ i 1)) (vec-push v {dim}))))",
        f"(rule ({head} (= v (axes-built e n))) ((set (shape e) v)))",
    )


def _patch_conv(attrs: tuple, x: Any, w: Any) -> Any:
    """A grouped convolution (several input channels per group) as the kh*kw shifted, strided slices of the padded
    input stacked and one contraction batched over the groups; XLA:CPU's grouped conv kernel is sometimes slower."""
    groups = attrs[8]
    kh, kw, cg, out_channels = w.shape
    taps = [tap for _, tap in _conv_taps(attrs, x, kh, kw)]
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


def _broadcast_batch_dot(_attrs: tuple, a: Any, b: Any) -> Any:
    """A batched matmul of tiny matrices as a broadcast multiply and a sum over the contracted axis: one fused loop,
    where XLA:CPU runs one small GEMM per batch element."""
    n = a.ndim
    left = lax.expand_dims(a, (n,))  # [B..., M, K, 1]
    right = lax.expand_dims(b, (n - 2,))  # [B..., 1, K, N]
    return lax.reduce_sum(lax.mul(left, right), (n - 1,))


def _conv_merge_key(attrs: tuple, _shapes: list[Shape | None]) -> tuple | None:
    return (*attrs[:2], *attrs[6:8]) if attrs[8] == 1 else None  # stride and dilation; ungrouped


def _conv_op(
    name: str, lower: Callable[..., Any], groups: tuple[str, str] = _FEATURE_GROUPS, alternative: bool = False
) -> OpSpec:
    """An op with Conv's nine attributes and (x, w) inputs: Conv, ConvBG and their alternative implementations."""

    def nonempty(attrs: tuple, x: Any, w: Any) -> Any:
        out = lower(attrs, x, w)
        if 0 in out.shape:  # the shape rules' semantics: a window that fits the padded input at least once
            raise ValueError(f"{name} of {x.shape} by a {w.shape} window has an empty output")
        return out

    return OpSpec(
        name,
        ("i64",) * 9,
        2,
        "contraction",
        nonempty,
        _conv_shape_rules(name, groups),
        contracted=lambda shapes: prod(shapes[1][:3]),
        alternative=alternative,
    )


def _zero_pad(attrs: tuple, a: Any) -> Any:
    low, high = attrs
    return lax.pad(a, lax.full((), 0, a.dtype), [(lo, hi, 0) for lo, hi in zip(low, high, strict=True)])


def _slice(attrs: tuple, a: Any) -> Any:
    axis, start, stop = attrs
    return lax.slice_in_dim(a, start, stop, axis=axis)


def _cumulative_examples(shape: Shape, blocks: tuple[int, ...] | None) -> list[tuple]:
    """Cumulative attributes along every axis of `shape`, both directions; with blocks, at each block size."""
    heads = [(kind, axis, reverse) for kind in cumulative.KINDS for axis in range(len(shape)) for reverse in (0, 1)]
    return heads if blocks is None else [(*head, block) for head in heads for block in blocks]


OPS: dict[str, OpSpec] = {
    op.name: op
    for op in [
        # Graph inputs, parameters and constants: (Var "x0"), (Var "c3").
        OpSpec("Var", ("String",), 0, "source", None),
        # A jax primitive the table does not model, bound with its original parameters: (Op index inputs) with its
        # inputs as a list (TCons x (TCons y (TNil)))), and the projection of one result out of a multi-result one:
        # (Get call k). Never rewritten; their shapes are set at encoding.
        OpSpec("TNil", (), 0, "source", None, declaration="(datatype TList (TNil) (TCons Tensor TList))"),
        OpSpec("TCons", (), 2, "source", None, declaration=""),  # declared with TNil
        OpSpec("Op", ("i64",), 0, "opaque", None, declaration="(constructor Op (i64 TList) Tensor)"),
        OpSpec("Get", ("i64",), 1, "source", None, declaration="(constructor Get (Tensor i64) Tensor)"),
        # tensordot with one contracted axis: a[..., K] . b[K, ...] -> a[..., :-1] + b[1:].
        OpSpec(
            "Dot",
            (),
            2,
            "contraction",
            _dot,
            (
                "(rule ((= e (Dot a b)) (= sa (shape a)) (= sb (shape b)) (> (vec-length sb) 0)"
                " (= (vec-get sa (- (vec-length sa) 1)) (vec-get sb 0)))"
                " ((set (shape e) (vec-append (vec-pop sa) (vec-remove sb 0)))))",
            ),
            contracted=lambda shapes: shapes[0][-1],
            merge_key=lambda _attrs, shapes: () if len(shapes[1] or ()) == 2 else None,  # matrix weights
        ),
        # a GEMM with its bias and activation (never captured: rules group them)
        OpSpec(
            "Dense",
            ("String",),
            3,
            "contraction",
            _dense,
            (
                "(rule ((= e (Dense k0 a b c)) (= sa (shape a)) (= sb (shape b)) (= (vec-length sb) 2)"
                " (= n (- (vec-length sa) 1)) (= (vec-get sa n) (vec-get sb 0))"
                " (= (shape c) (vec-of (vec-get sb 1))))"
                " ((set (shape e) (vec-set sa n (vec-get sb 1)))))",
            ),
            contracted=lambda shapes: shapes[0][-1],
            epilogue=True,
        ),
        # batched matmul with leading batch dims: a[B..., M, K] . b[B..., K, N] -> [B..., M, N].
        OpSpec(
            "BatchDot",
            (),
            2,
            "contraction",
            _batch_dot,
            _batch_dot_shape_rules("BatchDot"),
            contracted=lambda shapes: shapes[0][-1],
        ),
        # The same batched matmul as a broadcast multiply and a sum over K; rules/kernels.egg puts it beside a
        # BatchDot of tiny matrices, the timing cache prices both.
        OpSpec(
            "BcastBatchDot",
            (),
            2,
            "contraction",
            _broadcast_batch_dot,
            _batch_dot_shape_rules("BcastBatchDot"),
            contracted=lambda shapes: shapes[0][-1],
            alternative=True,
        ),
        # NHWC x HWIO convolution: (Conv stride_h stride_w pad_top pad_bottom pad_left pad_right
        #                                dilation_h dilation_w groups x w)
        # ungrouped convs of one stride and dilation merge (padding left out: a 1x1 conv enlarges to its 3x3 sibling)
        dataclasses.replace(
            _conv_op("Conv", _conv),
            merge_key=lambda attrs, _shapes: (*attrs[:2], *attrs[6:8]) if attrs[8] == 1 else None,
        ),
        # The same attributes, a depthwise conv (one input channel per group) computed as shifted multiply-adds;
        # rules/kernels.egg puts it beside the Conv it can replace, the timing cache prices both.
        _conv_op("ShiftConv", _shifted_conv, alternative=True),
        # The same attributes, a grouped conv (several input channels per group) as stacked shifted patches and one
        # contraction batched over the groups.
        _conv_op("PatchConv", _patch_conv, alternative=True),
        # Pooling: (PoolMax window strides pad_low pad_high x), (PoolSum ...), any rank and layout (the window's
        # size-1 axes are the batch and channel ones); PoolMaxSliced / PoolSumSliced compute them over strided slices.
        *(
            OpSpec(
                name, ("Shape",) * 4, 1, "window", lower, _pool_shape_rules(name), alternative=name.endswith("Sliced")
            )
            for name, lower in (
                ("PoolMax", _pool("max")),
                ("PoolSum", _pool("sum")),
                ("PoolMaxSliced", _sliced_pool("max")),
                ("PoolSumSliced", _sliced_pool("sum")),
            )
        ),
        # A batch-grouped conv, the weight gradient of a grouped one: Conv's attributes, k8 the batch_group_count
        _conv_op("ConvBG", partial(_conv, group_param="batch_group_count"), _BATCH_GROUPS),
        # A ConvBG with one batch row per group (a depthwise conv's weight gradient) as shifted multiply-reductions
        _conv_op("ShiftConvBG", _shifted_conv_bg, _BATCH_ROWS, alternative=True),
        # (Dilate dh dw x): NHWC x with zeros between rows and columns, a conv's lhs_dilation (strided input gradients)
        OpSpec(
            "Dilate",
            ("i64", "i64"),
            1,
            "elementwise",
            _dilate,
            (
                "(rule ((= e (Dilate k0 k1 a)) (= sa (shape a)) (= (vec-length sa) 4) (>= k0 1) (>= k1 1)"
                " (>= (vec-get sa 1) 1) (>= (vec-get sa 2) 1))"
                " ((set (shape e) (vec-of (vec-get sa 0) (+ (* k0 (- (vec-get sa 1) 1)) 1)"
                " (+ (* k1 (- (vec-get sa 2) 1)) 1) (vec-get sa 3)))))",
            ),
        ),
        # (OneHot depth dtype ids): ids[...] -> [..., depth], 1 where the index matches; captured from jax.nn.one_hot
        OpSpec(
            "OneHot",
            ("i64", "String"),
            1,
            "elementwise",
            _one_hot,
            ("(rule ((= e (OneHot k0 k1 a)) (= sa (shape a))) ((set (shape e) (vec-push sa k0))))",),
            dtype_rule="(rule ((= e (OneHot k0 k1 a))) ((set (dtype e) k1)))",
        ),
        # (Take table ids): table rows by index, zeros out of range; rules/kernels.egg puts it beside one_hot @ table
        OpSpec(
            "Take",
            (),
            2,
            "gather",
            _take_rows,
            (
                "(rule ((= e (Take a b)) (= sa (shape a)) (= sb (shape b)) (>= (vec-length sa) 1))"
                " ((set (shape e) (vec-append sb (vec-remove sa 0)))))",
            ),
            alternative=True,
        ),
        # (ScatterRows depth rows ids): rows[N, ...] added into a zero [depth, ...] table at ids[N], ids out of range
        # dropped; rules/kernels.egg puts it beside one_hot(ids).T @ rows (an embedding's gradient)
        OpSpec(
            "ScatterRows",
            ("i64",),
            2,
            "gather",
            _scatter_rows,
            (
                "(rule ((= e (ScatterRows k0 a b)) (= sa (shape a)) (= sb (shape b)) (= (vec-length sb) 1)"
                " (>= (vec-length sa) 1) (= (vec-get sa 0) (vec-get sb 0)) (> k0 0))"
                " ((set (shape e) (vec-set sa 0 k0))))",
            ),
            alternative=True,
        ),
        # (ArgReduce kind axis index_dtype x), kind "max" or "min": captured from lax.argmax / lax.argmin;
        # ArgReduceMasked computes it as a max (min) and a min of the positions that hold it
        *(
            OpSpec(
                name,
                ("String", "i64", "String"),
                1,
                "reduction",
                lower,
                (
                    f"(rule ((= e ({name} k0 k1 k2 a)) (= sa (shape a)) (>= k1 0) (< k1 (vec-length sa))"
                    " (> (vec-get sa k1) 0)) ((set (shape e) (vec-remove sa k1))))",
                ),
                dtype_rule=f"(rule ((= e ({name} k0 k1 k2 a))) ((set (dtype e) k2)))",
                alternative=name.endswith("Masked"),
            )
            for name, lower in (("ArgReduce", _arg_reduce), ("ArgReduceMasked", _masked_arg_reduce))
        ),
        # broadcast_in_dim: (Bcast target_shape dims a)
        OpSpec(
            "Bcast",
            ("Shape", "Shape"),
            1,
            "elementwise",
            lambda attrs, a: lax.broadcast_in_dim(a, tuple(attrs[0]), tuple(attrs[1])),
            # input axis i goes to output axis k1[i], increasing, and keeps its size or is 1: checked axis by
            # axis (axes-checked e i last: axes before i hold, the last of them went to output axis `last`)
            (
                "(rule ((= e (Bcast k0 k1 a)) (= sa (shape a)) (= (vec-length sa) (vec-length k1)))"
                " ((axes-checked e 0 -1)))",
                "(rule ((axes-checked e i last) (= e (Bcast k0 k1 a)) (= sa (shape a)) (< i (vec-length sa))"
                " (= d (vec-get k1 i)) (> d last) (< d (vec-length k0)) (= (vec-get sa i) (vec-get k0 d)))"
                " ((axes-checked e (+ i 1) d)))",
                "(rule ((axes-checked e i last) (= e (Bcast k0 k1 a)) (= sa (shape a)) (< i (vec-length sa))"
                " (= d (vec-get k1 i)) (> d last) (< d (vec-length k0)) (= (vec-get sa i) 1))"
                " ((axes-checked e (+ i 1) d)))",
                "(rule ((axes-checked e n last) (= e (Bcast k0 k1 a)) (= sa (shape a)) (= n (vec-length sa)))"
                " ((set (shape e) k0)))",
            ),
        ),
        _binary("Add", lax.add, "add"),
        _binary("Sub", lax.sub, "sub"),
        _binary("Mul", lax.mul, "mul"),
        _binary("Div", lax.div, "div"),
        _binary("Max", lax.max, "max"),
        _binary("Min", lax.min, "min"),
        _unary("Neg", lax.neg, "neg"),
        _unary("Exp", lax.exp, "exp"),
        _unary("Log", lax.log, "log"),
        _unary("Tanh", lax.tanh, "tanh"),
        _unary("Logistic", lax.logistic, "logistic"),
        _unary("Sqrt", lax.sqrt, "sqrt"),
        _unary("Rsqrt", lax.rsqrt, "rsqrt"),
        # swap the last two axes
        OpSpec(
            "MT",
            (),
            1,
            "elementwise",
            lambda _attrs, a: _matrix_transpose(a),
            (
                "(rule ((= e (MT a)) (= sa (shape a)) (= n (vec-length sa)) (>= n 2))"
                " ((set (shape e) (vec-set (vec-set sa (- n 1) (vec-get sa (- n 2)))"
                " (- n 2) (vec-get sa (- n 1))))))",
            ),
        ),
        # (Transpose permutation a)
        OpSpec(
            "Transpose",
            ("Shape",),
            1,
            "elementwise",
            lambda attrs, a: lax.transpose(a, tuple(attrs[0])),
            # each axis of the permutation in range and unlike the ones before it
            _axis_by_axis(
                "(Transpose k0 a)",
                "(= (vec-length k0) n)",
                "(= p (vec-get k0 i)) (>= p 0) (< p n) (distinct-before e i i)",
                "(vec-get sa p)",
            )
            + _PERMUTATION_RULES,
            ("transpose",),
        ),
        # (Pad low high a): zero padding of each axis, used by rules (enlarging a kernel), not captured
        OpSpec(
            "Pad",
            ("Shape", "Shape"),
            1,
            "elementwise",
            _zero_pad,
            _axis_by_axis(
                "(Pad k0 k1 a)",
                "(= (vec-length k0) n) (= (vec-length k1) n)",
                "(>= (vec-get k0 i) 0) (>= (vec-get k1 i) 0)",
                "(+ (vec-get sa i) (+ (vec-get k0 i) (vec-get k1 i)))",
            ),
        ),
        # (Reshape new_shape a): sizes are trusted, egglog cannot multiply a vector out
        OpSpec(
            "Reshape",
            ("Shape",),
            1,
            "bitcast",
            lambda attrs, a: lax.reshape(a, tuple(attrs[0])),
            ("(rule ((= e (Reshape k0 a)) (= sa (shape a))) ((set (shape e) k0)))",),
        ),
        # single-axis reductions: (ReduceSum axis a), (ReduceMax axis a)
        *(
            OpSpec(
                name,
                ("i64",),
                1,
                "elementwise",
                lambda attrs, a, fn=fn: fn(a, (attrs[0],)),
                (
                    f"(rule ((= e ({name} k0 a)) (= sa (shape a)) (>= k0 0) (< k0 (vec-length sa)))"
                    " ((set (shape e) (vec-remove sa k0))))",
                ),
            )
            for name, fn in (("ReduceSum", lax.reduce_sum), ("ReduceMax", lax.reduce_max))
        ),
        # numerically stable composites that rules/stable.egg rewrites naive forms into (never captured)
        OpSpec(
            "Softmax",
            ("i64",),
            1,
            "elementwise",
            lambda attrs, a: jax.nn.softmax(a, axis=attrs[0]),
            ("(rule ((= e (Softmax k0 a)) (= sa (shape a)) (>= k0 0) (< k0 (vec-length sa))) ((set (shape e) sa)))",),
        ),
        OpSpec(
            "LogSumExp",
            ("i64",),
            1,
            "elementwise",
            lambda attrs, a: jax.nn.logsumexp(a, axis=attrs[0]),
            (
                "(rule ((= e (LogSumExp k0 a)) (= sa (shape a)) (>= k0 0) (< k0 (vec-length sa)))"
                " ((set (shape e) (vec-remove sa k0))))",
            ),
        ),
        # (Concat axis a b)
        OpSpec(
            "Concat",
            ("i64",),
            2,
            "elementwise",
            lambda attrs, a, b: lax.concatenate([a, b], attrs[0]),
            (
                "(rule ((= e (Concat k0 a b)) (= sa (shape a)) (= sb (shape b)) (< k0 (vec-length sa))"
                " (= (vec-length sa) (vec-length sb)) (= (vec-set sa k0 0) (vec-set sb k0 0)))"
                " ((set (shape e) (vec-set sa k0 (+ (vec-get sa k0) (vec-get sb k0))))))",
            ),
        ),
        # (Slice axis start stop a)
        OpSpec(
            "Slice",
            ("i64", "i64", "i64"),
            1,
            "elementwise",
            _slice,
            (
                "(rule ((= e (Slice k0 k1 k2 a)) (= sa (shape a)) (< k0 (vec-length sa)) (<= 0 k1) (< k1 k2)"
                " (<= k2 (vec-get sa k0))) ((set (shape e) (vec-set sa k0 (- k2 k1)))))",
            ),
        ),
        # (Cumulative kind axis reverse x): lax.cumsum / cumprod / cummax / cummin / cumlogsumexp (kind "sum", "prod",
        # "max", "min", "logsumexp"), backwards where reverse is 1; (CumulativeBlocked kind axis reverse block x) the
        # same in blocks, which rules/kernels.egg puts beside it (backends/cumulative.py)
        *(
            OpSpec(
                name,
                ("String", "i64", "i64", *("i64",) * blocked),
                1,
                "reduction",
                lower,
                (
                    f"(rule ((= e ({name} k0 k1 k2{' k3' * blocked} a)) (= sa (shape a)) (>= k1 0)"
                    f" (< k1 (vec-length sa)) (>= k2 0) (<= k2 1){' (>= k3 1)' * blocked}) ((set (shape e) sa)))",
                ),
                primitives=() if blocked else tuple(cumulative.PRIMITIVES),  # the kind: eqsat/capture.py
                example_attrs=partial(_cumulative_examples, blocks=(1, 2, 3) if blocked else None),
                alternative=bool(blocked),
            )
            for name, lower, blocked in (
                ("Cumulative", cumulative.cumulative, 0),
                ("CumulativeBlocked", cumulative.blocked, 1),
            )
        ),
    ]
}


def captured_as(primitive: str) -> OpSpec | None:
    """The op a jax primitive is captured as by the table alone (read at each call: a new entry counts at once)."""
    return next((op for op in OPS.values() if primitive in op.primitives), None)


@lru_cache(maxsize=65536)
def infer(op: str, attrs: tuple, in_avals: tuple[tuple[Shape, str], ...]) -> tuple[Shape, str] | None:
    """Shape and dtype of an op applied to inputs of these shapes, by tracing its lowering; None if ill-typed."""
    spec = OPS[op]
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in in_avals]
    try:
        out = jax.eval_shape(lambda *xs: spec.lower(attrs, *xs), *args)
    except (TypeError, ValueError, IndexError):
        return None
    return tuple(out.shape), out.dtype.name
