"""Shared building blocks for the benchmark models.

Everything here is plain ``jax.numpy`` / ``jax.lax`` (no ``jax.nn``, no
``jnp.where``) so traced jaxprs stay flat: no ``custom_jvp_call`` or nested
``jit`` equations. Images are NHWC, conv kernels HWIO, batch norm is in
inference form (a per-channel ``x * scale + shift``).
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Params = dict[str, Any]
Padding = str | int | tuple[int, int]

CONV_DIMS = ("NHWC", "HWIO", "NHWC")


def pick_config[C](configs: Mapping[str, C], scale: str) -> C:
    """The configuration for ``scale`` ("full" or "small")."""
    if scale not in configs:
        raise ValueError(f"unknown scale {scale!r}; expected one of {sorted(configs)}")
    return configs[scale]


class Draw(jax.ShapeDtypeStruct):
    """A float32 parameter still to be drawn: ``mean + std * normal(shape)``."""

    def __init__(self, shape: Sequence[int], std: float, mean: float) -> None:
        super().__init__(tuple(shape), jnp.float32)
        self.std, self.mean = std, mean


class ParamGen:
    """Deterministic random parameters.

    ``normal`` and the layer helpers return :class:`Draw` placeholders (usable
    wherever a ``ShapeDtypeStruct`` is, e.g. ``jax.eval_shape``); ``materialize``
    then fills a whole pytree from a single ``jax.random.normal`` call, which is
    far quicker than one compiled draw per distinct shape.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def normal(self, shape: Sequence[int], std: float = 1.0, mean: float = 0.0) -> Any:
        return Draw(shape, std, mean)

    def materialize[T](self, tree: T) -> T:
        """Replace every :class:`Draw` in ``tree`` by a float32 array."""
        leaves, treedef = jax.tree.flatten(tree)
        sizes = [math.prod(leaf.shape) if isinstance(leaf, Draw) else 0 for leaf in leaves]
        flat = np.asarray(jax.random.normal(jax.random.key(self.seed), (sum(sizes),), jnp.float32))
        out, offset = [], 0
        for leaf, size in zip(leaves, sizes, strict=True):
            if isinstance(leaf, Draw):
                chunk = flat[offset : offset + size].reshape(leaf.shape)
                leaf = jnp.asarray(leaf.mean + leaf.std * chunk, jnp.float32)
                offset += size
            out.append(leaf)
        return jax.tree.unflatten(treedef, out)

    def dense(self, d_in: int, d_out: int, bias: bool = True) -> Params:
        """A ``d_in -> d_out`` linear layer (LeCun-normal weight, small bias)."""
        p = {"w": self.normal((d_in, d_out), d_in**-0.5)}
        if bias:
            p["b"] = self.normal((d_out,), 0.01)
        return p

    def conv(self, kernel: int | tuple[int, int], c_in: int, c_out: int, groups: int = 1, bias: bool = False) -> Params:
        """An HWIO conv kernel (He-normal) and optionally a bias."""
        kh, kw = _pair(kernel)
        fan_in = kh * kw * (c_in // groups)
        p = {"w": self.normal((kh, kw, c_in // groups, c_out), (2.0 / fan_in) ** 0.5)}
        if bias:
            p["b"] = self.normal((c_out,), 0.01)
        return p

    def batch_norm(self, channels: int) -> Params:
        """Inference-form batch norm: folded ``scale`` and ``shift`` per channel."""
        return {"scale": self.normal((channels,), 0.1, 1.0), "shift": self.normal((channels,), 0.1)}

    def conv_bn(self, kernel: int | tuple[int, int], c_in: int, c_out: int, groups: int = 1) -> Params:
        """A bias-free conv followed by batch norm."""
        return {"conv": self.conv(kernel, c_in, c_out, groups), "bn": self.batch_norm(c_out)}

    def norm(self, dim: int, bias: bool = True) -> Params:
        """Layer-norm (``bias=True``) or RMS-norm (``bias=False``) parameters."""
        p = {"g": self.normal((dim,), 0.1, 1.0)}
        if bias:
            p["b"] = self.normal((dim,), 0.1)
        return p


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (v[0], v[1])


def _padding(padding: Padding) -> str | list[tuple[int, int]]:
    if isinstance(padding, str):
        return padding
    ph, pw = _pair(padding)
    return [(ph, ph), (pw, pw)]


# ---------------------------------------------------------------- elementwise


def relu(x: jax.Array) -> jax.Array:
    return jnp.maximum(x, 0.0)


def sigmoid(x: jax.Array) -> jax.Array:
    return lax.logistic(x)


def silu(x: jax.Array) -> jax.Array:
    return x * lax.logistic(x)


def gelu(x: jax.Array) -> jax.Array:
    """GELU, tanh approximation (as in the original BERT code)."""
    return 0.5 * x * (1.0 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    e = jnp.exp(x - jnp.max(x, axis=axis, keepdims=True))
    return e / jnp.sum(e, axis=axis, keepdims=True)


def log_softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    s = x - jnp.max(x, axis=axis, keepdims=True)
    return s - jnp.log(jnp.sum(jnp.exp(s), axis=axis, keepdims=True))


# ---------------------------------------------------------------- convolution


def conv2d(x: jax.Array, w: jax.Array, stride: int = 1, padding: Padding = "SAME", groups: int = 1) -> jax.Array:
    """NHWC x HWIO convolution; ``padding`` is "SAME"/"VALID", an int, or (ph, pw)."""
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=(stride, stride),
        padding=_padding(padding),
        dimension_numbers=CONV_DIMS,
        feature_group_count=groups,
    )


def batch_norm(x: jax.Array, p: Params) -> jax.Array:
    return x * p["scale"] + p["shift"]


def conv_bn(
    x: jax.Array, p: Params, stride: int = 1, padding: Padding = "SAME", groups: int = 1, act: bool = True
) -> jax.Array:
    """Conv -> batch norm -> (ReLU)."""
    y = batch_norm(conv2d(x, p["conv"]["w"], stride, padding, groups), p["bn"])
    return relu(y) if act else y


def conv_bias(x: jax.Array, p: Params, stride: int = 1, padding: Padding = "SAME", act: bool = True) -> jax.Array:
    """Conv + bias -> (ReLU), for models without batch norm (VGG, SqueezeNet)."""
    y = conv2d(x, p["w"], stride, padding) + p["b"]
    return relu(y) if act else y


def max_pool(x: jax.Array, kernel: int, stride: int, padding: Padding = "VALID") -> jax.Array:
    pad = _padding(padding)
    pad = pad if isinstance(pad, str) else [(0, 0), *pad, (0, 0)]
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, kernel, kernel, 1), (1, stride, stride, 1), pad)


def avg_pool(x: jax.Array, kernel: int, stride: int, padding: Padding = "VALID") -> jax.Array:
    """Average pool counting padded zeros (PyTorch's ``count_include_pad=True``)."""
    pad = _padding(padding)
    pad = pad if isinstance(pad, str) else [(0, 0), *pad, (0, 0)]
    s = lax.reduce_window(x, 0.0, lax.add, (1, kernel, kernel, 1), (1, stride, stride, 1), pad)
    return s / float(kernel * kernel)


def global_avg_pool(x: jax.Array) -> jax.Array:
    return jnp.mean(x, axis=(1, 2))


def concat_channels(xs: Sequence[jax.Array]) -> jax.Array:
    return jnp.concatenate(xs, axis=-1)


# ---------------------------------------------------------------- dense / norms


def dense(x: jax.Array, p: Params) -> jax.Array:
    y = x @ p["w"]
    return y + p["b"] if "b" in p else y


def layer_norm(x: jax.Array, p: Params, eps: float = 1e-12) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    c = x - mean
    var = jnp.mean(c * c, axis=-1, keepdims=True)
    return c * lax.rsqrt(var + eps) * p["g"] + p["b"]


def rms_norm(x: jax.Array, p: Params, eps: float = 1e-6) -> jax.Array:
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * lax.rsqrt(ms + eps) * p["g"]


# ---------------------------------------------------------------- attention


def causal_bias(seq: int) -> np.ndarray:
    """Additive causal mask: 0 on and below the diagonal, -1e9 above."""
    return np.triu(np.full((seq, seq), -1e9, np.float32), k=1)


def rope_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables of shape (seq, 1, head_dim // 2) for rotary embeddings."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    ang = np.arange(seq, dtype=np.float32)[:, None] * inv[None, :]
    return np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]


def apply_rope(x: jax.Array, cos: np.ndarray, sin: np.ndarray) -> jax.Array:
    """Rotary embedding (rotate-half form) on x of shape (..., seq, heads, head_dim)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, bias: np.ndarray | None = None) -> jax.Array:
    """Softmax attention on (..., seq, heads, d); k/v may have fewer heads (GQA, repeated)."""
    rep = q.shape[-2] // k.shape[-2]
    if rep > 1:
        k = jnp.repeat(k, rep, axis=-2)
        v = jnp.repeat(v, rep, axis=-2)
    q, k, v = (jnp.swapaxes(t, -3, -2) for t in (q, k, v))  # (..., heads, seq, d)
    scores = (q @ jnp.swapaxes(k, -1, -2)) * (q.shape[-1] ** -0.5)
    if bias is not None:
        scores = scores + bias
    out = softmax(scores) @ v
    return jnp.swapaxes(out, -3, -2)


def split_heads(x: jax.Array, heads: int) -> jax.Array:
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads)


def merge_heads(x: jax.Array) -> jax.Array:
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def init_mha(gen: ParamGen, dim: int, heads: int, kv_heads: int | None = None, bias: bool = True) -> Params:
    """Separate Q, K, V and output projections."""
    kv_dim = dim // heads * (kv_heads or heads)
    return {
        "q": gen.dense(dim, dim, bias),
        "k": gen.dense(dim, kv_dim, bias),
        "v": gen.dense(dim, kv_dim, bias),
        "o": gen.dense(dim, dim, bias),
    }


def mha(
    x: jax.Array,
    p: Params,
    heads: int,
    kv_heads: int | None = None,
    bias: np.ndarray | None = None,
    rope: tuple[np.ndarray, np.ndarray] | None = None,
) -> jax.Array:
    """Multi-head (or grouped-query) self-attention with separate Q/K/V dots from ``x``; each projection in a named
    scope of its own (as a flax module's would be), so plans name them."""
    with jax.named_scope("q"):
        q = split_heads(dense(x, p["q"]), heads)
    with jax.named_scope("k"):
        k = split_heads(dense(x, p["k"]), kv_heads or heads)
    with jax.named_scope("v"):
        v = split_heads(dense(x, p["v"]), kv_heads or heads)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    out = merge_heads(attention(q, k, v, bias))
    with jax.named_scope("o"):
        return dense(out, p["o"])
