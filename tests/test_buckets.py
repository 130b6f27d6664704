"""optimize(f, buckets=...): sizes between buckets share one plan, results sliced back, rows checked independent."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat


def _mlp(params, x):
    for w in params:
        x = jax.nn.relu(x @ w)
    return x, jnp.sum(params[0])  # a result without the batch axis comes back as it is


_PARAMS = [jnp.asarray(np.random.default_rng(k).standard_normal((8, 8)).astype(np.float32)) for k in range(2)]


def _x(n):
    return jnp.asarray(np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32))


def test_sizes_between_buckets_share_one_plan():
    fast = eqsat.optimize(lambda p, x: _mlp(p, x), buckets=eqsat.Buckets((4, 8), argnums=(1,)))
    for n in (1, 3, 4, 5, 8):
        got, want = fast(_PARAMS, _x(n)), _mlp(_PARAMS, _x(n))
        assert got[0].shape == (n, 8)
        np.testing.assert_allclose(got[0], want[0], rtol=2e-3, atol=1e-4)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    assert fast.cache_info()["plans"] == 2
    assert fast.plan(_PARAMS, _x(5)).graph.nodes[2].shape == (8, 8)  # planned at the bucket's size


def test_sizes_above_the_largest_bucket_run_at_their_own():
    fast = eqsat.optimize(lambda p, x: _mlp(p, x), buckets=eqsat.Buckets((4,), argnums=1))
    np.testing.assert_allclose(fast(_PARAMS, _x(6))[0], _mlp(_PARAMS, _x(6))[0], rtol=2e-3, atol=1e-4)
    assert fast.cache_info()["plans"] == 1


def test_rows_that_are_not_independent_fall_back_with_a_warning():
    def normalized(x):
        return x / jnp.sum(x, axis=0)  # a column sum over the batch: the padding rows change nothing here

    def mean_centred(x):
        return x - jnp.mean(x, axis=0)  # the mean counts the padding rows: not row-independent

    assert not _warned(eqsat.optimize(normalized, buckets=eqsat.Buckets((8,))), 5)
    fast = eqsat.optimize(mean_centred, buckets=eqsat.Buckets((8,)))
    assert _warned(fast, 5)
    np.testing.assert_allclose(fast(_x(5)), mean_centred(_x(5)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast(_x(6)), mean_centred(_x(6)), rtol=1e-5, atol=1e-6)  # the bucket runs unpadded


def _warned(fast, n):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast(_x(n))
    return [w for w in caught if issubclass(w.category, eqsat.EqsatWarning) and "bucket" in str(w.message)]


def test_under_jit_the_padding_is_traced():
    fast = eqsat.optimize(_mlp, buckets=eqsat.Buckets((8,), argnums=(1,)))
    got = jax.jit(lambda p, x: fast(p, x)[0])(_PARAMS, _x(3))
    np.testing.assert_allclose(got, _mlp(_PARAMS, _x(3))[0], rtol=2e-3, atol=1e-4)


def test_bad_buckets_say_what_was_expected():
    with pytest.raises(ValueError, match="positive ints"):
        eqsat.Buckets((0, 8))
    with pytest.raises(TypeError, match=r"eqsat\.Buckets"):
        eqsat.optimize(_mlp, buckets=(8, 16))
    fast = eqsat.optimize(_mlp, buckets=eqsat.Buckets((8,), argnums=(0, 1)))
    with pytest.raises(ValueError, match="one length along axis 0"):
        fast(_PARAMS, _x(3))
    with pytest.raises(ValueError, match="argument"):
        eqsat.optimize(_mlp, buckets=eqsat.Buckets((8,), argnums=(5,)))(_PARAMS, _x(3))
