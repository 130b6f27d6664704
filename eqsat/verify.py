"""Rule verification: every equality a rule adds must hold on concrete values.

check_egraph (eqsat/egraph_check.py) evaluates every e-node of a saturated e-graph on concrete inputs and
compares it with its e-class's value. check_rules does that over random programs (hypothesis strategies built from
GENERATORS, one small entry per op or rule pattern) saturated with the rules under test, and counts how often each
rule fired.
Verification is about truth, not profitability: groups a target disables are checked too.
"""

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from jax import lax

from eqsat.capture import capture
from eqsat.egraph_check import Disagreement, check_egraph
from eqsat.errors import EqsatError
from eqsat.ir import Graph
from eqsat.ops import OPS
from eqsat.rule_sources import RuleSource, builtin_groups, collect, keeping, real_rules, rule_names, rules_in
from eqsat.saturate import Limits, Snapshot, saturate

Shape = tuple[int, ...]

# Small enough that one program saturates and evaluates in well under a second, large enough that rules
# two or three rewrites away from the captured program get to fire.
VERIFY_LIMITS = Limits(iterations=4, nodes=800, seconds=2.0)


# ---------------------------------------------------------------------------------------------------------------
# Random programs

DrawFn = Callable[[st.SearchStrategy[Any]], Any]


@dataclass(frozen=True)
class _Step:
    label: str
    fn: Callable[..., Any]  # the JAX computation of this value from its arguments' values
    args: tuple[int, ...]


@dataclass
class Program:
    """A random JAX program: values are inputs (a shape) or steps over earlier values; results are the sinks."""

    dtype: str
    values: list[Shape | _Step] = field(default_factory=list)
    shapes: list[Shape] = field(default_factory=list)

    def fresh(self, shape: Shape) -> int:
        self.values.append(tuple(shape))
        self.shapes.append(tuple(shape))
        return len(self.values) - 1

    def apply(self, label: str, fn: Callable[..., Any], *args: int) -> int:
        """Append a step; its shape comes from tracing fn, so generators need not compute shapes."""
        structs = [jax.ShapeDtypeStruct(self.shapes[a], self.dtype) for a in args]
        with jax.enable_x64(self.dtype.endswith("64")):
            out = jax.eval_shape(fn, *structs)
        self.values.append(_Step(label, fn, tuple(args)))
        self.shapes.append(tuple(out.shape))
        return len(self.values) - 1

    def pick(self, draw: DrawFn, ok: Callable[[Shape], bool], fresh: Shape) -> int:
        """An earlier value whose shape is ok (sharing operands is what many rules need), or a fresh input."""
        candidates = [i for i, s in enumerate(self.shapes) if ok(s)]
        if candidates and draw(st.booleans()):
            return draw(st.sampled_from(candidates))
        return self.fresh(fresh)

    @property
    def input_shapes(self) -> list[Shape]:
        return [v for v in self.values if not isinstance(v, _Step)]

    def outputs(self) -> list[int]:
        used = {a for v in self.values if isinstance(v, _Step) for a in v.args}
        return [i for i, v in enumerate(self.values) if isinstance(v, _Step) and i not in used]

    def __call__(self, *inputs: Any) -> list[Any]:
        it = iter(inputs)
        vals: list[Any] = []
        for v in self.values:
            vals.append(v.fn(*[vals[a] for a in v.args]) if isinstance(v, _Step) else next(it))
        return [vals[i] for i in self.outputs()]

    def random_inputs(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(s).astype(self.dtype) for s in self.input_shapes]

    def __repr__(self) -> str:
        lines, k = [f"dtype {self.dtype}"], 0
        for i, v in enumerate(self.values):
            if isinstance(v, _Step):
                lines.append(f"v{i} = {v.label}({', '.join(f'v{a}' for a in v.args)}) : {self.shapes[i]}")
            else:
                lines.append(f"v{i} = input x{k} : {v}")
                k += 1
        return "\n".join(lines)


def _dims(draw: DrawFn, n: int, lo: int = 1, hi: int = 8) -> Shape:
    return tuple(draw(st.integers(lo, hi)) for _ in range(n))


def _positive(prog: Program, x: int) -> int:
    """exp(tanh(x)) lies in [1/e, e]: a safe argument for log, sqrt, rsqrt and division."""
    return prog.apply("exp", lax.exp, prog.apply("tanh", lax.tanh, x))


def _any(draw: DrawFn, prog: Program) -> int:
    """Any earlier non-scalar value (conv outputs included), or a fresh rank 1-3 input."""
    return prog.pick(draw, lambda s: len(s) >= 1, _dims(draw, draw(st.integers(1, 3))))


def _unary(fn: Callable[..., Any], domain: str = "") -> Callable[[DrawFn, Program], int]:
    def gen(draw: DrawFn, prog: Program) -> int:
        x = _any(draw, prog)
        if domain == "positive":
            x = _positive(prog, x)
        elif domain == "bounded":  # keeps exp from overflowing to inf, which re-association turns into NaN
            x = prog.apply("tanh", lax.tanh, x)
        return prog.apply(fn.__name__, fn, x)

    return gen


def _binary(fn: Callable[..., Any], positive_right: bool = False) -> Callable[[DrawFn, Program], int]:
    def gen(draw: DrawFn, prog: Program) -> int:
        a = _any(draw, prog)
        shape = prog.shapes[a]
        how = draw(st.sampled_from(["same", "scalar", "row"]))
        if how == "scalar":  # a literal: captured as a scalar constant
            c = draw(st.sampled_from([0.5, 2.0, -1.5]))
            return prog.apply(f"{fn.__name__}_{c}", lambda x: fn(x, np.asarray(c, x.dtype)), a)
        b = _row(prog, shape) if how == "row" else prog.pick(draw, lambda s: s == shape, shape)
        if positive_right:
            b = _positive(prog, b)
        return prog.apply(fn.__name__, fn, a, b)

    return gen


