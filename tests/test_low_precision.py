"""Low precision (issue 26 item 5): bfloat16 and float16 elementwise chains computed in float32 and rounded once
(extract/widen.py), lowered so (backends/lower.py) and judged against a float32 evaluation
(eqsat/numerics/tolerance.py)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.backends.lower import lower
from eqsat.numerics.tolerance import NARROW_ULPS, narrow_less_accurate, ulps


def _chain(x):
    # constants exact in every float type: the float32 reference computes the very program
    return jnp.tanh(x * 2.0) * jnp.exp(-(x * x)) + 0.5 * x


def _rms_norm(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w


def _normal(dtype, *shape):
    return jnp.asarray(np.random.default_rng(0).standard_normal(shape), dtype)


def _ulps(got, reference):
    return ulps(got, reference, got.dtype)


def _converts(plan, *args):
    """The dtypes the lowered plan converts to, in order."""
    jaxpr = jax.make_jaxpr(lower(plan))(*args)
    return [str(e.params["new_dtype"]) for e in jaxpr.eqns if e.primitive.name == "convert_element_type"]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_narrow_chain_is_computed_in_float32_and_rounded_once(dtype):
    x = _normal(dtype, 2, 8, 64)
    fast = eqsat.optimize(_chain)
    out = fast(x)
    plan = fast.plan(x)
    assert plan.fallback is None and plan.widened() == 8  # every op of the chain
    assert "computed in float32" in plan.summary()
    converts = _converts(plan, x)  # the input and the constants up, the result down once
    assert converts.count(np.dtype(dtype).name) == 1 and set(converts) == {"float32", np.dtype(dtype).name}
    reference = _chain(x.astype(jnp.float32))
    plan_ulps, original_ulps = _ulps(out, reference), _ulps(jax.jit(_chain)(x), reference)
    assert out.dtype == dtype and np.max(plan_ulps) <= 0.5 + 1e-3  # one rounding of the exact chain
    assert np.max(original_ulps) > 1.0  # one rounding per op: further


def test_the_chain_runs_through_jnp_own_conversions_and_reductions():
    # jnp.mean of bfloat16 sums in float32 between two conversions: the whole norm is one region, one rounding
    x, w = _normal(jnp.bfloat16, 2, 8, 64), _normal(jnp.bfloat16, 64)
    fast = eqsat.optimize(_rms_norm)
    out = fast(x, w)
    plan = fast.plan(x, w)
    assert {n.op for n in plan.nodes if n.wide} >= {"Convert", "Rsqrt", "Mul"}
    assert _converts(plan, x, w).count("bfloat16") == 1
    assert np.max(_ulps(out, _rms_norm(x.astype(jnp.float32), w.astype(jnp.float32)))) <= NARROW_ULPS


def test_a_float32_chain_is_untouched():
    x = _normal(jnp.float32, 2, 8, 64)
    plan = eqsat.optimize(_chain).plan(x)
    assert plan.widened() == 0 and plan.unchanged
    assert _converts(plan, x) == []


def test_a_target_that_computes_narrow_floats_natively_keeps_every_rounding():
    x = _normal(jnp.bfloat16, 2, 8, 64)
    plan = eqsat.optimize(_chain, target="h100").plan(x)  # its profile prices no rounding: nothing to gain
    assert plan.widened() == 0


def test_validation_refuses_a_narrow_plan_less_accurate_than_the_original():
    x = _normal(jnp.bfloat16, 4, 256)
    expected = [np.asarray(jax.jit(jax.nn.gelu)(x))]
    wide = jax.nn.gelu(x.astype(jnp.float32))
    judge = jax.jit(lambda v: [jax.nn.gelu(v)])
    assert narrow_less_accurate(judge, [x], expected, [np.asarray(wide.astype(jnp.bfloat16))]) is None
    in_float8 = wide.astype(jnp.float8_e4m3fn).astype(jnp.bfloat16)
    found = narrow_less_accurate(judge, [x], expected, [np.asarray(in_float8)])
    assert found is not None and "by more than 2 units of bfloat16's last place" in found[1]


def test_a_widened_plan_that_drops_a_term_falls_back():
    # gelu without its cubic term: within validation's bfloat16 tolerance of the original (5e-2 and a share of the
    # scale) but, against the float32 evaluation, many units of bfloat16's last place less accurate
    x = _normal(jnp.bfloat16, 4, 256)
    fast = eqsat.optimize(jax.nn.gelu, rules='(rewrite (Add a (Mul k (IntegerPow 3 a))) a :name "drop-cube")')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fast(x)
    assert any("units of bfloat16's last place" in str(w.message) for w in caught)
    assert fast.plan(x).fallback is not None
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(jax.nn.gelu)(x)))


def test_a_widened_chain_before_a_contraction_is_kept():
    # a dot sums the chain's values, rounded once instead of at every op: where its terms cancel, elements move by
    # more than a few units of their own last place, as far as the original's own are from the float32 evaluation
    x, w1, w2 = (
        _normal(jnp.bfloat16, 16, 256),
        _normal(jnp.bfloat16, 256, 512) / 16,
        _normal(jnp.bfloat16, 512, 64) / 23,
    )
    fast = eqsat.optimize(lambda x, w1, w2: jax.nn.gelu(x @ w1) @ w2)
    fast(x, w1, w2)
    plan = fast.plan(x, w1, w2)
    assert plan.widened() and plan.fallback is None


def test_a_float32_value_the_program_rounds_to_bfloat16_stays_rounded():
    """`x.astype(bfloat16)` of float32 data is the program's own quantization (fuzz seed 2034, case 162: the round
    trip was dropped, and validation refused the plan); a chain after it in bfloat16 may still be widened."""

    def quantized(x):
        q = x.astype(jnp.bfloat16)
        return q.astype(jnp.float32), _chain(q)

    x = _normal(jnp.float32, 64, 32) * 3
    fast = eqsat.optimize(quantized)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: the plan is right
        got = fast(x)
    want = jax.jit(quantized)(x)
    np.testing.assert_array_equal(got[0], want[0])
    assert float(jnp.max(_ulps(got[1], _chain(x.astype(jnp.bfloat16).astype(jnp.float32))))) <= NARROW_ULPS
    assert fast.plan(x).widened()  # the chain on the rounded value is computed in float32


def test_a_written_rounding_is_named_and_kept_when_asked():
    """`(x.astype(bfloat16) + 1024) - 1024` rounds x to bfloat16's spacing near 1024 (issue 42 item 4): widening
    drops that rounding, so the plan's summary names the ops whose rounding it removed, and disabled_rules=
    ('low-precision',) keeps every one (jax.jit's bits)."""

    def rounded(x):
        return (x.astype(jnp.bfloat16) + 1024) - 1024

    x = _normal(jnp.float32, 64, 64) * 3
    widened = eqsat.optimize(rounded, validate=False)
    summary = widened.plan(x).summary()
    assert "roundings removed after Add" in summary and "test_low_precision.py" in summary
    assert float(jnp.max(jnp.abs(widened(x).astype(jnp.float32) - jax.jit(rounded)(x).astype(jnp.float32)))) > 1
    kept = eqsat.optimize(rounded, disabled_rules=("low-precision",))
    np.testing.assert_array_equal(kept(x), jax.jit(rounded)(x))
    assert not kept.plan(x).widened() and "removed" not in kept.plan(x).summary()


def test_a_conversion_to_a_narrower_range_is_kept():
    """Fuzz seed 2051, case 2694: `x.astype(float16).astype(bfloat16)` of bfloat16 data makes 1e-31 zero (and 1e5
    inf), which in float32 is no identity: the conversion stays, and the chain around it is still widened."""

    def chained(x):
        return jnp.tanh(x.astype(jnp.float16).astype(jnp.bfloat16) * 2.0) * jnp.exp(-x) + x

    x = _normal(jnp.bfloat16, 64, 64)
    fast = eqsat.optimize(chained, validate=False)
    fast(x)
    assert fast.plan(x).widened()
    tiny = x * jnp.bfloat16(1e-31)
    np.testing.assert_array_equal(fast(tiny), jax.jit(chained)(tiny))
