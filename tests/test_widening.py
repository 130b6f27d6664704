"""The float64 reference validation judges accuracy against (eqsat/numerics/widening.py): programs with float32
constants, scatters and loops evaluated in float64, their own bfloat16 quantization kept."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat.numerics.widening import widened

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


def test_an_exact_result_the_float64_evaluation_rounds_to_zero_is_accepted():
    # fuzz seed 2037 case 6187: log(sum(exp(x))) of x near 1e-31 inside jax.checkpoint is 0 in float32 and in float64
    # (exp(x) rounds to 1); eqsat's stable logsumexp gives x itself, exactly. The float64 reference is blurred there
    # by its own rounding (about 2e-16: exp's result an ulp up moves the log by that), which the plan's error of 1e-31
    # is far within; an error of 1e-3 is not
    from eqsat.numerics.tolerance import beyond_conditioning, less_accurate

    x = jnp.asarray([[2.23e-31], [-1.3e-31], [5e-33]], jnp.float32)
    original = jax.jit(jax.checkpoint(lambda x: [jnp.log(jnp.sum(jnp.exp(x), -1))]))
    want = [np.asarray(original(x)[0])]
    assert np.all(want[0] == 0)
    for got, accepted in (([np.asarray(x[:, 0])], True), ([np.full(3, 1e-3, np.float32)], False)):
        unjudged = beyond_conditioning(original, [x], want, got)
        assert unjudged is not None  # the inputs' rounding moves the original not at all
        assert (less_accurate(original, [x], want, got, unjudged) is None) == accepted


def test_rounding_at_random_moves_every_operation_in_loop_and_checkpoint_bodies_too():
    def program(x):
        body = jax.checkpoint(lambda c, v: (c + jnp.exp(v), None))
        return [lax.scan(body, jnp.zeros(()), x)[0] - 3.0]

    x = jnp.zeros(3, jnp.float32)  # exp(0) = 1 three times: 3 - 3 = 0 exactly, unless a sum rounds otherwise
    eps = float(jnp.finfo(jnp.float32).eps)
    with jax.enable_x64(True):
        (plain,) = widened(program, [x], F64)
        moved = [float(widened(program, [x], F64, eps, seed)[0]) for seed in range(3)]
    assert float(plain) == 0 and all(0 < abs(m) < 10 * eps for m in moved)  # an ulp of float32 each, not of float64


def test_two_products_that_cancel_are_undetermined_by_their_rounding():
    # fuzz seed 2046 case 1024: a second derivative of log_softmax at logits of 1e30 cancels two products of 6e31 to
    # exactly 0 in float64, in jax.jit's program and in eager evaluation; the plan's program, fused otherwise by XLA,
    # gave -5.4e24 (one product contracted into an FMA: its rounding error) beside jax.jit's own 2.3e23 elsewhere.
    # Rounded at random at float32's precision, the cancellation shows how far float32 leaves it undetermined
    from eqsat.numerics.tolerance import less_accurate

    a = jnp.asarray([6.1e31, 3.0e31, -2.2e31], jnp.float32)
    c = jnp.asarray([1.7, -0.3, 2.9], jnp.float32)
    original = jax.jit(lambda a, c: [a * c - (a * c) * jnp.exp(a - a)])  # exp(0) = 1: 0 exactly
    want = [np.asarray(original(a, c)[0])]
    assert np.all(want[0] == 0)
    rounding_error = np.asarray([2.0e24, 0.0, -1.1e24], np.float32)  # below half an ulp of each product (4.8e24)
    wrong = np.asarray([5.4e30, 0.0, 0.0], np.float32)  # a term lost
    assert less_accurate(original, [a, c], want, [rounding_error], (0, "differs")) is None
    assert less_accurate(original, [a, c], want, [wrong], (0, "differs")) is not None


def test_bfloat16_inputs_and_loop_carries_are_widened():
    # numpy does not count bfloat16 as floating: before, a bfloat16 program's "float64" reference ran in bfloat16
    def program(x):
        return [lax.fori_loop(0, 2, lambda i, c: c + x * x, jnp.zeros_like(x))]

    x = jnp.asarray([1.0 + 2**-7, 3.0], jnp.bfloat16)  # x*x needs more bits than bfloat16's 8
    with jax.enable_x64(True):
        (y,) = widened(program, [x], F64)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, 2 * np.asarray(x, np.float64) ** 2)


def test_a_sum_that_can_overflow_midway_is_undetermined():
    # fuzz seed 2037 cases 8427 (a bfloat16 dot whose products overflow: XLA's FMA chain keeps the first one's sign)
    # and 9552 (a float16 window sum: -7984 from jax.jit at the top level, -inf from the same op in a while body)
    big = jnp.asarray([[3e38, 2e38, -3e38]], jnp.float32)
    window = lambda x: [lax.reduce_window(x, 0.0, lax.add, (3,), (3,), "VALID")]  # noqa: E731
    with jax.enable_x64(True):
        (dot,) = widened(lambda a: [a @ jnp.ones((3, 1), jnp.float32)], [big], F64)
        (pooled,) = widened(window, [jnp.asarray([4e4, 4e4, -6e4, 1, 2, 3], jnp.float16)], F64)
        dot, pooled = np.asarray(dot), np.asarray(pooled)
    assert np.isnan(dot).all()  # 2e38 whatever the order in float64; inf or 2e38 in float32 by the order
    assert np.isnan(pooled[0]) and pooled[1] == 6  # |terms| add up beyond float16's 65504 in the first window only


def test_what_an_undetermined_sum_decides_through_a_comparison_is_undetermined():
    # fuzz seed 2048 case 91: a dot of two products of 1e43 and -2e43 is -1e43 in float64, NaN (inf - inf) in one
    # float32 kernel and +inf in another (an FMA chain keeps the first overflow); relu's derivative of it is false
    # for NaN and -1e43 and true for +inf, so the gradient below is 0 or 1 by the kernel: NaN, not the marked 0
    x = jnp.asarray([[1e12, 1e12]], jnp.float32)
    w = jnp.asarray([[1e31], [-2e31]], jnp.float32)
    step = lambda x, w: [jnp.where(x @ w > 0, 1.0, 0.0), jnp.where(x[:, :1] > 0, 1.0, 0.0)]  # noqa: E731
    with jax.enable_x64(True):
        decided, plain = widened(step, [x, w], F64)
    assert np.isnan(np.asarray(decided)).all()
    np.testing.assert_array_equal(plain, [[1.0]])  # no undetermined sum on its way: determined


def test_a_sum_with_an_infinite_term_stays_determined():
    # masked log-probabilities: the sum is -inf in any order, and a plan that gave a finite value there would be wrong
    x = jnp.asarray([[-jnp.inf, 3e38, 1.0], [1.0, 2.0, 3.0]], jnp.float32)
    with jax.enable_x64(True):
        (total,) = widened(lambda x: [jnp.sum(x, axis=1)], [x], F64)
        total = np.asarray(total)
    np.testing.assert_array_equal(total, [-np.inf, 6.0])