def _dot_operands(draw: DrawFn, prog: Program) -> tuple[int, int]:
    a = prog.pick(draw, lambda s: 1 <= len(s) <= 3, _dims(draw, draw(st.integers(1, 3))))
    ra, k = len(prog.shapes[a]), prog.shapes[a][-1]
    ok_rank = range(max(1, 2 - ra + 1), 5 - ra)  # result rank ra + rb - 2 in 1..3
    rb = draw(st.sampled_from(list(ok_rank)))
    b = prog.pick(draw, lambda s: len(s) in ok_rank and s[0] == k, (k, *_dims(draw, rb - 1)))
    return a, b


def _dot(a: Any, b: Any) -> Any:
    return lax.dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())))


def _dot_t(a: Any, b: Any) -> Any:
    """a @ b.T with b a matrix: captured as (Dot a (MT b))."""
    return lax.dot_general(a, b, (((a.ndim - 1,), (1,)), ((), ())))


def _bdot(a: Any, b: Any) -> Any:
    return lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))))


def _bdot_t(a: Any, b: Any) -> Any:
    """Batched a @ b^T: captured as (BatchDot a (MT b))."""
    return lax.dot_general(a, b, (((2,), (2,)), ((0,), (0,))))


def _gen_dot(draw: DrawFn, prog: Program) -> int:
    return prog.apply("dot", _dot, *_dot_operands(draw, prog))


def _gen_dot_t(draw: DrawFn, prog: Program) -> int:
    a = _any(draw, prog)
    k = prog.shapes[a][-1]
    b = prog.pick(draw, lambda s: len(s) == 2 and s[1] == k, (draw(st.integers(1, 8)), k))
    return prog.apply("dot_t", _dot_t, a, b)


def _gen_batch_dot(draw: DrawFn, prog: Program) -> int:
    a = prog.pick(draw, lambda s: len(s) == 3, _dims(draw, 3))
    bsz, _, k = prog.shapes[a]
    if draw(st.booleans()):
        b = prog.pick(draw, lambda s: len(s) == 3 and s[0] == bsz and s[2] == k, (bsz, draw(st.integers(1, 8)), k))
        return prog.apply("batch_dot_t", _bdot_t, a, b)
    b = prog.pick(draw, lambda s: len(s) == 3 and s[:2] == (bsz, k), (bsz, k, draw(st.integers(1, 8))))
    return prog.apply("batch_dot", _bdot, a, b)


def _matrices(draw: DrawFn, prog: Program, batched: bool, n: int) -> list[Shape]:
    """n chainable shapes: [B,] d0 x d1, d1 x d2, ..."""
    d = _dims(draw, n + 1)
    lead = _dims(draw, 1) if batched else ()
    return [(*lead, d[i], d[i + 1]) for i in range(n)]


def _gen_chain(draw: DrawFn, prog: Program) -> int:
    """A three-operand product in a random association: what re-association and transposition rules match."""
    batched = draw(st.booleans())
    mul = _bdot if batched else _dot
    a, b, c = (prog.fresh(s) for s in _matrices(draw, prog, batched, 3))
    if draw(st.booleans()):
        return prog.apply("dot", mul, prog.apply("dot", mul, a, b), c)
    return prog.apply("dot", mul, a, prog.apply("dot", mul, b, c))


def _dot_sum(batched: bool, share: str) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_dot_sum(draw, prog, batched, share)


def _gen_dot_sum(draw: DrawFn, prog: Program, batched: bool, share: str) -> int:
    """x@w1 + y@w2 sharing the left operand, the right one, or neither: factoring and GEMM-merge patterns."""
    mul = _bdot if batched else _dot
    xs, ws = _matrices(draw, prog, batched, 2)
    x, w = prog.fresh(xs), prog.fresh(ws)
    y = x if share == "left" else prog.fresh(xs if share == "right" else (*xs[:-1], draw(st.integers(1, 8))))
    v = w if share == "right" else prog.fresh((*prog.shapes[y][:-2], prog.shapes[y][-1], ws[-1]))
    return prog.apply("add", lax.add, prog.apply("dot", mul, x, w), prog.apply("dot", mul, y, v))


def _gen_dot_of_sum(draw: DrawFn, prog: Program) -> int:
    """x@(w1 + w2) or (x1 + x2)@w: what the expanding distributivity rules match."""
    batched = draw(st.booleans())
    mul = _bdot if batched else _dot
    xs, ws = _matrices(draw, prog, batched, 2)
    if draw(st.booleans()):
        return prog.apply("dot", mul, prog.fresh(xs), prog.apply("add", lax.add, prog.fresh(ws), prog.fresh(ws)))
    return prog.apply("dot", mul, prog.apply("add", lax.add, prog.fresh(xs), prog.fresh(xs)), prog.fresh(ws))


def _gen_transposed(draw: DrawFn, prog: Program) -> int:
    """y @ t^T for t a product, a product with a transposed operand or a sum: (MT (Dot ..)), (MT (MT ..)) etc.,
    what the transpose rules match."""
    kind = draw(st.sampled_from(["dot", "dot_t", "add"]))
    batched = draw(st.booleans()) and kind != "dot_t"
    lead = _dims(draw, 1) if batched else ()
    p, q, r, m = _dims(draw, 4)
    a = prog.fresh((*lead, p, q))
    if kind == "add":
        t = prog.apply("add", lax.add, prog.pick(draw, lambda s: s == (*lead, p, q), (*lead, p, q)), a)
        r = q
    elif kind == "dot_t":
        t = prog.apply("dot_t", _dot_t, a, prog.fresh((r, q)))
    else:
        t = prog.apply("dot", _bdot if batched else _dot, a, prog.fresh((*lead, q, r)))
    y = prog.fresh((*lead, m, r))
    return prog.apply("batch_dot_t" if batched else "dot_t", _bdot_t if batched else _dot_t, y, t)


def _gen_shared_dots(draw: DrawFn, prog: Program) -> int:
    """Two products of one input kept as separate results: what merging GEMMs that share an input matches."""
    x = prog.fresh(_dims(draw, draw(st.integers(1, 3))))
    k = prog.shapes[x][-1]
    prog.apply("dot", _dot, x, prog.fresh((k, draw(st.integers(1, 8)))))
    return prog.apply("dot", _dot, x, prog.fresh((k, draw(st.integers(1, 8)))))


