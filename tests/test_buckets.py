"""optimize(f, buckets=...): sizes between buckets share one plan, results sliced back, rows checked independent."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.capture.rows import RowsMixed, row_axes


def _mlp(params, x):
    for w in params:
        x = jax.nn.relu(x @ w)
    return x, jnp.sum(params[0])  # a result without the batch axis comes back as it is


_PARAMS = [jnp.asarray(np.random.default_rng(k).standard_normal((8, 8)).astype(np.float32)) for k in range(2)]


def _x(n):
    return jnp.asarray(np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32))


def _warnings_of(call):
    """The EqsatWarnings call() raises, as messages."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if issubclass(w.category, eqsat.EqsatWarning)]


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
    def mean_centred(x):
        return x - jnp.mean(x, axis=0)  # the mean counts the padding rows: not row-independent

    fast = eqsat.optimize(mean_centred, buckets=eqsat.Buckets((8,)))
    assert len(_warnings_of(lambda: fast(_x(5)))) == 1
    np.testing.assert_allclose(fast(_x(5)), mean_centred(_x(5)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast(_x(6)), mean_centred(_x(6)), rtol=1e-5, atol=1e-6)  # the bucket runs unpadded


def test_rows_are_decided_from_the_program_not_the_first_call():
    """Issue 24 item 2: the zero padding wins the max of negative rows, which a first call of positive rows did not
    show."""
    fast = eqsat.optimize(lambda x: x - jnp.max(x, 0), buckets=eqsat.Buckets((8, 16)))

    def calls():
        for x in (jnp.abs(_x(5)), -jnp.abs(_x(6)), -jnp.abs(_x(11))):
            np.testing.assert_allclose(fast(x), x - jnp.max(x, 0), rtol=1e-6)

    messages = _warnings_of(calls)
    assert len(messages) == 1 and "reduce_max" in messages[0] and "test_buckets.py" in messages[0], messages


@pytest.mark.parametrize("first", ["jit", "vmap", "grad"])
def test_rows_are_decided_however_the_first_call_is_made(first):
    """Issue 24 item 3: under an outer jax.jit the first call's values are tracers, which nothing checked."""

    def centred(x):
        return x - x.mean(0)

    fast = eqsat.optimize(centred, buckets=eqsat.Buckets((8,)))
    xs = jnp.stack([_x(5), -_x(5)])
    calls = {
        "jit": (jax.jit(fast), jax.jit(centred), _x(5)),
        "vmap": (jax.vmap(fast), jax.vmap(centred), xs),
        "grad": (jax.grad(lambda x: jnp.sum(fast(x) ** 3)), jax.grad(lambda x: jnp.sum(centred(x) ** 3)), _x(5)),
    }
    transformed, reference, x = calls[first]
    messages = _warnings_of(lambda: np.testing.assert_allclose(transformed(x), reference(x), rtol=1e-5, atol=1e-5))
    assert len(messages) == 1 and "reduce_sum" in messages[0], messages


def test_row_independent_programs_are_padded_under_transformations():
    fast = eqsat.optimize(_mlp, buckets=eqsat.Buckets((8,), argnums=(1,)))
    loss = lambda f: lambda p, x: jnp.sum(f(p, x)[0] ** 2)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", eqsat.EqsatWarning)  # rows kept apart: no warning
        got = jax.grad(loss(fast), argnums=1)(_PARAMS, _x(3))
        np.testing.assert_allclose(got, jax.grad(loss(_mlp), argnums=1)(_PARAMS, _x(3)), rtol=2e-3, atol=1e-4)
        np.testing.assert_allclose(fast(_PARAMS, _x(5))[0], _mlp(_PARAMS, _x(5))[0], rtol=2e-3, atol=1e-4)
    assert fast.cache_info()["plans"] == 1  # sizes 3 and 5 (under grad and eagerly) share the bucket's plan


def test_static_and_keyword_arguments():
    """Issue 24 item 6: static_argnums raised TracerBoolConversionError on the first call, a bucketed argument
    passed by keyword a ValueError."""

    def layer(w, x, activate):
        y = x @ w
        return jnp.tanh(y) if activate else y

    w = _PARAMS[0]
    by_number = eqsat.optimize(layer, static_argnums=2, buckets=eqsat.Buckets((8,), argnums=1))
    by_name = eqsat.optimize(layer, static_argnames="activate", buckets=eqsat.Buckets((8,), argnums=1))
    for fast in (by_number, by_name):
        for n, activate in ((3, True), (5, True), (5, False)):
            want = layer(w, _x(n), activate)
            np.testing.assert_allclose(fast(w, _x(n), activate), want, rtol=2e-3, atol=1e-4)
            np.testing.assert_allclose(fast(w, x=_x(n), activate=activate), want, rtol=2e-3, atol=1e-4)
        assert fast.plan(w, x=_x(3), activate=True).graph.nodes[1].shape == (8, 8)  # padded by keyword too
    with pytest.raises(ValueError, match="static"):
        eqsat.optimize(layer, static_argnums=1, buckets=eqsat.Buckets((8,), argnums=1))


def test_a_contracted_axis_runs_unpadded_with_a_warning():
    """Issue 24 item 6: Buckets(axis=1) on a contracted axis raised jax's dot_general TypeError."""
    w = jnp.ones((5, 4), jnp.float32)
    fast = eqsat.optimize(lambda x, w: x @ w, buckets=eqsat.Buckets((8,), axis=1))
    gram = eqsat.optimize(lambda x: x @ x.T, buckets=eqsat.Buckets((8,), axis=1))
    x = _x(3)[:, :5]
    messages = _warnings_of(lambda: np.testing.assert_allclose(fast(x, w), x @ w, rtol=1e-5))
    messages += _warnings_of(lambda: np.testing.assert_allclose(gram(x), x @ x.T, rtol=1e-5))
    assert len(messages) == 2 and "dot_general" in messages[0] and "contracts the batch axis" in messages[1]


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
    with pytest.raises(ValueError, match=r"argument 1 \(x\)\[0\] has shape \(3, 8\), which has no axis 2"):
        eqsat.optimize(_mlp, buckets=eqsat.Buckets((8,), argnums=(1,), axis=2))(_PARAMS, [_x(3)])


_W = jnp.ones((8, 3), jnp.float32)
_ROWS = {  # program of x (rows along axis 0) -> where its result carries the rows, or the op that mixes them
    "matmul": (lambda x: jnp.tanh(x @ _W), 0),
    "transposed": (lambda x: (x @ _W).T, 1),
    "columns cumulated": (lambda x: jnp.cumsum(x, 1), 0),
    "columns sorted": (lambda x: jnp.sort(x, 1), 0),
    "columns gathered": (lambda x: x[:, jnp.array([0, 2])], 0),
    "along rows": (lambda x: jnp.take_along_axis(x, jnp.argsort(x, 1), 1), 0),
    "row index": (lambda x: x + jnp.arange(x.shape[0])[:, None], 0),
    "reshaped within rows": (lambda x: x.reshape(x.shape[0], 2, 4).sum(2), 0),
    "scan over columns": (lambda x: jax.lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(x.shape[0]), x.T)[1], 1),
    "while": (lambda x: jax.lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) + x, x), 0),
    "cond": (lambda x: jax.lax.cond(True, jnp.sin, jnp.cos, x), 0),
    "nested jit": (lambda x: jax.jit(jax.nn.relu)(x), 0),
    "pooled within rows": (lambda x: jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2), (1, 1), "SAME"), 0),
    "a column set": (lambda x: x.at[:, 1].set(x[:, 0]), 0),
    "a constant of rows": (lambda x: x + np.arange(x.shape[0], dtype=np.float32)[:, None], 0),
    "a weight reduced": (lambda x: x + jnp.sum(_W), 0),
    "rows reduced": (lambda x: x - x.mean(0), "reduce_sum"),
    "rows cumulated": (lambda x: jnp.cumsum(x, 0), "cumsum"),
    "rows sorted": (lambda x: jnp.sort(x, 0), "sort"),
    "rows reversed": (lambda x: x[::-1], "rev"),
    "rows gathered by lax": (lambda x: jax.lax.dynamic_slice_in_dim(x, 1, 2), "dynamic_slice"),
    "a row taken": (lambda x: x[0], "slice"),
    "rows gathered": (lambda x: x[jnp.array([1, 0])], "takes the batch length"),  # negative indices wrap at it
    "rows contracted": (lambda x: x.T @ x, "dot_general"),
    "rows paired": (lambda x: x @ x.T, "dot_general"),
    "rows pooled": (lambda x: jax.lax.reduce_window(x, 0.0, jax.lax.add, (2, 1), (1, 1), "SAME"), "reduce_window_sum"),
    "a row set": (lambda x: x.at[1].set(x[0]), "slice"),
    "a row added to": (lambda x: x.at[0].add(1.0), "scatter-add"),
    "the length in a constant": (lambda x: x + np.full(8, x.shape[0], np.float32), "constant"),
    "rows flattened": (lambda x: x.reshape(-1), "reshape"),
    "scan over rows": (lambda x: jax.lax.scan(lambda c, r: (c + r, c), jnp.zeros(8), x)[1], "scan"),
    "the length as a number": (lambda x: x * x.shape[0], "mul"),
    "a random draw of the batch's shape": (lambda x: x + jax.random.normal(jax.random.key(0), x.shape), "random"),
    "the length in a loop": (lambda x: jax.lax.fori_loop(0, 2, lambda i, c: c + jnp.sum(c, 0), x), "reduce_sum"),
}


