"""Repeated layers are planned once (eqsat/planning/repeats.py): found in the captured graph, planned as one block, and
copied into every layer, with each layer's own inputs and provenance, and the same results as jax.jit."""

import jax
import jax.numpy as jnp
import numpy as np

import eqsat
from eqsat.capture.jaxpr import capture
from eqsat.planning import repeats

D = 32


def _layer(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """Attention and a feed-forward whose x @ w1 + x @ w2 distributivity makes one GEMM."""
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    x = x + jax.nn.softmax(q @ k.T / np.sqrt(D), axis=-1) @ v
    return x + jax.nn.relu(x @ p["w1"] + x @ p["w2"]) @ p["w3"]


def _model(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for k, p in enumerate(params):
        with jax.named_scope(f"layer_{k}"):
            x = _layer(x, p)
    return jnp.tanh(x)


def _params(n: int) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(jax.random.key(0), 5 * n).reshape(n, 5)
    names = ("wq", "wk", "wv", "w1", "w2", "w3")
    return [
        {name: jax.random.normal(jax.random.fold_in(keys[k, 0], i), (D, D)) / D for i, name in enumerate(names)}
        for k in range(n)
    ]


X = jax.random.normal(jax.random.key(1), (8, D))
UNGUARDED = eqsat.Limits(guard_seconds=0)  # what runs is the plan, not whichever timed faster


def _graph(fn, *args):
    return capture(jax.make_jaxpr(fn)(*args))


def _distributed(plan: eqsat.Plan) -> list[int]:
    """Plan nodes of the rewrite x @ (w1 + w2): a rewritten Dot reading a rewritten sum of two weights."""

    def sum_of_weights(node) -> bool:
        return node.op == "Add" and node.rewritten and all(plan.nodes[j].op == "Var" for j in node.inputs)

    return [
        k
        for k, node in enumerate(plan.nodes)
        if node.op == "Dot" and node.rewritten and sum_of_weights(plan.nodes[node.inputs[1]])
    ]


def test_the_layers_of_a_loop_are_found_with_their_wiring():
    graph = _graph(_model, _params(6), X)
    (repeat,) = repeats.find(graph)
    assert len(repeat.instances) == 6
    period = len(repeat.instances[0])
    assert period >= repeats.MIN_NODES and all(len(block) == period for block in repeat.instances)
    # each layer reads its own six weights, and its own input: the previous layer's result
    weights = set(graph.inputs[:-1])  # the flat inputs: the parameters' leaves, then x
    read = [set(row) & weights for row in repeat.inputs]
    assert all(len(w) == 6 for w in read) and len(set().union(*read)) == 36
    for k in range(1, 6):
        assert set(repeat.inputs[k]) & set(repeat.instances[k - 1]), "a layer reads the one before"


def test_too_few_layers_are_planned_as_one_program():
    assert repeats.find(_graph(_model, _params(repeats.MIN_INSTANCES - 1), X)) == []


def test_a_chain_of_matmuls_is_not_cut_into_blocks():
    """Its period is one op: the chain pass must see the chain whole to order it."""
    mats = [jax.random.normal(jax.random.key(k), (16, 16)) for k in range(40)]

    def chain(*ms):
        out = ms[0]
        for m in ms[1:]:
            out = out @ m
        return out

    assert repeats.find(_graph(chain, *mats)) == []


def test_every_layer_gets_its_rewrite_with_its_own_provenance(monkeypatch):
    params = _params(6)
    plan = eqsat.optimize(_model).plan(params, X)
    assert plan.stats["repeated_layers"] == 6
    found = _distributed(plan)
    assert len(found) == 6
    for k, j in enumerate(found):  # each copy names its own layer, as the rewrite it stands for does
        assert plan.nodes[j].scopes and all(f"layer_{k}" in scope for scope in plan.nodes[j].scopes)
    # the same plan as saturating the whole program would make, at no greater predicted cost
    monkeypatch.setattr(repeats, "MIN_INSTANCES", 10**9)
    whole_plan = eqsat.optimize(lambda p, x: _model(p, x)).plan(params, X)  # not the plan kept for _model
    assert "repeated_layers" not in whole_plan.stats
    assert plan.predicted.seconds <= whole_plan.predicted.seconds * 1.01
    assert plan.original == whole_plan.original, "the original is priced as it is without repeats"


def test_the_composed_plan_computes_what_jax_jit_does():
    params = _params(6)
    fast = eqsat.optimize(_model, limits=UNGUARDED)
    np.testing.assert_allclose(fast(params, X), jax.jit(_model)(params, X), rtol=2e-5, atol=2e-5)
    assert fast.plan(params, X).fallback is None


def test_prepared_layers_keep_their_weight_sums_once():
    params = _params(5)
    fast = eqsat.optimize(_model, params_argnums=0, limits=UNGUARDED)
    run = fast.prepare(params)
    np.testing.assert_allclose(run(X), jax.jit(_model)(params, X), rtol=2e-5, atol=2e-5)
    plan = fast.plan(params, X)
    assert plan.stats["repeated_layers"] == 5
    sums = [plan.nodes[plan.nodes[k].inputs[1]] for k in _distributed(plan)]
    assert len(sums) == 5 and all(node.parameter_only for node in sums)


def test_a_gradient_of_repeated_layers_matches_jax_jit():
    params = _params(5)

    def loss(params, x):
        return jnp.sum(_model(params, x) ** 2)

    grad = jax.grad(loss)
    fast = eqsat.optimize(grad, limits=UNGUARDED)
    plan = fast.plan(params, X)
    assert plan.stats["repeated_layers"] >= 8  # the forward layers and the backward ones
    got, want = fast(params, X), jax.jit(grad)(params, X)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert plan.fallback is None


def test_cells_whose_contractions_share_an_input_are_planned_as_one_program(monkeypatch):
    """A recurrent cell reads its shared weight at every step: merging the steps' input GEMMs is a rewrite across
    layers, which planning one block would miss."""
    w, u = jax.random.normal(jax.random.key(2), (2, D, D)) / D

    def rnn(xs, h):
        for x in xs:
            h = jnp.tanh(x @ w + h @ u + jnp.sin(h) * jnp.cos(x) - jnp.exp(-jnp.abs(h)))
        return h

    xs = list(jax.random.normal(jax.random.key(3), (6, 8, D)))
    graph = _graph(rnn, xs, X)
    assert repeats.find(graph) == []
    monkeypatch.setattr(repeats, "_merges_across", lambda graph, instances: False)
    assert len(repeats.find(graph)) == 1, "the steps do repeat: the shared weight alone keeps them whole"
