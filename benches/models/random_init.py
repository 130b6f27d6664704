"""What the third-party benchmark models are built with: fixed random inputs, a scope that draws random weights
fast, and a workload of `fn(params, x)`."""

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from eqsat.support.workload import Workload

SEED = 0


def normal(shape: tuple[int, ...]) -> jax.Array:
    """A fixed random float32 input."""
    return jnp.asarray(np.random.default_rng(SEED).standard_normal(shape, dtype=np.float32))


def token_ids(batch: int, seq: int, vocab: int) -> jax.Array:
    """Fixed random token ids."""
    return jnp.asarray(np.random.default_rng(SEED).integers(0, vocab, (batch, seq), dtype=np.int32))


def init_scope() -> contextlib.AbstractContextManager[None]:
    """Scope for drawing random weights: libraries draw each weight eagerly, compiling one sampler per
    shape, and non-partitionable threefry compiles several times faster on CPU."""
    return jax.threefry_partitionable(False)


def params_workload(name: str, fn: Callable[[Any, jax.Array], Any], params: Any, x: jax.Array, note: str) -> Workload:
    """``fn(params, x)`` with the weights as argument 0."""
    return Workload(name=name, fn=fn, args=(params, x), params_argnums=(0,), note=note)