@pytest.mark.parametrize("name", _ROWS)
def test_where_rows_are_kept_apart(name):
    fun, expected = _ROWS[name]
    small, large = (jax.make_jaxpr(fun)(jax.ShapeDtypeStruct((n, 8), jnp.float32)) for n in (8, 9))
    if isinstance(expected, int):
        assert row_axes(small, large, [0], 8) == [expected]
    else:
        with pytest.raises(RowsMixed, match=expected):
            row_axes(small, large, [0], 8)


def test_every_method_of_the_optimized_function_takes_the_padded_call():
    """Buckets are an option of the one front (issue 44 item 3): lower, trace, eval_shape, plan, prepare, memory,
    profile and method binding see the call as its bucket pads it; a call's results come back sliced."""
    fast = eqsat.optimize(_mlp, params_argnums=0, buckets=eqsat.Buckets((8,), argnums=1))
    assert isinstance(fast, eqsat.Optimized)
    x = _x(5)
    want = _mlp(_PARAMS, x)
    shapes = fast.eval_shape(_PARAMS, x)
    assert shapes[0].shape == (5, 8) and shapes[1].shape == ()
    assert "8x8" in fast.lower(_PARAMS, x).as_text() and fast.trace(_PARAMS, x).jaxpr.in_avals[-1].shape == (8, 8)
    assert fast.plan(_PARAMS, x).graph.nodes[2].shape == (8, 8)
    prepared = fast.prepare(_PARAMS)
    np.testing.assert_allclose(prepared(x)[0], want[0], rtol=2e-3, atol=1e-4)
    assert prepared(x)[0].shape == (5, 8)
    assert fast.memory(_PARAMS, x).planned_peak > 0
    assert fast.cache_info()["plans"] >= 1

    class Layer:
        weights = _PARAMS

        @eqsat.optimize(static_argnums=0, buckets=eqsat.Buckets((8,), argnums=1))
        def __call__(self, x):
            return _mlp(self.weights, x)[0]

    np.testing.assert_allclose(Layer()(x), want[0], rtol=2e-3, atol=1e-4)
    fast.clear_cache()
    assert fast.cache_info()["plans"] == 0
