"""A modern (Llama-style) pre-norm transformer decoder, 2 blocks.

Each block: RMSNorm -> grouped-query causal self-attention with rotary position
embeddings (separate Q/K/V dots, no biases) -> residual; RMSNorm -> SwiGLU MLP
(``down(silu(gate(x)) * up(x))``) -> residual. Full scale: seq 128, hidden 1024,
16 query heads sharing 4 KV heads (head dim 64), MLP width 2816. Not a TASO or
Tensat model; added as a contemporary workload.
"""

import jax

from benches.models import layers as L
from eqsat.support.workload import Workload

CONFIGS = {
    "full": {"seq": 128, "dim": 1024, "heads": 16, "kv_heads": 4, "mlp": 2816, "blocks": 2},
    "small": {"seq": 8, "dim": 32, "heads": 4, "kv_heads": 2, "mlp": 64, "blocks": 1},
}


def swiglu(x: jax.Array, p: L.Params) -> jax.Array:
    return L.dense(L.silu(L.dense(x, p["gate"])) * L.dense(x, p["up"]), p["down"])


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    d, m = c["dim"], c["mlp"]
    params = {
        "blocks": [
            {
                "attn_norm": gen.norm(d, bias=False),
                "attn": L.init_mha(gen, d, c["heads"], c["kv_heads"], bias=False),
                "mlp_norm": gen.norm(d, bias=False),
                "mlp": {
                    "gate": gen.dense(d, m, bias=False),
                    "up": gen.dense(d, m, bias=False),
                    "down": gen.dense(m, d, bias=False),
                },
            }
            for _ in range(c["blocks"])
        ]
    }
    x = gen.normal((c["seq"], d))
    mask = L.causal_bias(c["seq"])
    rope = L.rope_tables(c["seq"], d // c["heads"])

    def fn(params: L.Params, x: jax.Array) -> jax.Array:
        for p in params["blocks"]:
            h = L.rms_norm(x, p["attn_norm"])
            x = x + L.mha(h, p["attn"], c["heads"], c["kv_heads"], mask, rope)
            x = x + swiglu(L.rms_norm(x, p["mlp_norm"]), p["mlp"])
        return x

    return Workload(f"decoder_block-{scale}", fn, gen.materialize((params, x)), (0,), "RMSNorm/RoPE/GQA/SwiGLU")
