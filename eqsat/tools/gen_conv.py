"""Generators of random programs over convolutions (grouped, depthwise, their gradients), pools and one-hot
embeddings: one entry of CONV per op or rule pattern."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

from eqsat.tools.gen_algebra import dot, row
from eqsat.tools.program import DrawFn, Program, Shape, dims

# channels-last dimension numbers of 1, 2 and 3 spatial axes
LAYOUTS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}


def _conv_fn(strides: Shape, pad: Any, dilation: Shape, groups: int) -> Callable[[Any, Any], Any]:
    def conv(x: Any, k: Any) -> Any:
        return lax.conv_general_dilated(
            x,
            k,
            strides,
            pad,
            rhs_dilation=dilation,
            dimension_numbers=LAYOUTS[len(strides)],
            feature_group_count=groups,
        )

    return conv


def _conv_params(
    draw: DrawFn, prog: Program, x: int, groups: int, strided: bool = False
) -> tuple[Shape, Callable[[Any, Any], Any], str]:
    """A kernel shape that fits x's spatial size (no empty outputs) and the conv of x's rank, with its label;
    `strided`: a stride of 2 along the first spatial axis at least. Padding is VALID, SAME or causal (all of a
    window's padding before the first element, as temporal convs have)."""
    _, *spatial, cin = prog.shapes[x]
    kernel = [draw(st.integers(1, min(3, n))) for n in spatial]
    dilation = (draw(st.integers(1, 2)) if 2 * (kernel[0] - 1) < spatial[0] else 1, *(1,) * (len(spatial) - 1))
    strides = (draw(st.integers(1 + strided, 2)), *(draw(st.integers(1, 2)) for _ in spatial[1:]))
    pad = draw(st.sampled_from(["VALID", "SAME", "causal"]))
    if pad == "causal":
        pad = [(d * (k - 1), 0) for k, d in zip(kernel, dilation, strict=True)]
    label = f"conv[strides={strides} {pad} dilation={dilation} groups={groups}]"
    kernel_shape = (*kernel, cin // groups, groups * draw(st.integers(1, 3)))
    return kernel_shape, _conv_fn(strides, pad, dilation, groups), label


def _conv_shape(draw: DrawFn, channels: int) -> Shape:
    """A fresh conv input of 1, 2 or 3 spatial axes (small ones when there are three)."""
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    return (draw(st.integers(1, 2)), *dims(draw, rank, 3, 7 if rank < 3 else 4), channels)


def _conv_input(draw: DrawFn, prog: Program, groups: int) -> int:
    fresh = _conv_shape(draw, groups * draw(st.integers(1, 3)))
    return prog.pick(draw, lambda s: 3 <= len(s) <= 5 and s[-1] % groups == 0 and min(s) > 0, fresh)


def _gen_conv(draw: DrawFn, prog: Program) -> int:
    """A channels-last convolution of 1-3 spatial axes with random strides, padding, dilation and groups."""
    groups = draw(st.sampled_from([1, 1, 2]))
    x = _conv_input(draw, prog, groups)
    kernel, conv, label = _conv_params(draw, prog, x, groups)
    return prog.apply(label, conv, x, prog.pick(draw, lambda s: s == kernel, kernel))


def _gen_depthwise(draw: DrawFn, prog: Program) -> int:
    """A depthwise conv (groups = input channels, a channel multiplier of 1-2): what kernel selection rewrites."""
    x = prog.fresh(_conv_shape(draw, draw(st.integers(1, 4))))
    channels = prog.shapes[x][-1]
    kernel, conv, label = _conv_params(draw, prog, x, channels)
    kernel = (*kernel[:-1], channels * draw(st.integers(1, 2)))
    return prog.apply(label, conv, x, prog.pick(draw, lambda s: s == kernel, kernel))


def _gen_grouped(draw: DrawFn, prog: Program) -> int:
    """A grouped conv with 2-3 input channels per group: what kernel selection computes as stacked patches."""
    groups, per_group = draw(st.integers(2, 3)), draw(st.integers(2, 3))
    x = prog.fresh(_conv_shape(draw, groups * per_group))
    kernel, conv, label = _conv_params(draw, prog, x, groups)
    return prog.apply(label, conv, x, prog.fresh(kernel))


def _pool(kind: str) -> Callable[[DrawFn, Program], int]:
    """lax.reduce_window of lax.max from -inf or lax.add from 0 (what flax, keras, haiku and equinox pools bind),
    over the spatial axes of NHWC or NCHW, with random window, strides and padding."""

    def gen(draw: DrawFn, prog: Program) -> int:
        x = prog.pick(draw, lambda s: len(s) == 4 and min(s[1:]) >= 3, (draw(st.integers(1, 2)), *dims(draw, 3, 3)))
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
        x = prog.fresh(_conv_shape(draw, draw(st.integers(1, 4))))
        groups = prog.shapes[x][-1]
    else:
        groups = 2
        x = _conv_input(draw, prog, groups)
    kernel, conv, label = _conv_params(draw, prog, x, groups, strided=wrt == "x")
    x_shape = prog.shapes[x]
    g = prog.fresh(tuple(jax.eval_shape(conv, *(jax.ShapeDtypeStruct(s, "float32") for s in (x_shape, kernel))).shape))

    if wrt == "x":
        k = prog.pick(draw, lambda s: s == kernel, kernel)
        return prog.apply(f"input_grad_{label}", lambda k, g: _transposed(lambda v: conv(v, k), x_shape, g), k, g)
    return prog.apply(f"weight_grad_{label}", lambda v, g: _transposed(lambda k: conv(v, k), kernel, g), x, g)


def _transposed(fn: Callable[[Any], Any], shape: Shape, g: Any) -> Any:
    """The transpose of linear fn at g: jax's gradient of what fn computes."""
    return jax.linear_transpose(fn, jax.ShapeDtypeStruct(shape, g.dtype))(g)[0]


def _pointwise_conv(draw: DrawFn, prog: Program) -> tuple[int, Shape, Callable[[Any, Any], Any]]:
    """An input of 1-3 spatial axes, a 1x1 kernel's shape for it, and the conv (stride 1, no padding)."""
    x = _conv_input(draw, prog, 1)
    ones = (1,) * (len(prog.shapes[x]) - 2)
    return x, (*ones, prog.shapes[x][-1], draw(st.integers(1, 4))), _conv_fn(ones, "VALID", ones, 1)


def _gen_pointwise_weight_grad(draw: DrawFn, prog: Program) -> int:
    """The weight gradient of a 1x1 conv (stride 1, no padding) of 1-3 spatial axes, as jax transposes it: a conv
    whose window covers its whole input, what kernel selection computes as one matrix product."""
    x, kernel, conv = _pointwise_conv(draw, prog)
    g = prog.fresh((*prog.shapes[x][:-1], kernel[-1]))
    return prog.apply("weight_grad_conv1x1", lambda v, g: _transposed(lambda k: conv(v, k), kernel, g), x, g)


def _gen_pointwise(draw: DrawFn, prog: Program) -> int:
    """A 1x1 conv (stride 1, no padding) of 1-3 spatial axes: what kernel selection computes as one matrix product
    over the channels."""
    x, kernel, conv = _pointwise_conv(draw, prog)
    return prog.apply("conv1x1", conv, x, prog.pick(draw, lambda s: s == kernel, kernel))


def _gen_transposed(draw: DrawFn, prog: Program) -> int:
    """lax.conv_transpose of 1-3 spatial axes, stride 2 or 3, VALID or SAME: an lhs-dilated conv, what kernel
    selection computes as its phases."""
    x = _conv_input(draw, prog, 1)
    _, *spatial, channels = prog.shapes[x]
    strides = tuple(draw(st.integers(2, 3)) for _ in spatial)
    kernel = (*(draw(st.integers(1, 4)) for _ in spatial), channels, draw(st.integers(1, 3)))
    padding = draw(st.sampled_from(["VALID", "SAME"]))
    dims = LAYOUTS[len(spatial)]
    return prog.apply(
        f"conv_transpose[strides={strides} {padding}]",
        lambda v, k: lax.conv_transpose(v, k, strides, padding, dimension_numbers=dims),
        x,
        prog.pick(draw, lambda s: s == kernel, kernel),
    )


def _gen_one_hot(draw: DrawFn, prog: Program, use: str) -> int:
    """one_hot of integer ids (from a float input, negative and out-of-range ones included), alone (use="") or
    times a table ("table": the embedding that kernel selection turns into a gather) or contracted over the ids'
    axes with rows, one per id, as jax's gradient of the embedding with respect to the table does ("gradient":
    what kernel selection turns into a scatter-add)."""
    depth = draw(st.integers(1, 6))
    x = prog.fresh(dims(draw, draw(st.integers(1, 2))))

    def one_hot(v: Any) -> Any:
        return jax.nn.one_hot(jnp.floor(v * depth).astype(jnp.int32), depth, dtype=v.dtype)

    if use == "table":
        rows = prog.fresh((depth, draw(st.integers(1, 5))))
        return prog.apply(f"one_hot{depth}dot", lambda v, t: one_hot(v) @ t, x, rows)
    if use == "gradient":
        ids_axes = tuple(range(len(prog.shapes[x])))
        rows = prog.fresh((*prog.shapes[x], draw(st.integers(1, 5))))

        def gradient(v: Any, g: Any) -> Any:  # jax's form: (g contracted with one_hot over the ids' axes).T
            return lax.dot_general(g, one_hot(v), ((ids_axes, ids_axes), ((), ()))).T

        return prog.apply(f"one_hot{depth}_gradient", gradient, x, rows)
    return prog.apply(f"one_hot{depth}", one_hot, x)


def _gen_sibling_convs(draw: DrawFn, prog: Program, concatenated: bool) -> int:
    """Two convs of one input with one window, kept apart or concatenated on channels: conv-merge patterns (each
    its own entry, so that every run draws both, whatever its seed)."""
    x = _conv_input(draw, prog, 1)
    kernel, conv, label = _conv_params(draw, prog, x, 1)
    other = (*kernel[:-1], draw(st.integers(1, 3)))
    a, b = prog.apply(label, conv, x, prog.fresh(kernel)), prog.apply(label, conv, x, prog.fresh(other))
    if concatenated:
        return prog.apply("concat_channels", lambda p, q: lax.concatenate([p, q], p.ndim - 1), a, b)
    return b


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


def _scale_shift(biased: bool | None) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_scale_shift(draw, prog, biased)


def _gen_scale_shift(draw: DrawFn, prog: Program, biased: bool | None) -> int:
    """layer(x) * scale + shift per output channel, layer a dense or conv layer, with or without (None: either) a
    bias of its own: BatchNorm in inference form."""
    if draw(st.booleans()):
        y = _gen_conv(draw, prog)
    else:
        x = prog.pick(draw, lambda s: 1 <= len(s) <= 3, dims(draw, draw(st.integers(1, 3))))
        y = prog.apply("dot", dot, x, prog.fresh((prog.shapes[x][-1], draw(st.integers(1, 8)))))
    shape = prog.shapes[y]
    if biased or (biased is None and draw(st.booleans())):
        y = prog.apply("add", lax.add, y, row(prog, shape))
    scaled = prog.apply("mul", lax.mul, y, row(prog, shape))
    return prog.apply("add", lax.add, scaled, row(prog, shape)) if biased or draw(st.booleans()) else scaled


CONV: dict[str, Callable[[DrawFn, Program], int]] = {
    "Conv": _gen_conv,
    "ShiftConv": _gen_depthwise,
    "PatchConv": _gen_grouped,
    **{f"Pool{kind.title()}{sliced}": _pool(kind) for kind in ("max", "sum") for sliced in ("", "Sliced")},
    "conv-input-grad": lambda draw, prog: _gen_conv_grad(draw, prog, "x", depthwise=draw(st.booleans())),
    "conv-weight-grad": lambda draw, prog: _gen_conv_grad(draw, prog, "w", depthwise=False),
    "ShiftConvBG": lambda draw, prog: _gen_conv_grad(draw, prog, "w", depthwise=True),
    "PhaseConv": _gen_transposed,
    "DotConv": _gen_pointwise_weight_grad,
    "PointwiseDot": _gen_pointwise,
    "OneHot": lambda draw, prog: _gen_one_hot(draw, prog, ""),
    "Take": lambda draw, prog: _gen_one_hot(draw, prog, "table"),
    "ScatterRows": lambda draw, prog: _gen_one_hot(draw, prog, "gradient"),
    "sibling-convs": lambda draw, prog: _gen_sibling_convs(draw, prog, concatenated=False),
    "concat-of-sibling-convs": lambda draw, prog: _gen_sibling_convs(draw, prog, concatenated=True),
    "conv-sum": _gen_conv_sum,
    "enlarge": _gen_enlarge,
    "scale-shift": _scale_shift(None),
    "scale-shift-biased": _scale_shift(True),
}
