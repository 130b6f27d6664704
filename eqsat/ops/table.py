"""The op table: every IR op is declared here once.

Each entry gives the egglog constructor (attributes, then tensor inputs), the sections of eqsat/ops/shapes.egg whose
egglog rules derive its output shape and dtype from its inputs' (a node whose shape guard fails gets no shape and
is never extracted), how the op is priced (its cost class), how it lowers to `jax.lax`, which jax primitives
capture as it (and how their parameters become its attributes), and which attributes `rules check` may draw for
it. Capture, the egglog prelude, the cost model, lowering and `rules check` all read this table; a new op is one
entry.
"""

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property, lru_cache, partial
from math import prod
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat.ops import cumulative, kernels
from eqsat.ops.shape_rules import FIRST_INPUT, shapes_file

Shape = tuple[int, ...]

# The ops other modules name because they mean that one op (a structural node, or an op a pass builds or looks
# for); every other question about an op is a property of its entry. No other module compares an op name
# as a string (tests/test_op_table.py).
VAR = "Var"  # a graph input, parameter or constant
OPAQUE = "Op"  # a jax primitive the table does not model, re-bound with its parameters
GET = "Get"  # one result of a multi-result opaque call
TNIL, TCONS = "TNil", "TCons"  # an opaque call's input list
ADD, REDUCE_SUM = "Add", "ReduceSum"  # a sum's terms (eqsat/egraph/chains.py)
BCAST, RESHAPE, TRANSPOSE, MT = "Bcast", "Reshape", "Transpose", "MT"  # layout ops capture puts around an op
DOT, BATCH_DOT, CONV = "Dot", "BatchDot", "Conv"
CONCAT, SLICE = "Concat", "Slice"  # CONCAT: what merge rules join siblings with
CONVERT, ONE_HOT, CUMULATIVE = "Convert", "OneHot", "Cumulative"
ARG_REDUCE, TAKE_ALONG, PUT_ALONG = "ArgReduce", "TakeAlong", "PutAlong"


