"""The differential fuzzer (eqsat/fuzz.py) in the default suite, and the failures it found, each as a test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat import fuzz

# chunks of one seed, so that pytest-xdist spreads them over the workers
_CHUNK, _CHUNKS = 10, 6


@pytest.mark.parametrize("chunk", range(_CHUNKS))
def test_random_programs_under_random_transformations_agree_with_jax_jit(chunk: int) -> None:
    outcomes = [fuzz.run_case(fuzz.draw_case(0, i)) for i in range(chunk * _CHUNK, (chunk + 1) * _CHUNK)]
    failures = [f"{o.status}: {o.case.describe()}\n{o.detail}" for o in outcomes if o.status in fuzz.FAILURES]
    assert not failures, "\n\n".join(failures)
    assert sum(o.status != "invalid" for o in outcomes) >= _CHUNK // 2  # the cases ran, not skipped


def test_cases_are_reproducible_and_varied() -> None:
    a, b = fuzz.draw_case(3, 17), fuzz.draw_case(3, 17)
    assert repr(a.program) == repr(b.program) and a.transform == b.transform and a.tree == b.tree
    drawn = [fuzz.draw_case(0, i) for i in range(200)]
    assert {c.transform for c in drawn} == set(fuzz.TRANSFORMS)
    assert {c.body for c in drawn} == set(fuzz.BODIES)
    assert {c.program.dtype for c in drawn} == set(fuzz.DTYPES)


def test_a_mismatch_is_reported() -> None:
    """The comparison the fuzzer makes can fail: a result off by more than the tolerance."""
    x = jnp.linspace(1.0, 2.0, 8)
    assert fuzz._compare(lambda v: v, (x,), x, x * 1.01, "call") is not None
    assert fuzz._compare(lambda v: v, (x,), x, x * (1 + 1e-6), "call") is None


def test_plan_called_in_a_scan_body_over_concrete_arguments() -> None:
    """Found by the fuzzer (seed 7, case 3): arguments closed over by a scan body are concrete, its results
    are the scan's tracers; validation compared those tracers (TracerArrayConversionError)."""
    rng = np.random.default_rng(0)
    a, b, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((64, 64), (64, 64), (64, 2)))

    def chain(a, b, v):
        return (a @ b) @ v

    fast = eqsat.optimize(chain)
    out = lax.scan(lambda c, _: (c, fast(a, b, v)), 0, None, length=2)[1]
    np.testing.assert_allclose(out, jnp.stack([chain(a, b, v)] * 2), rtol=2e-3, atol=1e-3)
    assert fast.plan(a, b, v).rewritten_ops() and fast.plan(a, b, v).fallback is None
    assert jax.tree_util.tree_leaves(fast(a, b, v))
