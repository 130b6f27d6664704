"""A contraction with a transposed weight (x @ W.T, PyTorch-style layers) gets the weight transposed once: capture
makes the transpose a node of its own, parameter-only when W is a declared parameter, and `prepare` computes it once
even where the plan is otherwise the original program (XLA:CPU runs a matrix-vector product with a transposed
weight several times slower than with a transposed copy: benches/RESULTS.md)."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat

W = jnp.asarray(np.random.default_rng(0).standard_normal((512, 128)), jnp.float32)  # (out, in)
FORMS: dict[str, tuple[Callable[[Any, Any], Any], tuple[int, ...]]] = {
    "x @ W.T": (lambda w, x: x @ w.T, (1, 128)),
    "einsum": (lambda w, x: jnp.einsum("bi,oi->bo", x, w), (2, 128)),
    "3-d x": (lambda w, x: jnp.tanh(x @ w.T), (1, 2, 128)),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_prepare_transposes_the_weight_once(form: str):
    fn, x_shape = FORMS[form]
    x = jnp.asarray(np.random.default_rng(1).standard_normal(x_shape), jnp.float32)
    fast = eqsat.optimize(fn, params_argnums=0)
    plan = fast.plan(W, x)
    assert [node.op for node in plan.nodes if node.parameter_only and node.op in ("MT", "Transpose")], plan.summary()
    prepared = fast.prepare(W)
    np.testing.assert_allclose(prepared(x), fn(W, x), rtol=1e-5, atol=1e-5)
    assert "transpose" not in str(jax.make_jaxpr(prepared)(x))  # the call itself reads the transposed copy
    # called directly the transpose is per-call work, and the plan is the original program
    assert fast.plan(W, x, prepared=False).unchanged
