"""A plan is keyed by everything jax.jit keys its traces by: the enclosing transformations' axis environment, the
jax configuration values that change tracing, user trace contexts. Each test calls one function under one context,
then under another, and compares with jax.jit under the second (issue 24, item 5)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat


def _both(fun):
    """jax.jit's and eqsat's wrapping of one function (each a fresh function: plans are shared per function)."""
    return jax.jit(fun), eqsat.optimize(functools.wraps(fun)(lambda *a: fun(*a)))


@pytest.mark.parametrize("background", [False, True])
def test_vmap_axis_size_keys_the_plan(background):
    fast = eqsat.optimize(lambda x: x - lax.pmean(x, "b"), background=background)
    np.testing.assert_allclose(jax.vmap(fast, axis_name="b")(jnp.array([1.0, 2.0])), [-0.5, 0.5])
    got = jax.vmap(fast, axis_name="b")(jnp.array([1.0, 2.0, 6.0]))
    np.testing.assert_allclose(got, [-2.0, -1.0, 3.0])


@pytest.mark.parametrize("background", [False, True])
def test_x64_keys_the_plan(background):
    fast = eqsat.optimize(lambda x: x.astype(float) / 3, background=background)
    x = np.arange(4, dtype=np.int32)
    assert fast(x).dtype == jnp.float32
    with jax.enable_x64(True):
        want, got = jax.jit(lambda x: x.astype(float) / 3)(x), fast(x)
        assert got.dtype == want.dtype == jnp.float64
        np.testing.assert_array_equal(got, want)


def test_rank_promotion_keys_the_plan():
    jitted, fast = _both(lambda x, y: x + y)
    x, y = jnp.ones(3), jnp.ones((2, 3))
    assert fast(x, y).shape == (2, 3)
    with jax.numpy_rank_promotion("raise"):
        with pytest.raises(ValueError, match="jax_numpy_rank_promotion='raise'"):
            jitted(x, y)
        with pytest.raises(ValueError, match="jax_numpy_rank_promotion='raise'"):
            fast(x, y)


def test_default_matmul_precision_keys_the_plan():
    jitted, fast = _both(lambda a, b: a @ b)
    a = jnp.ones((8, 8))
    assert "HIGHEST" not in fast.lower(a, a).as_text()
    with jax.default_matmul_precision("highest"):
        assert "HIGHEST" in jitted.lower(a, a).as_text()
        assert "HIGHEST" in fast.lower(a, a).as_text()


def test_user_trace_context_keys_the_plan():
    scale = jax.make_user_context(1.0)
    fast = eqsat.optimize(lambda x: x * scale.value)
    x = jnp.ones(2)
    np.testing.assert_array_equal(fast(x), [1.0, 1.0])
    with scale(3.0):
        np.testing.assert_array_equal(fast(x), [3.0, 3.0])
    np.testing.assert_array_equal(fast(x), [1.0, 1.0])


def test_prepare_keys_its_plans_by_the_context():
    fast = eqsat.optimize(lambda w, x: (x.astype(float) @ w) @ w / 3, params_argnums=0)
    run = fast.prepare(np.ones((16, 16), np.float32))
    x = np.arange(64, dtype=np.int32).reshape(4, 16)
    assert run(x).dtype == jnp.float32
    with jax.enable_x64(True):
        assert run(x).dtype == jnp.float64
