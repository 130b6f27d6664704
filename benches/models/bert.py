"""BERT-Large-style encoder as benchmarked by TASO and Tensat.

Shapes follow TASO ``examples/bert.py`` / Tensat ``src/bert.rs``: a (64, 1024)
input, 16 heads, 8 layers, with Q, K and V as three separate dots of the same
input. Unlike those graphs (which drop softmax, normalisation and the FFN) each
layer here is a full post-LN BERT layer: softmax attention, output projection,
residual + LayerNorm, a 4096-wide GELU FFN, residual + LayerNorm.
"""

import jax

from benches.models import layers as L
from eqsat.support.workload import Workload

CONFIGS = {
    "full": {"seq": 64, "dim": 1024, "heads": 16, "layers": 8, "ffn": 4096},
    "small": {"seq": 8, "dim": 32, "heads": 4, "layers": 2, "ffn": 64},
}


def encoder_layer(x: jax.Array, p: L.Params, heads: int) -> jax.Array:
    # named scopes, as a flax or haiku model has them: plans and reports name each layer's parts
    with jax.named_scope("attention"):
        x = L.layer_norm(x + L.mha(x, p["attn"], heads), p["ln1"])
    with jax.named_scope("ffn"):
        h = L.dense(L.gelu(L.dense(x, p["ffn_in"])), p["ffn_out"])
        return L.layer_norm(x + h, p["ln2"])


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    d, f = c["dim"], c["ffn"]
    params = {
        "layers": [
            {
                "attn": L.init_mha(gen, d, c["heads"]),
                "ln1": gen.norm(d),
                "ffn_in": gen.dense(d, f),
                "ffn_out": gen.dense(f, d),
                "ln2": gen.norm(d),
            }
            for _ in range(c["layers"])
        ]
    }
    x = gen.normal((c["seq"], d))

    def fn(params: L.Params, x: jax.Array) -> jax.Array:
        for i, p in enumerate(params["layers"]):
            with jax.named_scope(f"encoder/layer_{i}"):
                x = encoder_layer(x, p, c["heads"])
        return x

    return Workload(f"bert-{scale}", fn, gen.materialize((params, x)), (0,), "post-LN BERT encoder")
