"""Small workloads with a known win (docs/kernel-gaps.md, the issues' acceptance cases): what the demo and the
acceptance script run; they ship with the package so that the installed demo runs without the repository.
nasrnn_cell, inception_siblings and conv_bn ignore `scale`: their shapes are the published ones."""

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from eqsat.support.workload import Workload


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def matmul_chain(scale: str = "full") -> Workload:
    """(A @ B) @ v: XLA keeps the order; re-associated it is two matrix-vector products."""
    n, m = (1024, 8) if scale == "full" else (64, 4)
    ka, kb, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    args = (jax.random.normal(ka, (n, n)), jax.random.normal(kb, (n, n)), jax.random.normal(kv, (n, m)))
    return Workload("matmul_chain", lambda a, b, v: (a @ b) @ v, args, note=f"A, B {n}x{n}, v {n}x{m}")


def distributivity(scale: str = "full") -> Workload:
    """x @ W1 + x @ W2: XLA will not factor it; x @ (W1 + W2) is one GEMM."""
    rows, k = (4096, 512) if scale == "full" else (64, 32)
    kx, k1, k2 = jax.random.split(jax.random.PRNGKey(1), 3)
    args = (jax.random.normal(kx, (rows, k)), jax.random.normal(k1, (k, k)), jax.random.normal(k2, (k, k)))
    return Workload("distributivity", lambda x, w1, w2: x @ w1 + x @ w2, args, note=f"x {rows}x{k}, W {k}x{k}")


def nasrnn_cell(scale: str = "full") -> Workload:
    """One NasRNN cell (hidden 512, batch 1): eight gates, each x @ W_i + h @ U_i."""
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "W": jax.random.normal(keys[0], (8, 512, 512)) * 0.04,
        "U": jax.random.normal(keys[1], (8, 512, 512)) * 0.04,
    }
    x, h = jax.random.normal(keys[2], (1, 512)), jax.random.normal(keys[3], (1, 512))

    def cell(p: Any, x: jax.Array, h: jax.Array) -> jax.Array:
        gates = [x @ p["W"][i] + h @ p["U"][i] for i in range(8)]
        mixed = [jax.nn.sigmoid(gates[0]) * jnp.tanh(gates[1]), jax.nn.relu(gates[2]) * jax.nn.sigmoid(gates[3])]
        mixed += [jnp.tanh(gates[4]) + jax.nn.sigmoid(gates[5]), jax.nn.relu(gates[6]) * jnp.tanh(gates[7])]
        return jnp.tanh(mixed[0] * mixed[1] + mixed[2] * mixed[3])

    return Workload("nasrnn_cell", cell, (params, x, h), (0,), "NasRNN cell, hidden 512, 8 gates x @ W_i + h @ U_i")


def inception_siblings(scale: str = "full") -> Workload:
    """Four sibling 1x1 convs of one input (Inception-v3's 35x35 stage) feeding a concat."""
    keys = jax.random.split(jax.random.PRNGKey(1), 5)
    params = {f"w{i}": jax.random.normal(keys[i], (1, 1, 192, c)) * 0.05 for i, c in enumerate((64, 48, 64, 32))}
    x = jax.random.normal(keys[4], (1, 35, 35, 192))

    def siblings(p: Any, x: jax.Array) -> jax.Array:
        return jnp.concatenate([_conv(x, p[f"w{i}"]) for i in range(4)], axis=-1)

    return Workload("inception_siblings", siblings, (params, x), (0,), "four sibling 1x1 convs, 35x35x192, concat")


def conv_bn(scale: str = "full") -> Workload:
    """A conv + BatchNorm (inference) + relu block, 56x56x64 -> 64."""
    keys = jax.random.split(jax.random.PRNGKey(2), 4)
    params = {
        "conv": {"w": jax.random.normal(keys[0], (3, 3, 64, 64)) * 0.05},
        "bn": {"scale": jax.random.normal(keys[1], (64,)), "shift": jax.random.normal(keys[2], (64,))},
    }
    x = jax.random.normal(keys[3], (1, 56, 56, 64))
    note = "conv 3x3 56x56x64 + BatchNorm (inference) + relu"

    def block(p: Any, x: jax.Array) -> jax.Array:
        return jax.nn.relu(_conv(x, p["conv"]["w"]) * p["bn"]["scale"] + p["bn"]["shift"])

    return Workload("conv_bn_relu", block, (params, x), (0,), note)


EXAMPLES = {
    "matmul_chain": matmul_chain,
    "distributivity": distributivity,
    "nasrnn_cell": nasrnn_cell,
    "inception_siblings": inception_siblings,
    "conv_bn": conv_bn,
}
