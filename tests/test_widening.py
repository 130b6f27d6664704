"""The float64 reference validation judges accuracy against (eqsat/widening.py): programs with float32 constants,
scatters and loops evaluated in float64, their own bfloat16 quantization kept."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat.widening import widened

F64 = np.dtype(np.float64)


def _program(x, ids):
    y = x * jnp.float32(1e-3) + 0.5  # a float32 constant beside a literal: binding float64 inputs failed here
    table = jnp.zeros(8, jnp.float32).at[ids].add(y)  # a scatter-add, whose combiner is typed float32
    total = lax.fori_loop(0, 3, lambda i, c: c * 0.5 + table.sum(), jnp.float32(0))  # a loop's typed body
    return table, total, y.astype(jnp.bfloat16).astype(jnp.float32)


def _in_numpy(x, ids):
    y = x.astype(np.float64) * np.float64(np.float32(1e-3)) + 0.5
    table = np.zeros(8)
    np.add.at(table, ids, y)
    total = 0.0
    for _ in range(3):
        total = total * 0.5 + table.sum()
    return table, total


def test_a_float32_program_with_constants_a_scatter_and_a_loop_runs_in_float64():
    x = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)
    ids = jnp.array([0, 1, 2, 1, 7])
    with jax.enable_x64(True):
        table, total, quantized = widened(jax.jit(_program), [x, ids], F64)
    assert table.dtype == total.dtype == np.float64
    want_table, want_total = _in_numpy(np.asarray(x), np.asarray(ids))
    np.testing.assert_allclose(table, want_table, rtol=1e-14)
    np.testing.assert_allclose(total, want_total, rtol=1e-14)
    # the program's own rounding to bfloat16 stays: the reference is of the program, not of exact arithmetic
    np.testing.assert_array_equal(np.asarray(quantized, np.float32), _program(x, ids)[2])


def test_a_program_that_cannot_run_wide_gives_no_reference():
    bits = lambda x: lax.bitcast_convert_type(x, jnp.int32)  # noqa: E731  reads its input bit for bit
    with jax.enable_x64(True):
        assert widened(jax.jit(bits), [jnp.ones(3, jnp.float32)], F64) is None
