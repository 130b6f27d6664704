"""The one source of example inputs: what validation, `--args`, `rules check` and kernel timing run on."""

from typing import Any

import jax
import numpy as np
from jax.core import ShapedArray


def example_array(shape: tuple[int, ...], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random normals for floats and complex numbers; 0 or 1 at random for integers and booleans, so that every
    integer is a valid index into a non-empty axis and not all of them are the same."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.inexact) or jax.dtypes.issubdtype(dtype, jax.numpy.inexact):  # bfloat16 too
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def example_like(aval: Any, seed: int) -> Any:
    """A concrete value of this abstract value (example_array's), a fixed key for typed keys, a token for tokens."""
    if not isinstance(aval, ShapedArray):
        return jax.lax.create_token()
    if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key):
        impl = aval.dtype._impl  # a key dtype has no public accessor for its implementation
        return jax.random.wrap_key_data(np.zeros((*aval.shape, *impl.key_shape), np.uint32), impl=impl)
    return example_array(aval.shape, aval.dtype, np.random.default_rng(seed))
