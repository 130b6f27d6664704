"""Kernel selection (issue 12): models whose XLA:CPU kernels run far below their roofline, each called plainly as
`eqsat.optimize(f)(params, x)` and timed against jax.jit in the same process, interleaved.

    python -m benches.kernels                       # all cases (the keras ones need `pip install -e .[models]`)
    python -m benches.kernels --only onehot,MobileNetV2 --markdown rows.md
    python -m benches.kernels --only maxpool,sumpool,grouped56,grouped7,tinybatch   # docs/kernel-gaps.md's single ops
    python -m benches.kernels --only transposed_gemv   # x @ W.T with W a declared parameter, timed prepared
    python -m benches.kernels --only argmax   # argmax over the last axis of 64x32000 (a vocabulary's logits)
    python -m benches.kernels --only conv1d,conv3d,mamba_mixer,volumetric_cnn   # issue 26: convs of every rank
    python -m benches.kernels --only transposed_decoder   # three stride-2 flax ConvTranspose, 64 channels to 128x128
    python -m benches.kernels --only cumsum,sum30_python,sum30_reduce,sum30_stack   # issue 26 items 3 and 6
    python -m benches.kernels --only gelu_exact   # jax.nn.gelu(x, approximate=False), float32 (issue 42 finding 3)
    python -m benches.kernels --only gelu_bf16,rmsnorm_bf16,softmax_bf16,mlp_bf16   # issue 26 item 5: bfloat16
    python -m benches.kernels --only xent,xent_grad,xent_onehot,xent_onehot_grad,xent_keras,xent_keras_grad   # item 4

Per case: the ratio (jax.jit time / eqsat time) with its interquartile range; jax.jit's first call; eqsat's first
call with an empty timing cache and again with the cache warm (the plans forgotten and made again, as a later
process would make them); how many kernels were measured; the largest difference from jax.jit's result, relative
to its largest value.
"""

import argparse
import functools
import json
import operator
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import eqsat
from benches.models import nasnet_a
from benches.models.keras_apps import keras_app
from eqsat.numerics.measure import interleaved
from eqsat.numerics.tolerance import ulps
from eqsat.numerics.widening import widened
from eqsat.support.workload import Workload
from eqsat.tools.versus import against_jit, settled

KERAS = ("MobileNetV2", "EfficientNetB0", "MobileNetV3Small", "NASNetMobile", "ConvNeXtTiny")
BARS = {"MobileNetV2": 6, "EfficientNetB0": 4, "MobileNetV3Small": 3, "NASNetMobile": 3, "ConvNeXtTiny": 1.8,
        "onehot": 10, "nasnet_a": 2, "mobilenetv2_train": 3, "maxpool": 1.5, "sumpool": 2, "grouped56": 1,
        "grouped7": 1, "tinybatch": 4, "conv1d": 15, "conv3d": 50, "transposed_decoder": 1.3,
        "cumsum": 3, "sum30_python": 10, "sum30_reduce": 10, "sum30_stack": 10,
        "gelu_bf16": 2, "rmsnorm_bf16": 2, "softmax_bf16": 2, "mlp_bf16": 1.1,
        **{name + "_grad" * grad: 1.5 if grad else 1.8 for name in ("xent", "xent_onehot", "xent_keras")
           for grad in (False, True)}}  # fmt: skip
# onehot's bar was 100 for a gather exact only on finite tables; jax.jit's NaNs need the table read each call (issue 42)
# cases timed beside a hand rewrite of their slow kernels (the same run): eqsat must reach this share of its ratio
HAND_SHARE = 2 / 3


def _one_hot(train: bool = False) -> Workload:
    """one_hot(ids) @ table, vocabulary 32000, width 512, ids 4x128; with `train`, value_and_grad of a loss of it
    with respect to the table (the gradient: one_hot(ids).T @ cotangent, a scatter-add)."""
    vocab, width = 32000, 512
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.standard_normal((vocab, width), np.float32))
    ids = jnp.asarray(rng.integers(0, vocab, (4, 128)), jnp.int32)

    def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
        return jax.nn.one_hot(ids, vocab) @ table

    if not train:
        return Workload("onehot", embed, (table, ids), (), "")
    step = jax.value_and_grad(lambda table, ids: jnp.mean(jnp.tanh(embed(table, ids)) ** 2))
    return Workload("onehot_train", step, (table, ids), (), "training step")