def _gen_step_projections(draw: DrawFn, prog: Program) -> int:
    """xs[t] @ W1 and xs[t] @ W2 for every step t of a sequence (an unrolled RNN's input projections): what batching
    a GEMM over the steps and merging GEMMs in program order match."""
    steps, batch, k = draw(st.integers(2, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 8))
    xs = prog.fresh((steps, batch, k))
    w1, w2 = prog.fresh((k, draw(st.integers(1, 8)))), prog.fresh((k, draw(st.integers(1, 8))))
    for t in range(steps):
        x = prog.apply(f"xs[{t}]", lambda v, t=t: v[t], xs)
        prog.apply("dot", _dot, x, w1)
        out = prog.apply("dot", _dot, x, w2)
    return out


_ACTIVATION_FNS = {"none": lambda y: y, "relu": jax.nn.relu, "tanh": jnp.tanh, "logistic": jax.nn.sigmoid}


def _dense(act: str) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_dense(draw, prog, act)


def _gen_dense(draw: DrawFn, prog: Program, act: str) -> int:
    """act(x @ W + b), b along the last axis, one or two such layers of one input: what grouping a GEMM with its
    bias and activation, and merging the groups, match. One generator entry per activation, so each leads some."""
    x = prog.fresh(_dims(draw, draw(st.integers(2, 3))))
    out = x
    for _ in range(draw(st.integers(1, 2))):
        n = draw(st.integers(1, 8))
        w, b = prog.fresh((prog.shapes[x][-1], n)), prog.fresh((n,))
        fn = _ACTIVATION_FNS[act]
        out = prog.apply(f"dense_{act}", lambda v, w, b, fn=fn: fn(v @ w + b), x, w, b)
    return out


def _gen_concat(draw: DrawFn, prog: Program) -> int:
    a = _any(draw, prog)
    shape = prog.shapes[a]
    axis = draw(st.integers(0, len(shape) - 1))
    other = (*shape[:axis], draw(st.integers(1, 8)), *shape[axis + 1 :])
    b = prog.pick(
        draw, lambda s: len(s) == len(shape) and s[:axis] + s[axis + 1 :] == shape[:axis] + shape[axis + 1 :], other
    )
    return prog.apply(f"concat{axis}", lambda x, y: lax.concatenate([x, y], axis), a, b)


def _gen_slice(draw: DrawFn, prog: Program) -> int:
    a = _any(draw, prog)
    shape = prog.shapes[a]
    axis = draw(st.integers(0, len(shape) - 1))
    start = draw(st.integers(0, shape[axis] - 1))
    stop = draw(st.integers(start + 1, shape[axis]))
    return prog.apply(f"slice{axis}[{start}:{stop}]", lambda x: lax.slice_in_dim(x, start, stop, axis=axis), a)


def _gen_bcast(draw: DrawFn, prog: Program) -> int:
    """broadcast_in_dim adding a leading axis."""
    a = prog.pick(draw, lambda s: 1 <= len(s) <= 2, _dims(draw, draw(st.integers(1, 2))))
    out = (draw(st.integers(1, 4)), *prog.shapes[a])
    return prog.apply("bcast", lambda x: lax.broadcast_in_dim(x, out, tuple(range(1, len(out)))), a)


def _row(prog: Program, shape: Shape) -> int:
    """A fresh vector along the last axis broadcast to `shape`: a per-channel scale or bias."""
    return prog.apply("bcast_row", lambda v: lax.broadcast_in_dim(v, shape, (len(shape) - 1,)), prog.fresh(shape[-1:]))


def _scale_shift(biased: bool | None) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_scale_shift(draw, prog, biased)


def _gen_scale_shift(draw: DrawFn, prog: Program, biased: bool | None) -> int:
    """layer(x) * scale + shift per output channel, layer a dense or conv layer, with or without (None: either) a
    bias of its own: BatchNorm in inference form."""
    if draw(st.booleans()):
        y = _gen_conv(draw, prog)
    else:
        x = prog.pick(draw, lambda s: 1 <= len(s) <= 3, _dims(draw, draw(st.integers(1, 3))))
        y = prog.apply("dot", _dot, x, prog.fresh((prog.shapes[x][-1], draw(st.integers(1, 8)))))
    shape = prog.shapes[y]
    if biased or (biased is None and draw(st.booleans())):
        y = prog.apply("add", lax.add, y, _row(prog, shape))
    scaled = prog.apply("mul", lax.mul, y, _row(prog, shape))
    return prog.apply("add", lax.add, scaled, _row(prog, shape)) if biased or draw(st.booleans()) else scaled


def _conv_fn(strides: Shape, pad: str, dilation: Shape, groups: int) -> Callable[[Any, Any], Any]:
    def conv(x: Any, k: Any) -> Any:
        return lax.conv_general_dilated(
            x,
            k,
            strides,
            pad,
            rhs_dilation=dilation,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups,
        )

    return conv


