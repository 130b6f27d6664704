"""silu (x * sigmoid(x)) computed as h + h * tanh(h), h = x / 2: one loop of XLA:CPU's cheaper tanh, float32 only,
as accurate as the original to a rounding of x's scale."""

import jax
import jax.numpy as jnp
import numpy as np

import eqsat


def _swish(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(x)  # keras' swish; jax.nn.silu writes the same product


def test_silu_runs_as_one_tanh_and_agrees_with_the_original():
    x = jax.random.normal(jax.random.key(0), (64, 256)) * 8  # tails on both sides: logistic down to about 1e-14
    for fn in (jax.nn.silu, _swish):
        fast = eqsat.optimize(fn)
        plan = fast.plan(x)
        assert "SiluFromTanh" in plan.rewritten_ops() and plan.fallback is None
        exact = np.asarray(jax.nn.silu(np.asarray(x, np.float64)))
        scale = float(np.max(np.abs(np.asarray(x))))  # the error is a rounding of x / 2 where the sum cancels
        assert np.max(np.abs(np.asarray(fast(x), np.float64) - exact)) < 4 * float(jnp.finfo(jnp.float32).eps) * scale


def test_silu_of_a_narrow_type_keeps_its_formula():
    x = jnp.linspace(-8, 8, 4096, dtype=jnp.bfloat16)
    fast = eqsat.optimize(jax.nn.silu)
    assert "SiluFromTanh" not in fast.plan(x).rewritten_ops()
    exact = np.asarray(jax.nn.silu(np.asarray(x, np.float64)))
    assert np.max(np.abs(np.asarray(fast(x), np.float64) - exact)) <= float(jnp.finfo(jnp.bfloat16).eps) * 8
