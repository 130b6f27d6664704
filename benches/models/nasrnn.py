"""NasRNN cell unrolled over a sequence, as benchmarked by TASO and Tensat.

Structure from TASO ``examples/nasrnn.py`` / Tensat ``src/nasrnn.rs``: hidden
512, 5 steps, batch 1; each step forms 8 sums ``x @ W_i + h @ U_i`` (16 GEMVs)
and combines them with relu/sigmoid/tanh and adds/muls into the new state. The
initial state is a weight, as in TASO. Deviation: W_i/U_i are shared across
steps (a real RNN), where TASO draws fresh weights for every step.
"""

import jax
import jax.numpy as jnp

from benches.models import layers as L
from eqsat.support.workload import Workload

CONFIGS = {
    "full": {"hidden": 512, "steps": 5},
    "small": {"hidden": 16, "steps": 2},
}


def nas_cell(p: L.Params, h: jax.Array, x: jax.Array) -> jax.Array:
    t = [x @ w + h @ u for w, u in zip(p["w"], p["u"], strict=True)]
    tanh, sig = jnp.tanh, L.sigmoid
    m0 = L.relu(t[0]) + sig(t[3])
    m1 = sig(t[1]) + tanh(t[2])
    m2 = sig(t[4]) * tanh(t[5])
    m3 = sig(t[6]) * L.relu(t[7])
    m4 = sig(m1) + tanh(m2)
    m5 = tanh(m0) * tanh(m3)
    m6 = tanh(m4) * tanh(m5)
    return tanh(m6)


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    n = c["hidden"]
    params = {
        "w": [gen.normal((n, n), n**-0.5) for _ in range(8)],
        "u": [gen.normal((n, n), n**-0.5) for _ in range(8)],
        "h0": gen.normal((1, n)),
    }
    xs = gen.normal((c["steps"], 1, n))

    def fn(params: L.Params, xs: jax.Array) -> jax.Array:
        h = params["h0"]
        for t in range(xs.shape[0]):
            h = nas_cell(params, h, xs[t])
        return h

    return Workload(f"nasrnn-{scale}", fn, gen.materialize((params, xs)), (0,), "weights shared across steps")
