"""Sharded programs on an 8-device CPU mesh, optimized and compared with jax.jit; run as a subprocess by
tests/test_sharding.py (the device count must be set before jax starts, and the rest of the suite runs on one).

Prints one JSON object: per case, both programs' output shardings and collectives, the largest difference of
their results, and what the plan did."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["EQSAT_GUARD_SECONDS"] = "0"  # what is checked here is sharding, not speed

import json
import sys
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import shard_map
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import eqsat
from eqsat.plans.sharding import collectives

RNG = np.random.default_rng(0)


def _array(shape: tuple[int, ...], sharding: Any = None) -> jax.Array:
    x = jnp.asarray(RNG.standard_normal(shape) / np.sqrt(shape[-1]), jnp.float32)
    return x if sharding is None else jax.device_put(x, sharding)


def _case(fun: Callable[..., Any], args: tuple, traced: bool = False, **options: Any) -> dict[str, Any]:
    """fun optimized and jitted on args (the optimized one's first call under an outer jit if `traced`)."""
    fast = eqsat.optimize(fun, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", eqsat.EqsatWarning)
        got = jax.jit(lambda *a: fast(*a))(*args) if traced else fast(*args)
    want = jax.jit(fun)(*args)
    plan = fast.plan(*args)
    return {
        "sharding": [str(got.sharding.spec), str(want.sharding.spec)],
        "collectives": [
            dict(collectives(fast.lower(*args).compile().as_text())),
            dict(collectives(jax.jit(fun).lower(*args).compile().as_text())),
        ],
        "error": float(np.max(np.abs(np.asarray(got) - np.asarray(want)))),
        "rewritten": plan.rewritten_ops(),
        "bodies_rewritten": int(plan.stats.get("bodies_rewritten", 0)),
        "fallback": plan.fallback,
        "watched": bool(plan.overflow_watch),  # its overflow watch's fallback and flag are not counted above
        "refused": plan.extraction.refused,
        "warnings": [str(w.message) for w in caught],
    }


def _chain(a: Any, b: Any, v: Any) -> Any:
    return (a @ b) @ v


def main() -> dict[str, Any]:
    out: dict[str, Any] = {"devices": jax.device_count()}
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    rows = NamedSharding(mesh, P("x"))
    a, b, v = _array((512, 256), rows), _array((256, 256)), _array((256, 2))
    out["sharded_args"] = _case(_chain, (a, b, v))

    def constrained(a: Any, b: Any, v: Any) -> Any:
        return jax.lax.with_sharding_constraint(a @ b, NamedSharding(mesh, P(None, "x"))) @ v

    out["constraint"] = _case(constrained, (a, b, v))

    def mapped(a: Any, b: Any, v: Any) -> Any:
        return shard_map(_chain, mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=P("x"))(a, b, v)

    def mapped_psum(a: Any, b: Any, v: Any) -> Any:
        body = lambda a, b, v: jax.lax.psum(_chain(a, b, v), "x")  # noqa: E731
        return shard_map(body, mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=P())(a, b, v)

    out["shard_map"] = _case(mapped, (a, b, v))
    out["shard_map_psum"] = _case(mapped_psum, (a, b, v))
    out["shard_map_psum_traced"] = _case(mapped_psum, (a, b, v), traced=True, limits=eqsat.Limits(iterations=11))

    grid = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    x = _array((256, 512), NamedSharding(grid, P("data", None)))
    w1, w2 = (_array((512, 512), NamedSharding(grid, P(None, "model"))) for _ in range(2))

    def siblings(x: Any, w1: Any, w2: Any) -> Any:  # the h100 profile merges the two GEMMs along the sharded axis
        return jnp.tanh(x @ w1) + jnp.tanh(x @ w2)

    out["merge_along_sharded_axis"] = _case(siblings, (x, w1, w2), target="h100")
    # and a chain big enough to re-associate on the h100 profile, replicated
    m, u = _array((1024, 1024), NamedSharding(grid, P())), _array((1024, 2), NamedSharding(grid, P()))

    def siblings_and_chain(x: Any, w1: Any, w2: Any, m: Any, u: Any) -> Any:
        return siblings(x, w1, w2) + jnp.sum((m @ m) @ u)

    out["merge_refused_chain_kept"] = _case(siblings_and_chain, (x, w1, w2, m, u), target="h100")

    explicit = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(explicit):
        a = jax.device_put(a, P("x"))

        def explicit_psum(a: Any, b: Any, v: Any) -> Any:
            body = lambda a, b, v: jax.lax.psum(_chain(a, b, v), "x")  # noqa: E731
            return shard_map(body, in_specs=(P("x"), P(), P()), out_specs=P())(a, b, v)

        out["explicit_args"] = _case(_chain, (a, b, v), limits=eqsat.Limits(iterations=10))
        out["explicit_shard_map"] = _case(explicit_psum, (a, b, v))
        out["explicit_shard_map_traced"] = _case(explicit_psum, (a, b, v), traced=True, limits=eqsat.Limits(seconds=9))
    return out


if __name__ == "__main__":
    json.dump(main(), sys.stdout)