def _conv_params(
    draw: DrawFn, prog: Program, x: int, groups: int, strided: bool = False
) -> tuple[Shape, Callable[[Any, Any], Any], str]:
    """A kernel shape that fits x's spatial size (no empty outputs) and the conv, with its label; `strided`: a
    stride of 2 along H at least."""
    _, h, w, cin = prog.shapes[x]
    kh, kw = draw(st.integers(1, min(3, h))), draw(st.integers(1, min(3, w)))
    dilation = (draw(st.integers(1, 2)) if 2 * (kh - 1) < h else 1, 1)
    strides = (draw(st.integers(1 + strided, 2)), draw(st.integers(1, 2)))
    pad = draw(st.sampled_from(["VALID", "SAME"]))
    label = f"conv[strides={strides} {pad} dilation={dilation} groups={groups}]"
    return (kh, kw, cin // groups, groups * draw(st.integers(1, 3))), _conv_fn(strides, pad, dilation, groups), label


def _conv_input(draw: DrawFn, prog: Program, groups: int) -> int:
    fresh = (
        draw(st.integers(1, 2)),
        draw(st.integers(3, 6)),
        draw(st.integers(3, 6)),
        groups * draw(st.integers(1, 3)),
    )
    return prog.pick(draw, lambda s: len(s) == 4 and s[3] % groups == 0 and min(s) > 0, fresh)


def _gen_conv(draw: DrawFn, prog: Program) -> int:
    """NHWC x HWIO convolution with random strides, padding, dilation and groups."""
    groups = draw(st.sampled_from([1, 1, 2]))
    x = _conv_input(draw, prog, groups)
    kernel, conv, label = _conv_params(draw, prog, x, groups)
    return prog.apply(label, conv, x, prog.pick(draw, lambda s: s == kernel, kernel))


def _gen_depthwise(draw: DrawFn, prog: Program) -> int:
    """A depthwise conv (groups = input channels, a channel multiplier of 1-2): what kernel selection rewrites."""
    x = prog.fresh((draw(st.integers(1, 2)), draw(st.integers(3, 7)), draw(st.integers(3, 7)), draw(st.integers(1, 4))))
    channels = prog.shapes[x][3]
    kernel, conv, label = _conv_params(draw, prog, x, channels)
    kernel = (*kernel[:3], channels * draw(st.integers(1, 2)))
    return prog.apply(label, conv, x, prog.pick(draw, lambda s: s == kernel, kernel))


def _gen_grouped(draw: DrawFn, prog: Program) -> int:
    """A grouped conv with 2-3 input channels per group: what kernel selection computes as stacked patches."""
    groups, per_group = draw(st.integers(2, 3)), draw(st.integers(2, 3))
    x = prog.fresh((draw(st.integers(1, 2)), draw(st.integers(3, 6)), draw(st.integers(3, 6)), groups * per_group))
    kernel, conv, label = _conv_params(draw, prog, x, groups)
    return prog.apply(label, conv, x, prog.fresh(kernel))


def _pool(kind: str) -> Callable[[DrawFn, Program], int]:
    """lax.reduce_window of lax.max from -inf or lax.add from 0 (what flax, keras, haiku and equinox pools bind),
    over the spatial axes of NHWC or NCHW, with random window, strides and padding."""

    def gen(draw: DrawFn, prog: Program) -> int:
        x = prog.pick(draw, lambda s: len(s) == 4 and min(s[1:]) >= 3, (draw(st.integers(1, 2)), *_dims(draw, 3, 3)))
        spatial = (1, 2) if draw(st.booleans()) else (2, 3)  # NHWC or NCHW
        window = tuple(draw(st.integers(1, 3)) if d in spatial else 1 for d in range(4))
        strides = tuple(draw(st.integers(1, 2)) if d in spatial else 1 for d in range(4))
        if draw(st.booleans()):
            padding: Any = draw(st.sampled_from(["VALID", "SAME"]))
        else:
            pads = [(draw(st.integers(0, 1)), draw(st.integers(0, 1))) for _ in spatial]
            padding = tuple(pads[spatial.index(d)] if d in spatial else (0, 0) for d in range(4))
        init, fn = (-jnp.inf, lax.max) if kind == "max" else (0.0, lax.add)
        return prog.apply(
            f"{kind}_pool[window={window} strides={strides} padding={padding}]",
            lambda v: lax.reduce_window(v, np.array(init, v.dtype), fn, window, strides, padding),
            x,
        )

    return gen


def _gen_conv_grad(draw: DrawFn, prog: Program, wrt: str, depthwise: bool) -> int:
    """The input gradient (wrt="x") of a strided grouped conv, a conv of the lhs-dilated cotangent, or the weight
    gradient (wrt="w"), a batch-grouped conv, as jax transposes a conv (of a depthwise one if `depthwise`): the
    convs of a training step's backward pass."""
    if depthwise:
        x = prog.fresh((draw(st.integers(1, 2)), *_dims(draw, 2, 3, 7), draw(st.integers(1, 4))))
        groups = prog.shapes[x][3]
    else:
        groups = 2
        x = _conv_input(draw, prog, groups)
    kernel, conv, label = _conv_params(draw, prog, x, groups, strided=wrt == "x")
    x_shape = prog.shapes[x]
    g = prog.fresh(tuple(jax.eval_shape(conv, *(jax.ShapeDtypeStruct(s, "float32") for s in (x_shape, kernel))).shape))

    def transposed(fn: Callable[[Any], Any], shape: Shape, g: Any) -> Any:  # the transpose of linear fn at g
        return jax.linear_transpose(fn, jax.ShapeDtypeStruct(shape, g.dtype))(g)[0]

    if wrt == "x":
        k = prog.pick(draw, lambda s: s == kernel, kernel)
        return prog.apply(f"input_grad_{label}", lambda k, g: transposed(lambda v: conv(v, k), x_shape, g), k, g)
    return prog.apply(f"weight_grad_{label}", lambda v, g: transposed(lambda k: conv(v, k), kernel, g), x, g)


def _gen_one_hot(draw: DrawFn, prog: Program, use: str) -> int:
    """one_hot of integer ids (from a float input, negative and out-of-range ones included), alone (use="") or
    times a table ("table": the embedding that kernel selection turns into a gather) or contracted over the ids'
    axes with rows, one per id, as jax's gradient of the embedding with respect to the table does ("gradient":
    what kernel selection turns into a scatter-add)."""
    depth = draw(st.integers(1, 6))
    x = prog.fresh(_dims(draw, draw(st.integers(1, 2))))

    def one_hot(v: Any) -> Any:
        return jax.nn.one_hot(jnp.floor(v * depth).astype(jnp.int32), depth, dtype=v.dtype)

    if use == "table":
        rows = prog.fresh((depth, draw(st.integers(1, 5))))
        return prog.apply(f"one_hot{depth}_dot", lambda v, t: one_hot(v) @ t, x, rows)
    if use == "gradient":
        ids_axes = tuple(range(len(prog.shapes[x])))
        rows = prog.fresh((*prog.shapes[x], draw(st.integers(1, 5))))

        def gradient(v: Any, g: Any) -> Any:  # jax's form: (g contracted with one_hot over the ids' axes).T
            return lax.dot_general(g, one_hot(v), ((ids_axes, ids_axes), ((), ()))).T

        return prog.apply(f"one_hot{depth}_gradient", gradient, x, rows)
    return prog.apply(f"one_hot{depth}", one_hot, x)


def _gen_arg_reduce(draw: DrawFn, prog: Program) -> int:
    """argmax or argmin along an axis, of the input or of its floor (ties: the first position counts), the index
    as a float so that later steps can use it."""
    x = prog.pick(draw, lambda s: len(s) >= 1, _dims(draw, draw(st.integers(1, 3))))
    axis = draw(st.integers(0, len(prog.shapes[x]) - 1))
    reduce = draw(st.sampled_from([jnp.argmax, jnp.argmin]))
    tied = draw(st.booleans())

    def index(v: Any) -> Any:
        return reduce(jnp.floor(v) if tied else v, axis=axis).astype(v.dtype)

    return prog.apply(f"{reduce.__name__}{axis}{'_of_floor' if tied else ''}", index, x)


def _gen_sibling_convs(draw: DrawFn, prog: Program) -> int:
    """Two convs of one input with one window, kept apart or concatenated on channels: conv-merge patterns."""
    x = _conv_input(draw, prog, 1)
    kernel, conv, label = _conv_params(draw, prog, x, 1)
    other = (*kernel[:3], draw(st.integers(1, 3)))
    a, b = prog.apply(label, conv, x, prog.fresh(kernel)), prog.apply(label, conv, x, prog.fresh(other))
    if draw(st.booleans()):
        return prog.apply("concat3", lambda p, q: lax.concatenate([p, q], 3), a, b)
    return b


_TRANSPOSE_INNER = ("", "add", "mul", "tanh", "exp")


def _transpose(inner: str, rank: int | None = None) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_transpose(draw, prog, inner, rank)


def _gen_transpose(draw: DrawFn, prog: Program, inner: str, rank: int | None = None) -> int:
    """A permutation of the axes (often a swap of the last two), of a value or of an elementwise op; of a given
    rank or of rank 2-4."""
    ranks = (rank, rank) if rank else (2, 4)
    a = prog.pick(draw, lambda s: ranks[0] <= len(s) <= ranks[1], _dims(draw, draw(st.integers(*ranks))))
    if inner in ("add", "mul"):
        b = prog.pick(draw, lambda s: s == prog.shapes[a], prog.shapes[a])
        a = prog.apply(inner, lax.add if inner == "add" else lax.mul, a, b)
    elif inner:
        a = prog.apply(inner, lax.tanh if inner == "tanh" else lambda x: lax.exp(lax.tanh(x)), a)
    n = len(prog.shapes[a])
    swap = (*range(n - 2), n - 1, n - 2)
    perm = swap if draw(st.booleans()) else tuple(draw(st.permutations(range(n))))
    return prog.apply(f"transpose{perm}", lambda x: lax.transpose(x, perm), a)


def _gen_reshape(draw: DrawFn, prog: Program) -> int:
    """Two reshapes in a row (flatten, then back or to another factorization)."""
    a = _any(draw, prog)
    shape = prog.shapes[a]
    flat = prog.apply("reshape", lambda x: lax.reshape(x, (int(np.prod(shape)),)), a)
    back = shape if draw(st.booleans()) else (int(np.prod(shape[:-1])), shape[-1])
    return prog.apply(f"reshape{back}", lambda x: lax.reshape(x, back), flat)


def _gen_pad(draw: DrawFn, prog: Program) -> int:
    a = _any(draw, prog)
    config = [(draw(st.integers(0, 2)), draw(st.integers(0, 2)), 0) for _ in prog.shapes[a]]
    return prog.apply(f"pad{config}", lambda x: lax.pad(x, np.asarray(0, x.dtype), config), a)


def _reduce(fn: Callable[..., Any]) -> Callable[[DrawFn, Program], int]:
    def gen(draw: DrawFn, prog: Program) -> int:
        a = prog.pick(draw, lambda s: len(s) >= 2, _dims(draw, draw(st.integers(2, 3))))
        axis = draw(st.integers(0, len(prog.shapes[a]) - 1))
        return prog.apply(f"{fn.__name__}{axis}", lambda x: fn(x, axis=axis), a)

    return gen


def _gen_conv_sum(draw: DrawFn, prog: Program) -> int:
    """conv(x, w1) + conv(x, w2) or conv(x1, w) + conv(x2, w): conv linearity."""
    groups = draw(st.sampled_from([1, 2]))
    x = _conv_input(draw, prog, groups)
    kernel, conv, label = _conv_params(draw, prog, x, groups)
    w = prog.fresh(kernel)
    if draw(st.booleans()):
        a, b = prog.apply(label, conv, x, w), prog.apply(label, conv, x, prog.fresh(kernel))
    else:
        a, b = prog.apply(label, conv, x, w), prog.apply(label, conv, prog.fresh(prog.shapes[x]), w)
    return prog.apply("add", lax.add, a, b)


def _gen_enlarge(draw: DrawFn, prog: Program) -> int:
    """A 1x1 conv beside a padded 3x3 conv of one input and stride (SqueezeNet's expand layers)."""
    x = prog.fresh((draw(st.integers(1, 2)), draw(st.integers(3, 6)), draw(st.integers(3, 6)), draw(st.integers(1, 3))))
    s = (draw(st.integers(1, 2)),) * 2
    one = _conv_fn(s, ((0, 0), (0, 0)), (1, 1), 1)
    three = _conv_fn(s, ((1, 1), (1, 1)), (1, 1), 1)
    cin = prog.shapes[x][3]
    prog.apply(f"conv1x1[strides={s}]", one, x, prog.fresh((1, 1, cin, draw(st.integers(1, 3)))))
    return prog.apply(f"conv3x3[strides={s} pad=1]", three, x, prog.fresh((3, 3, cin, draw(st.integers(1, 3)))))


_CONCAT_KINDS = ("slice", "adjacent", "assoc", "add", "mul", "tanh", "logistic", "exp", "dot")


def _concat_ops(kind: str) -> Callable[[DrawFn, Program], int]:
    """Concats taken apart, re-associated, or under elementwise ops and contractions: the concat rules."""
    return lambda draw, prog: _gen_concat_ops(draw, prog, kind)


def _gen_concat_ops(draw: DrawFn, prog: Program, kind: str) -> int:
    rows, k, n = _dims(draw, 3)
    axis = draw(st.integers(0, 1))
    part = (rows, k)
    a, b = prog.fresh(part), prog.fresh(part)

    def cat(p: int, q: int, ax: int = axis) -> int:
        return prog.apply(f"concat{ax}", lambda x, y: lax.concatenate([x, y], ax), p, q)

    z = cat(a, b)
    if kind == "slice":
        lo, hi = (0, part[axis]) if draw(st.booleans()) else (part[axis], 2 * part[axis])
        return prog.apply(f"slice{axis}[{lo}:{hi}]", lambda x: lax.slice_in_dim(x, lo, hi, axis=axis), z)
    if kind == "adjacent":
        mid = part[axis]
        p = prog.apply(f"slice{axis}[0:{mid}]", lambda x: lax.slice_in_dim(x, 0, mid, axis=axis), z)
        q = prog.apply(f"slice{axis}[{mid}:]", lambda x: lax.slice_in_dim(x, mid, 2 * mid, axis=axis), z)
        return cat(p, q)
    if kind == "assoc":
        return cat(z, prog.fresh(part))
    if kind in ("add", "mul"):
        return prog.apply(kind, lax.add if kind == "add" else lax.mul, z, cat(prog.fresh(part), prog.fresh(part)))
    if kind in ("tanh", "logistic", "exp"):  # the pieces are fresh normal inputs: exp cannot overflow
        return prog.apply(kind, {"tanh": lax.tanh, "logistic": lax.logistic, "exp": lax.exp}[kind], z)
    if axis == 0:  # rows concatenated, then contracted over the columns
        return prog.apply("dot", _dot, z, prog.fresh((k, n)))
    return prog.apply("dot", _dot, prog.fresh((n, rows)), cat(prog.fresh(part), prog.fresh(part), 1))


def _gen_opaque(draw: DrawFn, prog: Program) -> int:
    """Primitives the table does not model: an opaque call, and a multi-result one projected with Get."""
    a = _any(draw, prog)
    if draw(st.booleans()):
        return prog.apply("sin", lax.sin, a)
    b = prog.pick(draw, lambda s: s == prog.shapes[a], prog.shapes[a])
    return prog.apply("sort_by", lambda x, y: lax.sort((x, y), num_keys=1)[1], a, b)


def _gen_naive_softmax(draw: DrawFn, prog: Program) -> int:
    """exp(x) / sum(exp(x)) over the last axis, rank 2-4, as people write it: what the stable-softmax rules match."""
    x = prog.fresh(_dims(draw, draw(st.integers(2, 4))))
    return prog.apply("naive_softmax", lambda v: jnp.exp(v) / jnp.sum(jnp.exp(v), axis=-1, keepdims=True), x)


def _gen_naive_logsumexp(draw: DrawFn, prog: Program) -> int:
    """log(sum(exp(x))) over an axis, or log-softmax x - log(sum(exp(x), keepdims)): the stable-logsumexp rule."""
    x = prog.fresh(_dims(draw, draw(st.integers(1, 3))))
    axis = draw(st.integers(0, len(prog.shapes[x]) - 1))
    if draw(st.booleans()):
        return prog.apply("naive_lse", lambda v: jnp.log(jnp.sum(jnp.exp(v), axis=axis)), x)
    return prog.apply("naive_log_softmax", lambda v: v - jnp.log(jnp.sum(jnp.exp(v), axis=axis, keepdims=True)), x)


def _unary_of_broadcast(fn: Callable[[Any], Any]) -> Callable[[DrawFn, Program], int]:
    """fn of a broadcast value: what moving unary ops before broadcasts matches."""

    def gen(draw: DrawFn, prog: Program) -> int:
        a = prog.fresh(_dims(draw, draw(st.integers(1, 2))))
        out = (draw(st.integers(1, 4)), *prog.shapes[a])
        return prog.apply(
            f"{fn.__name__}_of_bcast", lambda v: fn(lax.broadcast_in_dim(v, out, tuple(range(1, len(out))))), a
        )

    return gen


# One entry per op of the table (the JAX that captures as it) or rule pattern; a new op needs one entry here.
# Ops only rules create (Pad, Dense, the stable composites) still get an entry: the JAX that rules rewrite into them.
GENERATORS: dict[str, Callable[[DrawFn, Program], int]] = {
    "Dot": _gen_dot,
    **{f"Dense-{act}": _dense(act) for act in _ACTIVATION_FNS},
    "BatchDot": _gen_batch_dot,
    "MT": _gen_dot_t,
    "Add": _binary(lax.add),
    "Sub": _binary(lax.sub),
    "Mul": _binary(lax.mul),
    "Div": _binary(lax.div, positive_right=True),
    "Max": _binary(lax.max),
    "Min": _binary(lax.min),
    "Neg": _unary(lax.neg),
    "Exp": _unary(lax.exp, "bounded"),
    "Log": _unary(lax.log, "positive"),
    "Tanh": _unary(lax.tanh),
    "Logistic": _unary(lax.logistic),
    "Sqrt": _unary(lax.sqrt, "positive"),
    "Rsqrt": _unary(lax.rsqrt, "positive"),
    "Concat": _gen_concat,
    "Slice": _gen_slice,
    "Bcast": _gen_bcast,
    "Conv": _gen_conv,
    "ShiftConv": _gen_depthwise,
    "PatchConv": _gen_grouped,
    "BcastBatchDot": _gen_batch_dot,
    **{f"Pool{kind.title()}{sliced}": _pool(kind) for kind in ("max", "sum") for sliced in ("", "Sliced")},
    "Dilate": lambda draw, prog: _gen_conv_grad(draw, prog, "x", depthwise=draw(st.booleans())),
    "ConvBG": lambda draw, prog: _gen_conv_grad(draw, prog, "w", depthwise=False),
    "ShiftConvBG": lambda draw, prog: _gen_conv_grad(draw, prog, "w", depthwise=True),
    "OneHot": lambda draw, prog: _gen_one_hot(draw, prog, ""),
    "Take": lambda draw, prog: _gen_one_hot(draw, prog, "table"),
    "ScatterRows": lambda draw, prog: _gen_one_hot(draw, prog, "gradient"),
    "ArgReduce": _gen_arg_reduce,
    "ArgReduceMasked": _gen_arg_reduce,
    "sibling-convs": _gen_sibling_convs,
    "Op": _gen_opaque,
    **{f"Transpose{'-' + inner if inner else ''}": _transpose(inner) for inner in _TRANSPOSE_INNER},
    "Transpose-4d": _transpose("", rank=4),
    "Reshape": _gen_reshape,
    "Pad": _gen_pad,
    "ReduceSum": _reduce(jnp.sum),
    "ReduceMax": _reduce(jnp.max),
    "conv-sum": _gen_conv_sum,
    "enlarge": _gen_enlarge,
    **{f"concat-{kind}": _concat_ops(kind) for kind in _CONCAT_KINDS},
    # rule patterns several ops make up
    "chain": _gen_chain,
    **{
        f"{kind}-sum-{share}": _dot_sum(kind == "batchdot", share)
        for kind in ("dot", "batchdot")
        for share in ("left", "right", "none")
    },
    "dot-of-sum": _gen_dot_of_sum,
    "shared-dots": _gen_shared_dots,
    "step-projections": _gen_step_projections,
    "transposed": _gen_transposed,
    "scale-shift": _scale_shift(None),
    "scale-shift-biased": _scale_shift(True),
    "Softmax": _gen_naive_softmax,
    "LogSumExp": _gen_naive_logsumexp,
    "exp-of-bcast": _unary_of_broadcast(lambda v: lax.exp(lax.tanh(v))),
    "tanh-of-bcast": _unary_of_broadcast(lax.tanh),
    "log-of-bcast": _unary_of_broadcast(lambda v: lax.log(lax.exp(lax.tanh(v)))),
}


@st.composite
def programs(
    draw: DrawFn, dtypes: Sequence[str] = ("float32", "float64"), max_steps: int = 4, lead: str | None = None
) -> Program:
    """A random program of 1..max_steps generator entries (the first `lead` if given) over dims 1-8, one dtype."""
    prog = Program(draw(st.sampled_from(list(dtypes))))
    if lead is not None:
        GENERATORS[lead](draw, prog)
    for _ in range(draw(st.integers(0 if lead else 1, max_steps - (lead is not None)))):
        GENERATORS[draw(st.sampled_from(sorted(GENERATORS)))](draw, prog)
    return prog


# Shapes a rule's own pattern is tried at, every tensor variable one shape: square matrices let contractions,
# transposes and elementwise ops of one pattern all type-check.
_PATTERN_SHAPES: tuple[Shape, ...] = ((4,), (4, 4), (3, 4), (2, 4, 4), (2, 3, 3, 4))


class _Unbuildable(Exception):
    """A pattern the op table cannot build as a program: an attribute that is a variable, a non-op term."""


def pattern_programs(command: Any, dtypes: Sequence[str] = ("float32", "float64")) -> list[Program]:
    """Programs that compute a rule's left-hand side itself (every op term of a rewrite's left side, a birewrite's
    two sides or a rule's query), its variables fresh inputs of one shape, for each shape that type-checks:
    what `rules check` runs for a rule no generator reaches, so that it is verified all the same."""
    if hasattr(command, "rewrite"):
        sides = [command.rewrite.lhs] + ([command.rewrite.rhs] if type(command).__name__ == "BiRewriteCommand" else [])
        queries = [[side] for side in sides]
    else:
        facts = command.rule.body
        queries = [[e for f in facts for e in ((f.left, f.right) if hasattr(f, "left") else (f.expr,))]]
    out = []
    for terms in queries:
        terms = [t for t in terms if type(t).__name__ == "Call" and t.name in OPS and t.name != "Var"]
        for shape in _PATTERN_SHAPES if terms else ():
            for dtype in dtypes:
                prog, env = Program(dtype), {}
                try:
                    for term in terms:
                        _build(prog, env, term, shape)
                except Exception:  # _Unbuildable, or ops that do not type-check at this shape
                    continue
                out.append(prog)
    return out


def _build(prog: Program, env: dict[str, int], expr: Any, shape: Shape) -> int:
    kind = type(expr).__name__
    if kind == "Var":
        if expr.name not in env:
            env[expr.name] = prog.fresh(shape)
        return env[expr.name]
    if kind != "Call" or expr.name not in OPS or expr.name == "Var":
        raise _Unbuildable(expr)
    spec = OPS[expr.name]
    attrs = tuple(_attribute(a) for a in expr.args[: len(spec.attrs)])
    inputs = [_build(prog, env, a, shape) for a in expr.args[len(spec.attrs) :]]
    return prog.apply(f"{expr.name}{list(attrs) if attrs else ''}", lambda *xs: spec.lower(attrs, *xs), *inputs)


def _attribute(expr: Any) -> Any:
    """A literal attribute of a pattern: an integer, a string, or a (vec-of ...) of integers."""
    kind = type(expr).__name__
    if kind == "Lit":
        return expr.value.value
    if kind == "Call" and expr.name in ("vec-of", "vec-empty"):
        return tuple(_attribute(a) for a in expr.args)
    raise _Unbuildable(expr)


def check_program(
    prog: Program, sources: list[RuleSource], seed: int = 0, limits: Limits = VERIFY_LIMITS
) -> tuple[list[Disagreement], Snapshot, Graph]:
    """Capture, saturate with `sources` and check every e-class on random normal inputs: with the rules sound in
    floating point alone, within their tight tolerance, then (if some rules are marked real) with every rule,
    within the tolerance of real-number rules. Returns the disagreements and the last saturation."""
    inputs = prog.random_inputs(seed)
    with jax.enable_x64(prog.dtype.endswith("64")):
        graph = capture(jax.make_jaxpr(prog)(*inputs))
    float_sound = _float_sound(tuple(sources))
    snapshot = saturate(graph, list(float_sound or sources), limits)
    found = check_egraph(graph, snapshot, inputs, real=False)
    if float_sound is not None:
        snapshot = saturate(graph, sources, limits)
        found += check_egraph(graph, snapshot, inputs, real=True)
    return found, snapshot, graph


# ---------------------------------------------------------------------------------------------------------------
# Rules over many programs


@dataclass
class RuleStat:
    name: str  # the :name, else egglog's text of the rule; "=>" / "<=" for the two directions of a birewrite
    group: str
    real: bool = False  # marked `; @real`: checked within the tolerance of real-number rules
    fired: int = 0
    unsound: bool = False  # reproduced a disagreement on its own

    @property
    def verdict(self) -> str:
        if self.unsound:
            return "UNSOUND"
        return "ok" if self.fired else "never fired"


@dataclass
class Report:
    rules: list[RuleStat]
    disagreements: list[Disagreement]
    errors: list[str]  # programs whose saturation failed (a rule equating different shapes, ...)
    programs: int
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.disagreements and not self.errors and all(r.fired for r in self.rules)

    def table(self) -> str:
        width = min(60, max((len(r.name) for r in self.rules), default=4))
        group = max((len(r.group) for r in self.rules), default=5)
        lines = [f"{'rule':<{width}}  {'group':<{group}}  {'holds for':<9}  {'fired':>7}  verdict"]
        for r in self.rules:
            name = r.name if len(r.name) <= width else r.name[: width - 3] + "..."
            holds = "reals" if r.real else "floats"
            lines.append(f"{name:<{width}}  {r.group:<{group}}  {holds:<9}  {r.fired:>7}  {r.verdict}")
        lines.append(
            f"{len(self.rules)} rules, {self.programs} programs, {len(self.disagreements)} disagreeing e-classes, "
            f"{self.seconds:.1f} s"
        )
        return "\n".join(lines)


@functools.lru_cache(maxsize=8)
def _float_sound(sources: tuple[RuleSource, ...]) -> tuple[RuleSource, ...] | None:
    """The sources without the rules marked real, or None when none is marked (computed once per rule set)."""
    real = real_rules(list(sources))
    return tuple(keeping(list(sources), lambda names: not set(names) & real)) if real else None


def check_rules(
    sources: list[RuleSource], examples: int = 100, limits: Limits = VERIFY_LIMITS, max_steps: int = 4
) -> Report:
    """Saturate `examples` random programs with the rules and check every e-class; count each rule's matches.

    Deterministic (hypothesis derandomized). A disagreement's program is re-saturated with each rule that fired
    alone, and those that reproduce it are marked unsound.
    """
    start = time.perf_counter()
    real = real_rules(sources)
    stats = {name: RuleStat(name, src.name, name in real) for src in sources for name in rule_names(src)}
    found: list[Disagreement] = []
    errors: list[str] = []
    count = 0
    run_settings = settings(
        max_examples=max(1, -(-examples // len(GENERATORS))),
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )

    def run(prog: Program, seed: int) -> None:
        nonlocal count
        count += 1
        try:
            bad, snapshot, _ = check_program(prog, sources, seed, limits)
        except EqsatError as error:
            errors.append(f"{error}\n  program: {prog!r}".replace("\n", "\n  "))
            return
        for rule, matches in snapshot.rule_matches.items():
            stats.setdefault(rule, RuleStat(rule, "?")).fired += matches
        if bad:
            suspects = tuple(_reproducing(prog, sources, seed, limits, bad[0].rules))
            for name in suspects:
                stats[name].unsound = True
            found.extend(Disagreement(**{**d.__dict__, "program": repr(prog), "suspects": suspects}) for d in bad)

    # each generator entry leads its share of the programs, so every op and rule pattern is exercised
    for lead in sorted(GENERATORS):
        run_settings(given(programs(max_steps=max_steps, lead=lead), st.integers(0, 2**31 - 1))(run))()
    # the user's rules, and any rule no generator reached, also run on programs built from their own patterns
    builtin = set(builtin_groups())
    for src in sources:
        for rule in rules_in(src):
            if src.name not in builtin or not any(stats[name].fired for name in rule.names):
                for seed, prog in enumerate(pattern_programs(rule.command)):
                    run(prog, seed)
    return Report(list(stats.values()), found, errors, count, time.perf_counter() - start)


def _reproducing(
    prog: Program, sources: list[RuleSource], seed: int, limits: Limits, fired: tuple[str, ...]
) -> list[str]:
    """The rules among `fired` that make the program disagree on their own."""
    culprits = []
    for rule in fired:
        alone = keeping(sources, lambda names, rule=rule: rule in names)
        try:
            if check_program(prog, alone, seed, limits)[0]:
                culprits.append(rule)
        except EqsatError:
            continue
    return culprits


def run_check(files: Sequence[str], examples: int = 100) -> int:
    """`python -m eqsat rules check [FILE...]`: the built-in groups plus the files; 0 when every rule fired
    and no e-class disagreed, 1 otherwise."""
    report = check_rules(collect(list(files)), examples)
    print(report.table())
    for d in report.disagreements:
        print()
        print(d.describe())
    for error in report.errors:
        print(f"\nsaturation failed: {error}")
    silent = [r.name for r in report.rules if not r.fired]
    if silent:
        print(
            f"\nnever fired on {report.programs} programs (neither a generator nor its own pattern, built from the "
            f"op table, produced its left-hand side): {silent}"
        )
    return 0 if report.ok else 1
