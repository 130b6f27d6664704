"""A token embedding and transformer block with data and tensor parallelism on an 8-device CPU mesh (2 data x 4
model), optimized and against jax.jit: output sharding, the collectives of both compiled programs, and the
measured ratio.

    python -m benches.sharded [--seconds 4]

The device count is set before jax starts, so this runs as its own process. Eight host devices share this
machine's cores: the ratio says whether the optimized program is slower, not what a real mesh would gain.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import argparse
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import eqsat
from eqsat.numerics.measure import interleaved
from eqsat.plans.sharding import collectives

BATCH, SEQ, WIDTH, HEADS, HIDDEN, VOCAB = 8, 128, 256, 8, 1024, 8192


def _layernorm(x: Any) -> Any:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(jnp.mean((x - mean) ** 2, axis=-1, keepdims=True) + 1e-5)


def block(p: dict[str, Any], tokens: Any) -> Any:
    """A one-hot embedding (the matmul form TPU codebases such as flaxformer use), then pre-norm attention and
    MLP; Q/K/V and the MLP's first layer split by columns over `model`, the output projections by rows (Megatron's
    split), the embedding table replicated, the batch over `data`."""
    x = jax.nn.one_hot(tokens, VOCAB, dtype=jnp.float32) @ p["embed"]
    b, s, d = x.shape
    h = _layernorm(x)
    q, k, v = ((h @ p[w]).reshape(b, s, HEADS, d // HEADS) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // HEADS)
    attention = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, d)
    x = x + attention @ p["wo"]
    return x + jax.nn.gelu(_layernorm(x) @ p["w1"] + p["b1"]) @ p["w2"]


def sharded_inputs() -> tuple[dict[str, Any], Any]:
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)

    def put(shape: tuple[int, ...], spec: P) -> Any:
        value = jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[0]), jnp.float32)
        return jax.device_put(value, NamedSharding(mesh, spec))

    columns, rows = P(None, "model"), P("model", None)
    params = {w: put((WIDTH, WIDTH), columns) for w in ("wq", "wk", "wv")}
    params.update(
        wo=put((WIDTH, WIDTH), rows),
        w1=put((WIDTH, HIDDEN), columns),
        b1=put((HIDDEN,), P("model")),
        w2=put((HIDDEN, WIDTH), rows),
        embed=put((VOCAB, WIDTH), P(None, None)),
    )
    tokens = jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ)), jnp.int32)
    return params, jax.device_put(tokens, NamedSharding(mesh, P("data", None)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.sharded", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="timing budget per row")
    args = parser.parse_args(argv)
    params, x = sharded_inputs()
    reference = jax.jit(block)
    want = reference(params, x)
    print(f"{jax.device_count()} devices, mesh 2 data x 4 model; jax.jit's output sharding {want.sharding.spec}")
    for target, prepared in (("cpu", False), ("cpu", True), ("h100", True)):
        fast = eqsat.optimize(block, target=target, params_argnums=(0,) if prepared else ())
        call = fast.prepare(params) if prepared else functools.partial(fast, params)
        got = call(x)
        plan = fast.plan(params, x)
        if prepared:  # the weights are bound: both programs close over them, as constants of the outer jit
            mine, theirs = (
                collectives(jax.jit(f).lower(x).compile().as_text()) for f in (call, functools.partial(block, params))
            )
        else:
            mine, theirs = (collectives(f.lower(params, x).compile().as_text()) for f in (fast, reference))
        error = float(np.max(np.abs(np.asarray(got) - np.asarray(want))))
        timing = interleaved(lambda x: reference(params, x), call, (x,), seconds=args.seconds)
        print(
            f"target {target}{', prepared' if prepared else ''}: output {got.sharding.spec}, collectives "
            f"{dict(mine)} (jax.jit {dict(theirs)}), max error {error:.2g}, rewritten {plan.rewritten_ops()}, "
            f"fallback {plan.fallback}\n  {timing}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