class CostClass(StrEnum):
    """How the cost model prices an op (extract/cost.py has one pricing function per class)."""

    SOURCE = "source"  # an input or a constant: nothing to compute
    CONTRACTION = "contraction"  # flops against the roofline, or measured by the timing cache
    ELEMENTWISE = "elementwise"  # fused by XLA: slices and concats too
    BITCAST = "bitcast"  # a row-major reshape: XLA moves no data
    GATHER = "gather"  # reads the rows it returns
    CHECKED_GATHER = "checked_gather"  # a gather that reads its whole first operand too (a check that it is finite)
    WINDOW = "window"  # a pooling pass: reads its input once, writes its output
    REDUCTION = "reduction"  # an index-returning reduction (argmax) or a cumulative op: reads its input once
    # a fused reduction that reads its input again, past the pass its producer was priced for (logsumexp: a max,
    # then a sum of exp of the difference)
    FUSED_READ = "fused_read"
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
    # the section of eqsat/ops/shapes.egg whose rules derive the output shape (None: set at encoding, structural ops)
    shape_kind: str | None = None
    # jax primitives captured as this op: each by its capture_params, or by the function eqsat/capture/jaxpr.py
    # registers for this op (those that add helper nodes or pick among ops); a primitive is named by one entry only
    primitives: tuple[str, ...] = ()
    contracted: Callable[[list[Shape]], int] | None = None  # contraction length per output element
    epilogue: bool = False  # bias and activation on the output: free where the target runs them in the GEMM
    dtype_kind: str = FIRST_INPUT  # the section of eqsat/ops/shapes.egg whose rule derives the output dtype
    alternative: bool = False  # another implementation of an op, put beside it by rules/kernels.egg
    # a captured primitive's parameters -> this op's attributes (None: not this op); without it (and without a
    # capture function in eqsat/capture/jaxpr.py) only parameterless primitives are captured
    capture_params: Callable[[dict[str, Any]], tuple | None] | None = None
    # capture keeps an equation opaque unless its inputs and output share one (non-bool) dtype; False where the op's
    # capture checks dtypes itself (conversions, index-taking and index-returning ops)
    one_dtype: bool = True
    # its value is its input's re-addressed (a reshape, a broadcast): cheap to recompute in each loop reading it
    view: bool = False
    # a matrix product whose chains eqsat/egraph/chains.py reorders: where the matrix axes start in an operand's shape
    # (0: all of it, -2: the last two, batch axes riding along); None: not a chain product
    chain_axes: int | None = None
    # the attribute tuples `rules check` may draw for an input of this shape (all inputs share it); ops without a
    # hand-written generator in eqsat/tools/generators.py are drawn from it (no attributes: the op on random inputs)
    example_attrs: Callable[[Shape], list[tuple]] | None = None
    declaration: str | None = None  # egglog declaration, for a structural op that is not a plain constructor
    # (attrs, input shapes) -> what siblings reading the same first input must share for a merge rule to join
    # them (their place among those siblings goes to egglog: see encode.prelude); None: not mergeable
    merge_key: Callable[[tuple, list[Shape | None]], tuple | None] | None = None
    # the attributes' names: a NamedTuple of them, which lowering receives, and egglog and JSON attributes are read
    # back as (None: the attributes are a plain tuple)
    attributes: type[tuple] | None = None
    # an elementwise op's work per element beyond its memory pass, in flops at the target's peak (XLA:CPU, measured:
    # benches/RESULTS.md, session 15); 0 prices it as the memory pass alone, as every op whose cost no rule trades
    flops_per_element: float = 0.0
    # rank -> the axis order the lowering transposes each operand into first, where capture made that operand from
    # that order (XLA folds the two transposes in a program): the timing cache times the op on operands made in it
    operand_layouts: Callable[[int], tuple[Shape, ...]] | None = None
    # it adds terms (besides a contraction's): the order of the additions decides which partial sum overflows, and
    # a zero sum's sign (eqsat/egraph/check.py, special values); a callable decides by the attributes
    sums: bool | Callable[[tuple], bool] = False
    # each row of its first operand times one matrix (a[..., K] . w[K, N]): with one row, a GEMV, which a TPU runs as
    # a loop fused with its neighbours (Profile.loop_contraction_rows)
    row_product: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost_class", CostClass(self.cost_class))
        if self.shape_kind is not None:
            shapes_file().section("shape", self.shape_kind, self.name)
        shapes_file().section("dtype", self.dtype_kind, self.name)
        unknown = [sort for sort in self.attrs if sort not in SORTS]
        if unknown:
            raise ValueError(f"op {self.name}: attribute sort(s) {unknown} unknown; the sorts are {sorted(SORTS)}")
        fields = getattr(self.attributes, "_fields", None)
        if self.attributes is not None and (fields is None or len(fields) != len(self.attrs)):
            raise ValueError(f"op {self.name}: its attributes' NamedTuple must name its {len(self.attrs)} attributes")
        if self.attributes is not None and self.lower is not None:
            lower, named = self.lower, self.attributes
            object.__setattr__(self, "lower", lambda attrs, *inputs: lower(named(*attrs), *inputs))

    def named(self, attrs: tuple | list) -> tuple:
        """attrs as this op's NamedTuple of them (a plain tuple where it has none)."""
        return tuple(attrs) if self.attributes is None else self.attributes(*attrs)

    def sorts(self, attrs: tuple | list) -> list[Sort]:
        if len(attrs) != len(self.attrs):
            raise TypeError(f"{self.name} takes {len(self.attrs)} attribute(s) {self.attrs}, got {len(attrs)}")
        return [SORTS[sort] for sort in self.attrs]

    def attrs_from_egraph(self, values: tuple) -> tuple:
        """Attributes read back from a serialized e-graph (once per e-node, so without the checks of `value`)."""
        return self.named([sort.python(v) for sort, v in zip(self.sorts(values), values, strict=True)])

    def attrs_to_egglog(self, attrs: tuple) -> list[str]:
        return [sort.to_egglog(sort.value(a)) for sort, a in zip(self.sorts(attrs), attrs, strict=True)]

    def attrs_to_json(self, attrs: tuple) -> list[Any]:
        return [sort.to_json(sort.value(a)) for sort, a in zip(self.sorts(attrs), attrs, strict=True)]

    def attrs_from_json(self, values: list[Any]) -> tuple:
        return self.named([sort.from_json(v) for sort, v in zip(self.sorts(values), values, strict=True)])

    @cached_property
    def shape_rules(self) -> tuple[str, ...]:
        """The egglog rules deriving this op's output shape: its shape kind's section, for this op."""
        if self.shape_kind is None:
            return ()
        return shapes_file().section("shape", self.shape_kind, self.name).rules_for(self.name, self.pattern())

    @cached_property
    def dtype_rule(self) -> str:
        """The egglog rule deriving this op's output dtype: its dtype kind's section, for this op."""
        return shapes_file().section("dtype", self.dtype_kind, self.name).rules_for(self.name, self.pattern())[0]

    @property
    def keeps_input_dtype(self) -> bool:
        """Whether the output has the first input's dtype (not one the op's attributes name)."""
        return self.dtype_kind == FIRST_INPUT

    @property
    def converts(self) -> bool:
        """A dtype conversion: its output is its input's values in the dtype its attribute names."""
        return self.dtype_kind == "convert"

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