def _normal(*shape: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(0).standard_normal(shape, np.float32))


def _pool(kind: str) -> Workload:
    """docs/kernel-gaps.md's pools: max 3x3 stride 2 and sum 3x3 stride 1 over 2x112x112x64, padding 1."""
    init, fn, stride = (-jnp.inf, jax.lax.max, 2) if kind == "max" else (0.0, jax.lax.add, 1)
    pad = ((0, 0), (1, 1), (1, 1), (0, 0))
    return Workload(
        f"{kind}pool",
        lambda x: jax.lax.reduce_window(x, init, fn, (1, 3, 3, 1), (1, stride, stride, 1), pad),
        (_normal(2, 112, 112, 64),),
    )


def _grouped(size: int, channels: int) -> Workload:
    """docs/kernel-gaps.md's grouped convs: 3x3, 32 groups, 1 x size x size x channels."""
    dims = ("NHWC", "HWIO", "NHWC")
    return Workload(
        f"grouped{size}",
        lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dims, feature_group_count=32),
        (_normal(1, size, size, channels), _normal(3, 3, channels // 32, channels)),
    )


def _shifted_depthwise(x: jax.Array, w: jax.Array, pads: list[tuple[int, int]]) -> jax.Array:
    """The hand rewrite of a stride-1 depthwise conv (channels last, w [K..., 1, C]): a sum of shifted slices of
    the padded input times weight rows."""
    xp = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    out = x.shape[1:-1]
    return sum(
        xp[(slice(None), *(slice(k, k + n) for k, n in zip(offset, out, strict=True)))] * w[(*offset, 0)]
        for offset in np.ndindex(*w.shape[:-2])
    )


def _depthwise(rank: int) -> tuple[Workload, Callable[..., Any]]:
    """Issue 26's depthwise convs: width 4 causal over 2x1024x2560 (Mamba's temporal conv); 3x3x3 SAME over
    1x16x32x32x64 (video, volumetric CNNs)."""
    if rank == 1:
        x, w, pads, dims = _normal(2, 1024, 2560), _normal(4, 1, 2560), [(3, 0)], ("NWC", "WIO", "NWC")
    else:
        x, w, pads, dims = (
            _normal(1, 16, 32, 32, 64),
            _normal(3, 3, 3, 1, 64),
            [(1, 1)] * 3,
            ("NDHWC", "DHWIO", "NDHWC"),
        )

    def conv(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(
            x, w, (1,) * rank, pads, dimension_numbers=dims, feature_group_count=x.shape[-1]
        )

    return Workload(f"conv{rank}d", conv, (x, w), (), "depthwise"), lambda x, w: _shifted_depthwise(x, w, pads)


def _flax_model(name: str, module: Any, x: jax.Array) -> tuple[Workload, Callable[..., Any]]:
    """A flax model, and its hand rewrite: the same model with every depthwise nn.Conv (stride 1) computed as a
    shifted sum."""
    import flax.linen as nn

    params = module.init(jax.random.PRNGKey(0), x)

    def shifted(next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        conv = context.module
        if not isinstance(conv, nn.Conv) or context.method_name != "__call__" or conv.feature_group_count == 1:
            return next_fun(*args, **kwargs)
        kernel = conv.get_variable("params", "kernel")
        pads = (
            conv.padding if not isinstance(conv.padding, str) else [((k - 1) // 2, k // 2) for k in kernel.shape[:-2]]
        )
        y = _shifted_depthwise(args[0], kernel, list(pads))
        return y + conv.get_variable("params", "bias") if conv.use_bias else y

    def hand(params: Any, x: jax.Array) -> jax.Array:
        with nn.intercept_methods(shifted):
            return module.apply(params, x)

    return Workload(name, module.apply, (params, x), (), "flax"), hand


def _mamba_mixer() -> tuple[Workload, Callable[..., Any]]:
    """A Mamba-style mixer block in flax: in-projection to 2 x 512, a causal depthwise nn.Conv of width 4 on one half,
    SiLU, gated by SiLU of the other half, out-projection to 256; batch 2, length 1024."""
    import flax.linen as nn

    class Mixer(nn.Module):
        width: int = 256
        inner: int = 512

        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            h, gate = jnp.split(nn.Dense(2 * self.inner)(x), 2, axis=-1)
            h = nn.Conv(self.inner, (4,), padding=[(3, 0)], feature_group_count=self.inner)(h)
            return nn.Dense(self.width)(nn.silu(h) * nn.silu(gate))

    return _flax_model("mamba_mixer", Mixer(), _normal(2, 1024, 256))


def _volumetric_cnn() -> tuple[Workload, Callable[..., Any]]:
    """A small volumetric CNN in flax: a strided 3-D stem, two depthwise-separable 3-D blocks (3x3x3 depthwise,
    1x1x1 pointwise) each followed by a 2x2x2 max pool, a global average and a classifier; 1x16x64x64x4."""
    import flax.linen as nn

    class Volumetric(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            x = nn.relu(nn.Conv(32, (3, 3, 3), strides=(1, 2, 2), padding="SAME")(x))
            for channels in (32, 64):
                x = nn.relu(nn.Conv(x.shape[-1], (3, 3, 3), padding="SAME", feature_group_count=x.shape[-1])(x))
                x = nn.relu(nn.Conv(channels, (1, 1, 1))(x))
                x = nn.max_pool(x, (2, 2, 2), (2, 2, 2))
            return nn.Dense(10)(jnp.mean(x, axis=(1, 2, 3)))

    return _flax_model("volumetric_cnn", Volumetric(), _normal(1, 16, 64, 64, 4))


def _transposed_decoder() -> Workload:
    """Three stride-2 4x4 flax ConvTranspose layers with ReLU, 64 channels, 2x16x16 up to 2x128x128."""
    import flax.linen as nn

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            for _ in range(3):
                x = nn.relu(nn.ConvTranspose(64, (4, 4), strides=(2, 2), padding="SAME")(x))
            return x

    x = _normal(2, 16, 16, 64)
    return Workload("transposed_decoder", Decoder().apply, (Decoder().init(jax.random.PRNGKey(0), x), x), (), "flax")


def _bf16(*shape: int, scale: float = 1.0) -> jax.Array:
    return (_normal(*shape) * scale).astype(jnp.bfloat16)


def _rms_norm(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w


def _mlp(
    params: tuple[jax.Array, ...], x: jax.Array, gelu: Callable[[jax.Array], jax.Array] = jax.nn.gelu
) -> jax.Array:
    w1, b1, w2, b2 = params
    return gelu(x @ w1 + b1) @ w2 + b2


def _in_float32(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """fn computed in float32 on bfloat16 arguments, its result rounded to bfloat16 once: the hand rewrite."""
    return lambda *args: fn(*(a.astype(jnp.float32) for a in args)).astype(jnp.bfloat16)


def _low_precision(name: str, fn: Callable[..., Any], *shapes: tuple[int, ...]) -> Any:
    """A case of bfloat16 arguments of these shapes (drawn when it runs), with its rewrite by hand."""
    return lambda: (Workload(name, fn, tuple(_bf16(*shape) for shape in shapes)), _in_float32(fn))


def _mlp_block() -> tuple[Workload, Callable[..., Any]]:
    """Dense, gelu, dense: 2x128x2048 by 8192 and back, weights scaled to keep activations of order 1; by hand the
    dots stay bfloat16 and the gelu between them goes to float32."""
    params = (_bf16(2048, 8192, scale=1 / 45), _bf16(8192), _bf16(8192, 2048, scale=1 / 90), _bf16(2048))
    hand = functools.partial(_mlp, gelu=_in_float32(jax.nn.gelu))
    return Workload("mlp_bf16", _mlp, (params, _bf16(2, 128, 2048))), hand


# bfloat16 elementwise chains, computed in float32 and rounded once (issue 26 item 5)
LOW_PRECISION = {
    "gelu_bf16": _low_precision("gelu_bf16", jax.nn.gelu, (2, 128, 8192)),
    "rmsnorm_bf16": _low_precision("rmsnorm_bf16", _rms_norm, (2, 128, 2048), (2048,)),
    "softmax_bf16": _low_precision("softmax_bf16", lambda x: jax.nn.softmax(x, -1), (2, 128, 2048)),
    "mlp_bf16": _mlp_block,
}


def _keras_sparse_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True).mean()


# An LM loss over 4x512x32000 logits as models write it: the label's log-probability taken from log_softmax (flax
# and haiku examples), or summed against a one-hot row (optax.softmax_cross_entropy, keras' sparse categorical
# cross-entropy: `keras`); each with the exact rewrite by hand, logsumexp minus the label's logit
LOSSES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "xent": lambda x, y: -jnp.take_along_axis(jax.nn.log_softmax(x), y[..., None], -1).mean(),
    "xent_onehot": lambda x, y: -jnp.sum(jax.nn.one_hot(y, x.shape[-1]) * jax.nn.log_softmax(x), -1).mean(),
    "xent_keras": _keras_sparse_cross_entropy,
}


def _cross_entropy_by_hand(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """logsumexp(l) - l[y], and 0 where a label is out of range (as a one-hot row of zeros gives)."""
    picked = jnp.take_along_axis(logits, labels[..., None], -1, mode="fill", fill_value=0)[..., 0]
    in_range = (labels >= 0) & (labels < logits.shape[-1])
    return jnp.where(in_range, jax.nn.logsumexp(logits, -1) - picked, 0).mean()


def _cross_entropy(name: str, grad: bool) -> tuple[Workload, Callable[..., Any]]:
    """LOSSES[name] over 4x512x32000 float32 logits and int32 labels, its value or (with grad) value_and_grad with
    respect to the logits."""
    loss, hand = LOSSES[name], _cross_entropy_by_hand
    if grad:
        loss, hand = jax.value_and_grad(loss), jax.value_and_grad(hand)
    labels = jnp.asarray(np.random.default_rng(1).integers(0, 32000, (4, 512)), jnp.int32)
    return Workload(name + "_grad" * grad, loss, (_normal(4, 512, 32000), labels), (), "LM loss"), hand


# issue 26's cases: each with its hand rewrite, timed against jax.jit in the same run
WITH_HAND = {
    "conv1d": lambda: _depthwise(1),
    "conv3d": lambda: _depthwise(3),
    "mamba_mixer": _mamba_mixer,
    "volumetric_cnn": _volumetric_cnn,
    **LOW_PRECISION,
    **{
        name + "_grad" * grad: lambda name=name, grad=grad: _cross_entropy(name, grad)
        for name in LOSSES
        for grad in (False, True)
    },
}


def _transposed_gemv() -> Workload:
    """x @ W.T (a PyTorch-style layer), x 1x1024, W 4096x1024, the weight a declared parameter, prepared."""
    return Workload("transposed_gemv", lambda w, x: x @ w.T, (_normal(4096, 1024), _normal(1, 1024)), (0,))


# sum(x @ b for b in B) as people write it, 30 terms, x 512x256, B 30x256x256 (issue 26 item 6)
SUMS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "sum30_python": lambda x, bs: sum(x @ b for b in bs),  # Python's sum starts from the integer 0
    "sum30_reduce": lambda x, bs: functools.reduce(operator.add, [x @ b for b in bs]),
    "sum30_stack": lambda x, bs: jnp.sum(jnp.stack([x @ b for b in bs]), 0),
}


def _narrow_ulps(work: Workload, fast: Callable[..., Any]) -> dict[str, list[float]] | None:
    """For bfloat16 or float16 results: each element's distance, in units of the narrow type's last place there,
    from two float32 references, as [largest, share within two] for eqsat's results and for jax.jit's: "inputs",
    the function evaluated on float32 inputs (its Python constants float32 too), and "program", the captured
    program evaluated in float32 (eqsat/numerics/widening.py: its constants as the narrow type holds them, which is all
    a plan can know of them)."""
    out = jax.tree.leaves(fast(*work.args))
    if not all(a.dtype in (jnp.bfloat16, jnp.float16) for a in out):
        return None
    flat = jax.tree.leaves(work.args)
    wide = [a.astype(jnp.float32) if a.dtype in (jnp.bfloat16, jnp.float16) else a for a in flat]
    fn = jax.jit(lambda *leaves: jax.tree.leaves(work.fn(*jax.tree.unflatten(jax.tree.structure(work.args), leaves))))
    references = {"inputs": fn(*wide), "program": widened(fn, flat, np.dtype(np.float32))}
    results = {"eqsat": out, "jit": fn(*flat)}
    found = {}
    for name, reference in references.items():
        for who, values in results.items():
            every = np.concatenate([ulps(v, r, v.dtype).ravel() for v, r in zip(values, reference, strict=True)])
            found[f"{name}_{who}"] = [float(every.max()), float(np.mean(every <= 2))]
    return found


SMALL = {  # docs/kernel-gaps.md's single ops
    "maxpool": lambda: _pool("max"),
    "sumpool": lambda: _pool("sum"),
    "grouped56": lambda: _grouped(56, 128),
    "grouped7": lambda: _grouped(7, 1024),
    "tinybatch": lambda: Workload(
        "tinybatch", lambda a, b: jnp.einsum("nij,njk->nik", a, b), (_normal(4096, 4, 4), _normal(4096, 4, 4))
    ),
    "transposed_gemv": _transposed_gemv,
    "argmax": lambda: Workload("argmax", lambda x: jnp.argmax(x, axis=-1), (_normal(64, 32000),)),
    "transposed_decoder": _transposed_decoder,
    "cumsum": lambda: Workload("cumsum", lambda x: jnp.cumsum(x, axis=1), (_normal(8, 1024, 256),)),
    # exact gelu (keras' default) over a ConvNeXt stage's activations, tails to x = -12 (issue 42 finding 3)
    "gelu_exact": lambda: Workload(
        "gelu_exact", functools.partial(jax.nn.gelu, approximate=False), (_normal(2, 56, 56, 384) * 3,)
    ),
    **{
        name: lambda name=name: Workload(name, SUMS[name], (_normal(512, 256), _normal(30, 256, 256) / 16))
        for name in SUMS
    },
}


def _train_step(app: str) -> Workload:
    """value_and_grad of a cross-entropy at fixed labels: forward, input-gradient and weight-gradient convs."""
    model = keras_app(app, app, batch=2)
    labels = jnp.asarray([3, 7])

    def loss(params: Any, x: jax.Array) -> jax.Array:
        y = model.fn(params, x)
        return -jnp.mean(jnp.log(y[jnp.arange(2), labels] + 1e-9))

    return Workload(f"{app.lower()}_train", jax.value_and_grad(loss), model.args, (), f"{model.note}, training step")


def workload(name: str) -> Workload:
    if name in WITH_HAND:
        return WITH_HAND[name]()[0]
    if name in ("onehot", "onehot_train"):
        return _one_hot(train=name == "onehot_train")
    if name in SMALL:
        return SMALL[name]()
    if name == "mobilenetv2_train":
        return _train_step("MobileNetV2")
    if name == "nasnet_a":
        return nasnet_a.build("full")
    return keras_app(name, name, batch=2)


CASES = ("onehot", "onehot_train", "nasnet_a", *KERAS, "mobilenetv2_train")  # what a run without --only measures


def _first_call(fn: Callable[..., Any], args: tuple) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def measure(name: str, seconds: float) -> dict[str, Any]:
    work, hand = WITH_HAND[name]() if name in WITH_HAND else (workload(name), None)
    baseline = jax.jit(work.fn)
    jit_first = _first_call(baseline, work.args)
    fast = eqsat.optimize(work.fn)
    cold = _first_call(fast, work.args)
    plan = fast.plan(*work.args)  # the cold plan: what was measured for it
    fast.clear_cache()  # optimize() of one function shares its plans: forget them, keep the timing cache
    fast = eqsat.optimize(work.fn)
    warm = _first_call(fast, work.args)
    fast.plan(*work.args)  # the plan the first call may have left to the background: what the rest measures
    decided = settled(fast, work.args)  # the guard's decision, live calls included: what the timing runs
    diff = max(  # relative to the output's largest magnitude
        float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(a)), 1e-30))
        for a, b in zip(jax.tree.leaves(baseline(*work.args)), jax.tree.leaves(fast(*work.args)), strict=True)
    )
    # a workload with parameters is timed as `prepare` runs it (the first calls above are plain ones)
    if work.params_argnums:
        timing = against_jit(work, seconds=seconds)[0]
    else:
        timing = interleaved(baseline, fast, work.args, seconds)
    by_hand = None if hand is None else interleaved(baseline, jax.jit(hand), work.args, seconds).ratio
    return {
        "case": name,
        "ratio": timing.ratio,
        "iqr": [timing.ratio_low, timing.ratio_high],
        "jit_ms": timing.baseline_s * 1e3,
        "eqsat_ms": timing.candidate_s * 1e3,
        "jit_first_s": jit_first,
        "eqsat_first_cold_s": cold,
        "eqsat_first_warm_s": warm,
        "measured_kernels": int(plan.stats.get("timing_measured", 0)),
        "measure_s": plan.stats.get("measure_s", 0.0),
        "rewritten": plan.rewritten_ops(),
        "max_rel_diff": diff,
        "fallback": decided.fallback,
        "bar": BARS.get(name),
        "hand_ratio": by_hand,
        "narrow_ulps": _narrow_ulps(work, fast),
    }


def _bar(row: dict[str, Any]) -> str:
    """The bar, and where a hand rewrite was timed beside it its ratio and eqsat's share of it (bar: HAND_SHARE)."""
    bar = f"{row['bar']}x" if row["bar"] else "-"
    hand = row.get("hand_ratio")
    if hand is None:
        return bar
    return f"{bar}; by hand {hand:.1f}x, eqsat {row['ratio'] / hand:.2f} of it (bar {HAND_SHARE:.2f})"


def _ulps_text(row: dict[str, Any]) -> str:
    found = row.get("narrow_ulps")
    if not found:
        return ""
    parts = [
        f"{what}: eqsat max {found[f'{key}_eqsat'][0]:.1f} ulp, {100 * found[f'{key}_eqsat'][1]:.2f} % within 2 "
        f"(jax.jit {found[f'{key}_jit'][0]:.1f}, {100 * found[f'{key}_jit'][1]:.2f} %)"
        for key, what in (("program", "the program in float32"), ("inputs", "float32 inputs"))
    ]
    return "; " + "; ".join(parts)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | jax.jit | eqsat | ratio (IQR) | bar | first call: jax.jit / eqsat cold / warm | kernels measured |"
        " max difference / max value |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['jit_ms']:.1f} ms | {r['eqsat_ms']:.1f} ms | {r['ratio']:.2f}x "
            f"({r['iqr'][0]:.2f}-{r['iqr'][1]:.2f}) | {_bar(r)} | {r['jit_first_s']:.1f} / "
            f"{r['eqsat_first_cold_s']:.1f} / {r['eqsat_first_warm_s']:.1f} s | {r['measured_kernels']} in "
            f"{r['measure_s']:.1f} s | {r['max_rel_diff']:.1e}{_ulps_text(r)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated subset of " + ",".join((*CASES, *SMALL, *WITH_HAND)))
    parser.add_argument("--seconds", type=float, default=6.0, help="interleaved timing budget per case")
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument("--markdown", help="write the rows as a markdown table here")
    args = parser.parse_args(argv)
    # an empty timing cache, so the first call pays for measuring as a new user's would
    os.environ.setdefault("EQSAT_CACHE_DIR", tempfile.mkdtemp(prefix="eqsat-bench-cache-"))
    rows = []
    for name in args.only.split(",") if args.only else CASES:
        row = measure(name, args.seconds)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(markdown(rows) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
