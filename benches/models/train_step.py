"""One training step of a small GPT-style language model: loss and gradients.

``fn(params, tokens)`` returns ``(loss, grads)`` from ``jax.value_and_grad`` of
the mean next-token cross-entropy. The model: token + learned position
embeddings, 4 pre-LN layers (causal multi-head attention, 4 heads; GELU FFN of
width 4x), final LayerNorm and an untied vocabulary projection. Full scale:
hidden 256, seq 64, vocab 1000, batch 8; ``tokens`` has shape (batch, seq + 1).
Not a TASO or Tensat model; added as a workload with a backward pass.
"""

import jax
import jax.numpy as jnp

from benches.models import layers as L
from eqsat.support.workload import Workload

CONFIGS = {
    "full": {"vocab": 1000, "dim": 256, "seq": 64, "layers": 4, "heads": 4, "batch": 8},
    "small": {"vocab": 50, "dim": 32, "seq": 8, "layers": 1, "heads": 2, "batch": 2},
}


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    d, v = c["dim"], c["vocab"]
    params = {
        "embed": gen.normal((v, d), 0.02),
        "pos": gen.normal((c["seq"], d), 0.02),
        "layers": [
            {
                "ln1": gen.norm(d),
                "attn": L.init_mha(gen, d, c["heads"]),
                "ln2": gen.norm(d),
                "ffn_in": gen.dense(d, 4 * d),
                "ffn_out": gen.dense(4 * d, d),
            }
            for _ in range(c["layers"])
        ],
        "ln_f": gen.norm(d),
        "head": gen.dense(d, v, bias=False),
    }
    tokens = jax.random.randint(jax.random.key(1), (c["batch"], c["seq"] + 1), 0, v, jnp.int32)
    mask = L.causal_bias(c["seq"])

    def loss_fn(params: L.Params, tokens: jax.Array) -> jax.Array:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = params["embed"][inputs] + params["pos"]
        for p in params["layers"]:
            x = x + L.mha(L.layer_norm(x, p["ln1"], 1e-5), p["attn"], c["heads"], bias=mask)
            h = L.gelu(L.dense(L.layer_norm(x, p["ln2"], 1e-5), p["ffn_in"]))
            x = x + L.dense(h, p["ffn_out"])
        logits = L.dense(L.layer_norm(x, params["ln_f"], 1e-5), params["head"])
        onehot = (targets[..., None] == jnp.arange(v)).astype(logits.dtype)
        return -jnp.sum(onehot * L.log_softmax(logits)) / targets.size

    fn = jax.value_and_grad(loss_fn)
    return Workload(f"train_step-{scale}", fn, (gen.materialize(params), tokens), (0,), "returns (loss, grads)")
