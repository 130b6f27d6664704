"""Lowering contracts merged axes in place (backends/merged_contractions.py): capture's flattened dot_generals come
back as one dot_general of the unmerged operands, with the same values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.backends.lower import lower

NOTHING_REWRITTEN = ("stable", "fusion", "layout", "losses", "algebra")
RNG = np.random.default_rng(0)


def _array(*shape: int) -> jax.Array:
    return jnp.asarray(RNG.normal(size=shape), jnp.float32)


def _lowered(fn, *args):
    plan = eqsat.optimize(fn, disabled_rules=NOTHING_REWRITTEN).plan(*args)
    run = lower(plan)
    return run, jax.make_jaxpr(lambda *a: run(*a))(*args).jaxpr


def _dimension_numbers(jaxpr) -> list[tuple]:
    return [eqn.params["dimension_numbers"][0] for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general"]


def _count(jaxpr, primitive: str) -> int:
    return sum(eqn.primitive.name == primitive for eqn in jaxpr.eqns)


def test_a_weight_gradient_contracts_the_batch_and_time_axes_in_place() -> None:
    """Capture writes it as Dot(MT(Reshape(x)), Reshape(dy)); lowered, neither reshape nor the MT is left."""
    w, x = _array(16, 8), _array(4, 6, 16)
    grad = jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2))
    run, jaxpr = _lowered(grad, w, x)
    assert ((0, 1), (0, 1)) in _dimension_numbers(jaxpr)
    assert _count(jaxpr, "reshape") == 0
    np.testing.assert_allclose(run(w, x)[0], grad(w, x), rtol=1e-5, atol=1e-5)


def _nt_product(x, y):
    """x[5, 4, 6] merged to rows, y[3, 4, 6] too, contracted over its second axis: Reshape(x) . MT(Reshape(y))."""
    return lax.dot_general(x.reshape(5, 24), y.reshape(3, 24), (((1,), (1,)), ((), ())))


@pytest.mark.parametrize(
    "fn, shapes",
    [
        # trailing axes of x, leading of y: Reshape(x) . Reshape(y)
        (lambda x, y: jnp.tensordot(x, y, ((1, 2), (0, 1))), ((5, 4, 6), (4, 6, 3))),
        # y's axes in another order: transposed first, then merged
        (lambda x, y: jnp.tensordot(x, y, ((0, 1), (1, 0))), ((4, 6, 5), (6, 4, 3))),
        (_nt_product, ((5, 4, 6), (3, 4, 6))),
    ],
)
def test_every_merging_form_contracts_in_place_with_the_same_values(fn, shapes) -> None:
    x, y = _array(*shapes[0]), _array(*shapes[1])
    run, jaxpr = _lowered(lambda x, y: jnp.tanh(fn(x, y)), x, y)
    assert _count(jaxpr, "reshape") == 0
    assert [len(lhs) for lhs, _ in _dimension_numbers(jaxpr)] == [2]
    np.testing.assert_allclose(run(x, y)[0], jnp.tanh(fn(x, y)), rtol=1e-5, atol=1e-5)


def test_a_view_another_node_reads_stays_and_the_product_still_contracts_in_place() -> None:
    """The flattened x is a result too: it is computed, and the product reads x unmerged all the same."""
    x, y = _array(4, 6, 5), _array(4, 6, 3)

    def fn(x, y):
        return jnp.tensordot(x, y, ((0, 1), (0, 1))), jnp.sin(x.reshape(24, 5))

    run, jaxpr = _lowered(fn, x, y)
    assert _count(jaxpr, "reshape") == 1 and ((0, 1), (0, 1)) in _dimension_numbers(jaxpr)
    for got, want in zip(run(x, y), fn(x, y), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_groupings_that_differ_stay_merged() -> None:
    """x's contracted axes (4, 6) against y's (24,): one dot_general cannot pair them, the product stays flat."""
    x, y = _array(4, 6, 5), _array(24, 3)
    fn = lambda x, y: jnp.tensordot(x, y.reshape(4, 6, 3), ((0, 1), (0, 1)))  # noqa: E731
    run, jaxpr = _lowered(lambda x, y: jnp.tensordot(x.reshape(24, 5), y, ((0,), (0,))), x, y)
    assert [len(lhs) for lhs, _ in _dimension_numbers(jaxpr)] == [1]
    np.testing.assert_allclose(run(x, y)[0], fn(x, y), rtol=1e-5, atol=1e-5)