def _binary(name: str, fn: Callable[..., Any], primitive: str, **fields: Any) -> OpSpec:
    def lower(_attrs: tuple, a: Any, b: Any) -> Any:
        # the shape rules' semantics: equal shapes or a scalar side (lax itself also broadcasts size-1 axes)
        if jnp.shape(a) != jnp.shape(b) and jnp.ndim(a) and jnp.ndim(b):
            raise TypeError(f"{name} of shapes {jnp.shape(a)} and {jnp.shape(b)}")
        return fn(a, b)

    return OpSpec(name, (), 2, "elementwise", lower, "same-or-scalar", (primitive,), **fields)


def _unary(name: str, fn: Callable[..., Any], primitive: str | None, **fields: Any) -> OpSpec:
    primitives = () if primitive is None else (primitive,)
    return OpSpec(name, (), 1, "elementwise", lambda _attrs, a: fn(a), "unary", primitives, **fields)


def _matrix_transpose(x: Any) -> Any:
    n = x.ndim
    return lax.transpose(x, (*range(n - 2), n - 1, n - 2))


def _dot(_attrs: tuple, a: Any, b: Any, contracting: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Any:
    """a[..., K] . b[K, ...]; `contracting`: the axes of a and b contracted instead, where lowering gives the
    operands unmerged (backends/merged_contractions.py)."""
    return lax.dot_general(a, b, (contracting or ((a.ndim - 1,), (0,)), ((), ())))


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


class ConvAttrs(NamedTuple):
    """A convolution's attributes, of any rank (a tuple has one entry per spatial axis): lax.conv_general_dilated's
    parameters, its operands in the table's layout (eqsat/ops/kernels.conv_dimension_numbers: x (batch, spatial...,
    features), w (spatial..., in, out), the output as x)."""

    strides: Shape
    pad_low: Shape  # negative crops
    pad_high: Shape
    lhs_dilation: Shape  # zeros between the input's neighbours: transposed convs, strided convs' input gradients
    rhs_dilation: Shape  # the kernel's (atrous convs)
    feature_groups: int
    batch_groups: int  # weight gradients of grouped convs; at most one of the two counts is above 1


class PoolAttrs(NamedTuple):
    """A window reduction's attributes, one entry per axis of its input (1 on the batch and channel axes)."""

    window: Shape
    strides: Shape
    pad_low: Shape
    pad_high: Shape


class BcastAttrs(NamedTuple):
    """broadcast_in_dim's: the output's shape, and the output axis of each input axis."""

    shape: Shape
    dims: Shape


class PadAttrs(NamedTuple):
    """Zero padding: the elements added before and after each axis."""

    low: Shape
    high: Shape


class SliceAttrs(NamedTuple):
    """A unit-stride slice of one axis: elements start..stop-1 of it."""

    axis: int
    start: int
    stop: int


class OneHotAttrs(NamedTuple):
    depth: int  # the new last axis's length
    dtype: str


class ArgReduceAttrs(NamedTuple):
    kind: str  # "max" or "min"
    axis: int
    index_dtype: str


class CumulativeAttrs(NamedTuple):
    kind: str  # "sum", "prod", "max", "min" or "logsumexp" (eqsat/ops/cumulative.KINDS)
    axis: int
    reverse: int  # 1: backwards along the axis


class BlockedCumulativeAttrs(NamedTuple):
    """CumulativeBlocked's: a Cumulative's attributes and the length of its blocks."""

    kind: str
    axis: int
    reverse: int
    block: int


def _one_hot(a: OneHotAttrs, ids: Any) -> Any:
    return jax.nn.one_hot(ids, a.depth, dtype=a.dtype)


def _arg_reduce(a: ArgReduceAttrs, x: Any) -> Any:
    """(ArgReduce kind axis index_dtype x): jnp.argmax / jnp.argmin along one axis (lax.argmax / lax.argmin)."""
    return (lax.argmax if a.kind == "max" else lax.argmin)(x, a.axis, np.dtype(a.index_dtype))


def _conv_merge_key(attrs: tuple, _shapes: list[Shape | None]) -> tuple | None:
    """Ungrouped convs of one stride and dilation merge (padding left out: a 1x1 conv enlarges to its 3x3 sibling)."""
    a = ConvAttrs(*attrs)
    if a.feature_groups != 1 or a.batch_groups != 1:
        return None
    return a.strides, a.lhs_dilation, a.rhs_dilation


def _conv_op(
    name: str,
    lower: Callable[..., Any],
    primitives: tuple[str, ...] = (),
    alternative: bool = False,
    operand_layouts: Callable[[int], tuple[Shape, ...]] | None = None,
) -> OpSpec:
    """An op with ConvAttrs and (x, w) inputs: Conv and its alternative implementations."""

    def nonempty(attrs: ConvAttrs, x: Any, w: Any) -> Any:
        out = lower(attrs, x, w)
        if 0 in out.shape:  # the shape rules' semantics: a window that fits the padded input at least once
            raise ValueError(f"{name} of {x.shape} by a {w.shape} window has an empty output")
        return out

    return OpSpec(
        name,
        ("Shape",) * 5 + ("i64",) * 2,
        2,
        "contraction",
        nonempty,
        "conv",
        primitives,
        contracted=lambda shapes: prod(shapes[1][:-1]),
        alternative=alternative,
        attributes=ConvAttrs,
        merge_key=None if alternative else _conv_merge_key,
        operand_layouts=operand_layouts,
    )


def _pool_params(params: dict[str, Any]) -> PoolAttrs | None:
    """reduce_window_max / reduce_window_sum (lax.reduce_window of lax.max / lax.add from its identity) without
    dilation."""
    if any(d != 1 for d in (*params["base_dilation"], *params["window_dilation"])):
        return None
    return PoolAttrs(
        window=tuple(int(d) for d in params["window_dimensions"]),
        strides=tuple(int(s) for s in params["window_strides"]),
        pad_low=tuple(int(lo) for lo, _ in params["padding"]),
        pad_high=tuple(int(hi) for _, hi in params["padding"]),
    )


def _bcast_params(params: dict[str, Any]) -> tuple | None:
    if params.get("sharding") is not None:
        return None
    return tuple(map(int, params["shape"])), tuple(map(int, params["broadcast_dimensions"]))


def _reduce_params(params: dict[str, Any]) -> tuple | None:
    """A reduction over one axis."""
    axes = tuple(params["axes"])
    if len(axes) != 1 or params.get("out_sharding") is not None:
        return None
    return (int(axes[0]),)


def _zero_pad(a: PadAttrs, x: Any) -> Any:
    return lax.pad(x, lax.full((), 0, x.dtype), [(lo, hi, 0) for lo, hi in zip(a.low, a.high, strict=True)])


def _slice(a: SliceAttrs, x: Any) -> Any:
    return lax.slice_in_dim(x, a.start, a.stop, axis=a.axis)


def _cumulative_examples(shape: Shape, blocks: tuple[int, ...] | None) -> list[tuple]:
    """Cumulative attributes along every axis of `shape`, both directions; with blocks, at each block size."""
    heads = [(kind, axis, reverse) for kind in cumulative.KINDS for axis in range(len(shape)) for reverse in (0, 1)]
    return heads if blocks is None else [(*head, block) for head in heads for block in blocks]


OPS: dict[str, OpSpec] = {
    op.name: op
    for op in [
        # Graph inputs, parameters and constants: (Var "x0"), (Var "c3").
        OpSpec(VAR, ("String",), 0, "source", None),
        # A jax primitive the table does not model, bound with its original parameters: (Op index inputs) with its
        # inputs as a list (TCons x (TCons y (TNil)))), and the projection of one result out of a multi-result one:
        # (Get call k). Never rewritten; their shapes are set at encoding.
        OpSpec(TNIL, (), 0, "source", None, declaration="(datatype TList (TNil) (TCons Tensor TList))"),
        OpSpec(TCONS, (), 2, "source", None, declaration=""),  # declared with TNil
        OpSpec(OPAQUE, ("i64",), 0, "opaque", None, declaration="(constructor Op (i64 TList) Tensor)"),
        OpSpec(GET, ("i64",), 1, "source", None, declaration="(constructor Get (Tensor i64) Tensor)"),
        # tensordot with one contracted axis: a[..., K] . b[K, ...] -> a[..., :-1] + b[1:]. Captures dot_general
        # in every form without batch axes (eqsat/capture/jaxpr.py), and with them as a BatchDot.
        OpSpec(
            DOT,
            (),
            2,
            "contraction",
            _dot,
            "dot",
            ("dot_general",),
            contracted=lambda shapes: shapes[0][-1],
            chain_axes=0,
            merge_key=lambda _attrs, shapes: () if len(shapes[1] or ()) == 2 else None,  # matrix weights
            row_product=True,
        ),
        # a GEMM with its bias and activation (never captured: rules group them)
        OpSpec(
            "Dense",
            ("String",),
            3,
            "contraction",
            _dense,
            "dense",
            contracted=lambda shapes: shapes[0][-1],
            epilogue=True,
            row_product=True,
        ),
        # batched matmul with leading batch dims: a[B..., M, K] . b[B..., K, N] -> [B..., M, N].
        OpSpec(
            BATCH_DOT,
            (),
            2,
            "contraction",
            _batch_dot,
            "batch-dot",
            contracted=lambda shapes: shapes[0][-1],
            chain_axes=-2,
        ),
        # The same batched matmul as a broadcast multiply and a sum over K; rules/kernels.egg puts it beside a
        # BatchDot of tiny matrices, the timing cache prices both.
        OpSpec(
            "BcastBatchDot",
            (),
            2,
            "contraction",
            kernels.broadcast_batch_dot,
            "batch-dot",
            contracted=lambda shapes: shapes[0][-1],
            alternative=True,
        ),
        # A convolution of any rank, (Conv strides pad_low pad_high lhs_dilation rhs_dilation feature_groups
        # batch_groups x w): ConvAttrs, the operands channels-last (x [N, S..., C], w [K..., C / groups, O]);
        # captured from conv_general_dilated of any layout, with transposes around it (eqsat/capture/jaxpr.py)
        _conv_op(CONV, kernels.conv, ("conv_general_dilated",)),
        # The same attributes, a conv of few input channels per group (a depthwise conv's one, an RGB stem's three)
        # computed as shifted multiply-adds; rules/kernels.egg puts it beside the Conv it can replace, the timing
        # cache prices both.
        _conv_op("ShiftConv", kernels.shifted_conv, alternative=True),
        # The same attributes, a conv whose window covers its whole input (a 1x1 conv's weight gradient) as one GEMM
        _conv_op("DotConv", kernels.dot_conv, alternative=True),
        # The same attributes, a 1x1 conv (stride 1, unpadded, one group) as one GEMM over the channels
        _conv_op("PointwiseDot", kernels.pointwise_dot, alternative=True),
        # The same attributes, a grouped conv (several input channels per group) as stacked shifted patches and one
        # contraction batched over the groups.
        _conv_op("PatchConv", kernels.patch_conv, alternative=True),
        # A conv with one batch row per batch group (a depthwise conv's weight gradient) as shifted multiply-reductions
        _conv_op("ShiftConvBG", kernels.shifted_conv_bg, alternative=True, operand_layouts=kernels.bg_operand_layouts),
        # A conv with lhs_dilation s (transposed convs, strided convs' input gradients) as s^d stride-1 convs of the
        # undilated input with the kernel's phases, interleaved
        _conv_op("PhaseConv", kernels.phase_conv, alternative=True),
        # Pooling: (PoolMax window strides pad_low pad_high x), (PoolSum ...), any rank and layout (the window's
        # size-1 axes are the batch and channel ones); PoolMaxSliced / PoolSumSliced compute them over strided slices.
        *(
            OpSpec(
                name,
                ("Shape",) * 4,
                1,
                "window",
                lower,
                "pool",
                primitives,
                alternative=name.endswith("Sliced"),
                capture_params=_pool_params if primitives else None,
                attributes=PoolAttrs,
                sums=name.startswith("PoolSum"),
            )
            for name, lower, primitives in (
                ("PoolMax", partial(kernels.window_pool, "max"), ("reduce_window_max",)),
                ("PoolSum", partial(kernels.window_pool, "sum"), ("reduce_window_sum",)),
                ("PoolMaxSliced", kernels.sliced_pool("max"), ()),
                ("PoolSumSliced", kernels.sliced_pool("sum"), ()),
            )
        ),
        # (OneHot depth dtype ids): ids[...] -> [..., depth], 1 where the index matches; captured from jax.nn.one_hot
        # (the convert_element_type that ends it: see Convert)
        OpSpec(
            ONE_HOT,
            ("i64", "String"),
            1,
            "elementwise",
            _one_hot,
            "one-hot",
            dtype_kind="one-hot",
            attributes=OneHotAttrs,
        ),
        # (Take table ids): table rows by index, zeros out of range; rules/kernels.egg puts it beside one_hot @ table
        OpSpec(
            "Take",
            (),
            2,
            "checked_gather",
            kernels.take_rows,
            "take",
            alternative=True,
        ),
        # (ScatterRows depth rows ids): rows[N, ...] added into a zero [depth, ...] table at ids[N], ids out of range
        # dropped; rules/kernels.egg puts it beside one_hot(ids).T @ rows (an embedding's gradient)
        OpSpec(
            "ScatterRows",
            ("i64",),
            2,
            "checked_gather",
            kernels.scatter_rows,
            "scatter-rows",
            alternative=True,
        ),
        # (TakeAlong fill x ids): x[B..., V] picked along its last axis at ids[B..., K], `fill` ("nan" or "zero")
        # for an id outside [0, V); captured from jnp.take_along_axis, put by rules/losses.egg beside one-hot sums
        OpSpec(
            TAKE_ALONG,
            ("String",),
            2,
            "gather",
            kernels.take_along,
            "take-along",
            ("gather",),  # that form of it alone (eqsat/capture/jaxpr.py)
            one_dtype=False,
        ),
        # (PutAlong x ids updates): x with updates[B..., K] added along its last axis at ids, out of range dropped;
        # captured from take_along_axis's gradient
        OpSpec(
            PUT_ALONG,
            (),
            3,
            "gather",
            kernels.put_along,
            "put-along",
            ("scatter-add",),  # that form of it alone (eqsat/capture/jaxpr.py)
            one_dtype=False,
        ),
        # (KeepInRange depth x ids): x where 0 <= ids < depth, else 0 (what a one-hot row sums x to; rules only)
        OpSpec(
            "KeepInRange",
            ("i64",),
            2,
            "elementwise",
            kernels.keep_in_range,
            "keep-in-range",
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
                "arg-reduce",
                primitives,
                dtype_kind="arg-reduce",
                alternative=name.endswith("Masked"),
                one_dtype=False,
                attributes=ArgReduceAttrs,
            )
            for name, lower, primitives in (
                (ARG_REDUCE, _arg_reduce, ("argmax", "argmin")),  # the kind from the primitive: eqsat/capture/jaxpr.py
                ("ArgReduceMasked", kernels.masked_arg_reduce, ()),
            )
        ),
        # broadcast_in_dim: (Bcast target_shape dims a)
        OpSpec(
            BCAST,
            ("Shape", "Shape"),
            1,
            "elementwise",
            lambda a, x: lax.broadcast_in_dim(x, tuple(a.shape), tuple(a.dims)),
            "broadcast",
            ("broadcast_in_dim",),
            capture_params=_bcast_params,
            view=True,
            attributes=BcastAttrs,
        ),
        _binary(ADD, lax.add, "add", sums=True),
        _binary("Sub", lax.sub, "sub", sums=True),
        _binary("Mul", lax.mul, "mul"),
        _binary("Div", lax.div, "div"),
        _binary("Max", lax.max, "max"),
        _binary("Min", lax.min, "min"),
        _unary("Neg", lax.neg, "neg"),
        _unary("Exp", lax.exp, "exp"),
        _unary("Log", lax.log, "log"),
        _unary("Tanh", lax.tanh, "tanh"),
        _unary("Logistic", lax.logistic, "logistic"),
        # XLA:CPU computes erfc in both of its ranges' forms (exp included), about 3.6x erf's work; exact gelu
        # (jax.nn.gelu(approximate=False), keras' default) is x / 2 * erfc(-x / sqrt 2)
        _unary("Erf", lax.erf, "erf", flops_per_element=11.0),
        _unary("Erfc", lax.erfc, "erfc", flops_per_element=40.0),
        _unary("Sqrt", lax.sqrt, "sqrt"),
        _unary("Rsqrt", lax.rsqrt, "rsqrt"),
        # (IntegerPow y a): a ** y for an integer y (jax.nn.gelu's cube)
        OpSpec(
            "IntegerPow",
            ("i64",),
            1,
            "elementwise",
            lambda attrs, a: lax.integer_pow(a, attrs[0]),
            "unary",
            ("integer_pow",),
            capture_params=lambda params: (int(params["y"]),),
            example_attrs=lambda _shape: [(2,), (3,)],
        ),
        # (Convert dtype a): a float value converted to another float dtype (jnp's reductions of bfloat16 values
        # run in float32 between two of these); convert_element_type ending jax.nn.one_hot is a OneHot, other
        # conversions stay opaque (eqsat/capture/jaxpr.py)
        OpSpec(
            CONVERT,
            ("String",),
            1,
            "elementwise",
            lambda attrs, a: lax.convert_element_type(a, np.dtype(attrs[0])),
            "unary",
            ("convert_element_type",),
            dtype_kind="convert",
            one_dtype=False,
        ),
        # swap the last two axes
        OpSpec(
            MT,
            (),
            1,
            "elementwise",
            lambda _attrs, a: _matrix_transpose(a),
            "matrix-transpose",
        ),
        # (Transpose permutation a)
        OpSpec(
            TRANSPOSE,
            ("Shape",),
            1,
            "elementwise",
            lambda attrs, a: lax.transpose(a, tuple(attrs[0])),
            "transpose",
            ("transpose",),
            capture_params=lambda params: (tuple(int(p) for p in params["permutation"]),),
        ),
        # (Pad low high a): zero padding of each axis, used by rules (enlarging a kernel), not captured
        OpSpec(
            "Pad",
            ("Shape", "Shape"),
            1,
            "elementwise",
            _zero_pad,
            "pad",
            attributes=PadAttrs,
        ),
        # (Reshape new_shape a); captured from reshape and squeeze (eqsat/capture/jaxpr.py)
        OpSpec(
            RESHAPE,
            ("Shape",),
            1,
            "bitcast",
            lambda attrs, a: lax.reshape(a, tuple(attrs[0])),
            "reshape",
            ("reshape", "squeeze"),
            view=True,
        ),
        # single-axis reductions: (ReduceSum axis a), (ReduceMax axis a)
        *(
            OpSpec(
                name,
                ("i64",),
                1,
                "elementwise",
                lambda attrs, a, fn=fn: fn(a, (attrs[0],)),
                "reduce-axis",
                (primitive,),
                capture_params=_reduce_params,
                sums=name == REDUCE_SUM,
            )
            for name, fn, primitive in (
                (REDUCE_SUM, lax.reduce_sum, "reduce_sum"),
                ("ReduceMax", lax.reduce_max, "reduce_max"),
            )
        ),
        # numerically stable composites that rules/stable.egg rewrites naive forms into (never captured)
        OpSpec(
            "Softmax",
            ("i64",),
            1,
            "elementwise",
            lambda attrs, a: kernels.softmax(attrs[0], a),
            "softmax",
            sums=True,
        ),
        OpSpec(
            "LogSumExp",
            ("i64",),
            1,
            "fused_read",
            lambda attrs, a: jax.nn.logsumexp(a, axis=attrs[0]),
            "reduce-axis",
            sums=True,
        ),
        # (Concat axis a b); an n-way concatenate is a chain of them (eqsat/capture/jaxpr.py)
        OpSpec(
            CONCAT,
            ("i64",),
            2,
            "elementwise",
            lambda attrs, a, b: lax.concatenate([a, b], attrs[0]),
            "concat",
            ("concatenate",),
        ),
        # (Slice axis start stop a); a unit-stride slice is a chain of them, one per axis it narrows
        # (eqsat/capture/jaxpr.py)
        OpSpec(
            SLICE,
            ("i64", "i64", "i64"),
            1,
            "elementwise",
            _slice,
            "slice",
            ("slice",),
            attributes=SliceAttrs,
        ),
        # (Cumulative kind axis reverse x): lax.cumsum / cumprod / cummax / cummin / cumlogsumexp (kind "sum", "prod",
        # "max", "min", "logsumexp"), backwards where reverse is 1; (CumulativeBlocked kind axis reverse block x) the
        # same in blocks, which rules/kernels.egg puts beside it (eqsat/ops/cumulative.py)
        *(
            OpSpec(
                name,
                ("String", "i64", "i64", *("i64",) * blocked),
                1,
                "reduction",
                lower,
                "cumulative-blocked" if blocked else "cumulative",
                primitives=() if blocked else tuple(cumulative.PRIMITIVES),  # the kind from the primitive: capture.py
                example_attrs=partial(_cumulative_examples, blocks=(1, 2, 3) if blocked else None),
                alternative=bool(blocked),
                attributes=BlockedCumulativeAttrs if blocked else CumulativeAttrs,
                # a product's partial products overflow or underflow in one order, not another
                sums=lambda attrs: attrs[0] in ("sum", "logsumexp", "prod"),
            )
            for name, lower, blocked in (
                (CUMULATIVE, cumulative.cumulative, 0),
                ("CumulativeBlocked", cumulative.blocked, 1),
            )
        ),
    ]
}


def captured_as(primitive: str) -> OpSpec | None:
    """The one entry that names this jax primitive (read at each call: a new entry counts at once)."""
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
