"""silu (x * sigmoid(x)) keeps its formula: as h + h * tanh(h), h = x / 2, 1 + tanh(h) cancels for very negative x
and every digit is lost below x = -17 (issue 42 item 3; rules/kernels.egg)."""

import jax
import jax.numpy as jnp
import numpy as np

import eqsat


def _swish(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(x)  # keras' swish; jax.nn.silu writes the same product


def test_silu_keeps_its_tail():
    # tails on both sides, to x = -30 where silu is -2.8e-12: the tanh form gave 0 below x = -17
    x = jnp.concatenate([jnp.linspace(-30.0, -10.0, 2001), jax.random.normal(jax.random.key(0), (4096,)) * 8])
    wide = np.asarray(x, np.float64)
    exact = wide / (1 + np.exp(-wide))
    for fn in (jax.nn.silu, _swish):
        fast = eqsat.optimize(fn)
        fast.plan(x)
        got, want = np.asarray(fast(x), np.float64), np.asarray(jax.jit(fn)(x), np.float64)
        assert fast.plan(x).fallback is None
        ours, jits = np.abs(got - exact) / np.abs(exact), np.abs(want - exact) / np.abs(exact)
        assert np.max(jits) < 1e-6 and np.max(ours) <= 4 * np.max(jits)


def test_silu_of_a_narrow_type_keeps_its_formula():
    x = jnp.linspace(-8, 8, 4096, dtype=jnp.bfloat16)
    fast = eqsat.optimize(jax.nn.silu)
    exact = np.asarray(jax.nn.silu(np.asarray(x, np.float64)))
    assert np.max(np.abs(np.asarray(fast(x), np.float64) - exact)) <= float(jnp.finfo(jnp.bfloat16).eps) * 8
