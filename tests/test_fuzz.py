"""The differential fuzzer (eqsat/tools/fuzz.py) in the default suite, and the failures it found, each as a test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.numerics import tolerance
from eqsat.tools import fuzz, fuzz_cases

# 300 cases of one seed in chunks, so that pytest-xdist spreads them over the workers (about 1 s a case on one
# core; `python -m eqsat fuzz --n 10000 --seed S --jobs 2` runs more)
_CHUNK, _CHUNKS = 10, 30


@pytest.mark.parametrize("chunk", range(_CHUNKS))
def test_random_programs_under_random_transformations_agree_with_jax_jit(chunk: int) -> None:
    outcomes = [fuzz.run_case(fuzz_cases.draw_case(0, i)) for i in range(chunk * _CHUNK, (chunk + 1) * _CHUNK)]
    failures = [f"{o.status}: {o.case.describe()}\n{o.detail}" for o in outcomes if o.status in fuzz.FAILURES]
    assert not failures, "\n\n".join(failures)
    assert sum(o.status != "invalid" for o in outcomes) >= _CHUNK // 2  # the cases ran, not skipped


def test_cases_are_reproducible_and_varied() -> None:
    a, b = fuzz_cases.draw_case(3, 17), fuzz_cases.draw_case(3, 17)
    assert repr(a.program) == repr(b.program) and a.transform == b.transform and a.tree == b.tree
    drawn = [fuzz_cases.draw_case(0, i) for i in range(200)]
    assert {c.transform for c in drawn} == set(fuzz_cases.TRANSFORMS)
    assert {c.body for c in drawn} == set(fuzz_cases.BODIES)
    assert {c.program.dtype for c in drawn} == set(fuzz_cases.DTYPES)


def test_a_long_run_in_parts_runs_the_same_cases() -> None:
    summary = fuzz.fuzz(2, 3, first=17)
    assert [o.case.index for o in summary.outcomes] == [17, 18]
    assert repr(summary.outcomes[0].case.program) == repr(fuzz_cases.draw_case(3, 17).program)
    assert "2 cases (17 to 18)" in summary.table()


def test_a_mismatch_is_reported() -> None:
    """The comparison the fuzzer makes can fail: a result off by more than the tolerance."""
    x = jnp.linspace(1.0, 2.0, 8)
    assert fuzz._compare(lambda v: v, (x,), x, x * 1.01, "call") is not None
    assert fuzz._compare(lambda v: v, (x,), x, x * (1 + 1e-6), "call") is None


def test_a_subnormal_flushed_or_kept_is_no_mismatch() -> None:
    """Found by the fuzzer's special values (seed 2040, case 126): jax.jit's one_hot dot flushes a subnormal row to 0,
    the plan's gather keeps it (1e-45): XLA:CPU flushes in some kernels only. A smallest normal's difference counts."""
    zero = jnp.zeros(4, jnp.float32)
    tiny = float(jnp.finfo(jnp.float32).tiny)
    assert fuzz._compare(lambda v: v * 0, (zero,), zero, zero.at[1].set(tiny / 2**20), "call") is None
    assert fuzz._compare(lambda v: v * 0, (zero,), zero, zero.at[1].set(tiny * 4), "call") is not None


def test_later_calls_draw_special_values() -> None:
    args = ({"w0": jnp.ones((4, 8))}, [jnp.ones(3, jnp.bfloat16)], [jnp.arange(5)])
    spoiled = jax.tree.leaves(fuzz_cases.special_values(args, 0))
    assert all(not np.all(np.asarray(x, np.float32) == 1) for x in spoiled[:2])
    np.testing.assert_array_equal(spoiled[2], jnp.arange(5))  # integers as they were


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


def test_low_precision_results_may_re_round_where_terms_cancel() -> None:
    """Found by the fuzzer (seed 2026, case 692, before the generator table grew): x0 @ x1 + x2 @ x1 in bfloat16
    re-associated under vmap gave -0.0029 where the original's terms cancelled to 0, on a result of scale 7.9; the
    share of the scale allowed was a sixteenth of one bfloat16 rounding. A few roundings of the scale are allowed
    now, and a wrong value is still refused."""
    want = np.array([0.0, 7.88, -3.0], dtype=jnp.bfloat16)
    assert tolerance.differs(0, want, np.array([-0.0029, 7.88, -3.0], dtype=jnp.bfloat16)) is None
    assert tolerance.differs(0, want, np.array([0.9, 7.88, -3.0], dtype=jnp.bfloat16)) is not None
    grad = np.array([-0.09375, 0.344], dtype=jnp.bfloat16)  # case 1137: a gradient through such a sum
    assert tolerance.differs(0, grad, np.array([-0.078125, 0.344], dtype=jnp.bfloat16)) is None
    f32 = np.array([0.0, 7.88], dtype=np.float32)  # float32 keeps its bound: 1e-5 of the scale
    assert tolerance.differs(0, f32, np.array([2e-5, 7.88], dtype=np.float32)) is None
    assert tolerance.differs(0, f32, np.array([2e-4, 7.88], dtype=np.float32)) is not None


def test_a_result_more_accurate_than_jax_jits_is_no_mismatch() -> None:
    """Seed 2032, case 266: log_softmax over an axis of one element is exactly 0; jax.jit's naive form gives 3e-8
    and the stable plan 0, which the per-element tolerance (of a scale of 3e-8) alone called a mismatch."""
    outcome = fuzz.run_case(fuzz_cases.draw_case(2032, 266))
    assert outcome.status == "ok", outcome.detail


@pytest.mark.parametrize(
    "seed, index",
    [
        (2040, 122),
        (2041, 54),
        (2042, 1358),
        (2042, 1611),
        (2042, 2875),
        (2046, 1647),
        (2046, 2793),
        (2047, 1619),
        (2050, 6292),
        (2051, 2694),
        (2054, 9941),
    ],
)
def test_special_values_on_a_later_call_give_jits_answer(seed: int, index: int) -> None:
    """Found by the later call with special values (issue 42). Seed 2040, case 122: a naive softmax made stable
    was NaN across a row holding +inf (jax.jit: 0 beside the NaN). Seed 2041, case 54: a 1x1 conv enlarged to 3x3
    to merge with its sibling (enlarge-1x1-to-3x3) is NaN beside a NaN input pixel (0 x NaN); now watched. Seed
    2042, cases 1358 and 1611: a strided conv's input gradient, re-lowered, multiplies its holes by an inf weight
    where jax.jit's does not (convs with lhs dilation are watched now); case 2875: a float16 one-hot product widened
    to float32 is NaN beside the label where XLA's float16 select is not (a one-hot product stays narrow now). Seed
    2046, case 1647: two padded sibling convs merged into one multiply the padding by an inf weight where jax.jit's
    single-channel conv skips it (re-formed padded convs are watched now); case 2793: a grouped conv's input gradient
    (lhs-dilated) as shifted slices multiplies every hole by an inf weight, where jax.jit's conv in a scan multiplies
    fewer (alternative kernels of lhs-dilated convs are watched too). Seed 2047, case 1619: a grouped conv's weight
    gradient (batch groups), no rule fired, lowered in the table's layout, NaN in 32 places where jax.jit's in a scan
    is in 28 (XLA:CPU masks a batch-grouped conv by a product with zeros; convs with batch groups are watched now).
    Seed 2050, case 6292: called in a scan body over closed-over arrays while the guard was undecided, a live call
    ran the original at once, where jax.jit stages it into the body: a lhs-dilated conv's holes times an inf weight,
    NaN at the top level, skipped in the loop (test_guard.py's staged-call test pins it without the timing). Seed
    2051, case 2694 (the "scaled" call): a bfloat16 value converted to float16 and back, widened to float32 as if
    the conversion were the identity: 1e-31 kept where float16 makes it 0 (conversions that narrow the range stay).
    Seed 2054, case 9941 (the "scaled" call, prepared): naive softmaxes of x * k made stable, x near 1e12, NaN across
    rows where jax.jit's naive form is 0 beside its NaNs (an FMA's rounding error, test_special_values.py)."""
    outcome = fuzz.run_case(fuzz_cases.draw_case(seed, index))
    assert outcome.status == "ok", outcome.detail


def test_the_reference_is_jax_jit_in_eqsats_place() -> None:
    """Seed 2046, case 2441: under an eager jax.grad, jax.jit(fun) in eqsat's place rounds a one-element softmax's
    gradient to -6e-14, where jax.jit of the whole gradient gives 0; eqsat, running the original program, gives the
    former. The reference is jax.jit under the same transformation, not the transformation under jax.jit."""
    outcome = fuzz.run_case(fuzz_cases.draw_case(2046, 2441))
    assert outcome.status == "ok", outcome.detail


@pytest.mark.parametrize(("seed", "index"), [(2046, 1024), (2050, 4987)])
def test_products_that_cancel_at_extreme_magnitudes_are_no_mismatch(seed: int, index: int) -> None:
    """Seed 2046, case 1024: the gradient of a program that holds log_softmax's gradient, its logits scaled to 1e30:
    two products of 6e31 cancel to 0 in float64, in jax.jit's program and op by op; XLA contracts one of them into an
    FMA in the plan's fusion (-5.4e24, its rounding error) as it does elsewhere in jax.jit's own (2.3e23). The float64
    reference rounded at random at float32's precision shows both undetermined by that much. Seed 2050, case 4987:
    five such gradients summed, of terms near 1e12 that cancel to 0 (op by op, the plan gives 0 too); the plan's
    fusion leaves 262144: 1.4x the largest of three runs rounded at random, 2.3x their root-mean-square (3x is
    allowed)."""
    outcome = fuzz.run_case(fuzz_cases.draw_case(seed, index))
    assert outcome.status == "ok", outcome.detail


@pytest.mark.parametrize(("seed", "index"), [(2037, 8427), (2037, 9552), (2048, 91)])
def test_sums_that_overflow_midway_at_extreme_magnitudes_are_no_mismatch(seed: int, index: int) -> None:
    """Seed 2037: case 8427 (bfloat16 dense layers in a fori body, inputs scaled to 1e30: the products overflow and
    XLA's order picks the sign) and 9552 (five float16 sum pools, scaled 7,129: the watch's fallback runs the same
    reduce_window in a while body, where XLA orders the sum otherwise and overflows; at the top level -7984). The
    float64 reference now leaves such sums undetermined, and bfloat16 programs are really widened. Seed 2048, case 91:
    the gradient of dense-relu layers whose products overflow (1e12 by 1e31); the plan's merged dot over 10 columns
    runs an FMA chain that keeps the first infinite product's sign where jax.jit's dot over 3 gives inf - inf = NaN,
    and relu's derivative (x > 0) turns that into a NaN gradient or a 0: undetermined, though a comparison stands
    between the sum and the result."""
    outcome = fuzz.run_case(fuzz_cases.draw_case(seed, index))
    assert outcome.status == "ok", outcome.detail
