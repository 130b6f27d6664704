"""Whole contraction chains get the order of fewest flops, and sums of contractions sharing an operand are
factored, however long, with the e-graph staying small (eqsat/egraph/chains.py)."""

import functools
import operator
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.egraph.chains import chain_order


def _chain_flops(shapes, split, lo, hi):
    """Multiply-adds of the order `split` gives (lo..hi), and the shape of its result."""
    if lo == hi:
        return 0, shapes[lo]
    k = split[lo, hi]
    left_flops, left = _chain_flops(shapes, split, lo, k)
    right_flops, right = _chain_flops(shapes, split, k + 1, hi)
    out = (*left[:-1], *right[1:])
    return left_flops + right_flops + int(np.prod(out)) * left[-1], out


def _brute_force(shapes, lo, hi):
    """The fewest multiply-adds over every parenthesization, and the result's shape."""
    if lo == hi:
        return 0, shapes[lo]
    best = None
    for k in range(lo, hi):
        (fl, left), (fr, right) = _brute_force(shapes, lo, k), _brute_force(shapes, k + 1, hi)
        out = (*left[:-1], *right[1:])
        cost = fl + fr + int(np.prod(out)) * left[-1]
        best = cost if best is None else min(best, cost)
    return best, out


@pytest.mark.parametrize("seed", range(20))
def test_chain_order_matches_brute_force(seed):
    """Random chains of 2-7 operands, with vectors (or higher-rank tensors) at either end and a free middle axis."""
    rng = random.Random(seed)
    n = rng.randint(2, 7)
    dims = [rng.choice([1, 2, 3, 8, 17, 64]) for _ in range(n + 1)]
    shapes = [(dims[i], dims[i + 1]) for i in range(n)]
    if rng.random() < 0.5:
        shapes[0] = shapes[0][1:]  # a vector first
    if rng.random() < 0.5:
        shapes[-1] = shapes[-1][:1]  # a vector last
    if rng.random() < 0.5:
        shapes[0] = (rng.choice([2, 5]), *shapes[0])  # a batch axis on the left operand
    if n >= 3 and rng.random() < 0.5:
        k = rng.randrange(1, n - 1)
        shapes[k] = (shapes[k][0], rng.choice([2, 3]), shapes[k][1])  # a middle operand with an extra free axis
    split = chain_order(shapes)
    assert _chain_flops(shapes, split, 0, n - 1)[0] == _brute_force(shapes, 0, n - 1)[0]


def _dot_flops(plan):
    """Multiply-adds of the plan's contractions, from the shapes of their inputs and results."""
    total = 0
    for node in plan.nodes:
        if node.op in ("Dot", "BatchDot"):
            total += int(np.prod(node.shape)) * plan.nodes[node.inputs[0]].shape[-1]
    return total


def _matrices(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32) / np.sqrt(s[0])) for s in shapes]


def _left_to_right(*operands):
    return functools.reduce(operator.matmul, operands)


@pytest.mark.parametrize(
    "shapes",
    [
        [(32, 32)] * 19 + [(32, 2)],  # 20 matrices ending in a thin one: right to left pays
        [(32,)] + [(32, 32)] * 18 + [(32, 48)],  # a vector first: left to right, as written
        [(4, 32, 32)] + [(32, 32)] * 18 + [(32,)],  # a batch of matrices times a chain ending in a vector
        [(32, 32)] * 6 + [(32, 2)] + [(2, 32)] + [(32, 32)] * 6 + [(32, 2)],  # thin in the middle: a split
    ],
    ids=["thin-end", "vector-first", "batched-vector-end", "thin-middle"],
)
def test_long_chains_get_the_fewest_flops(shapes):
    operands = _matrices(shapes)
    fast = eqsat.optimize(_left_to_right)
    np.testing.assert_allclose(fast(*operands), _left_to_right(*operands), rtol=2e-3, atol=1e-4)
    plan = fast.plan(*operands)
    assert plan.fallback is None or plan.unchanged
    best, _ = _brute_force_dp(shapes)
    assert _dot_flops(plan) == best


def _brute_force_dp(shapes):
    """The textbook O(n^3) programme, written out here on its own to check the pass's."""
    n = len(shapes)
    cost = {(i, i): (0, shapes[i]) for i in range(n)}
    for length in range(2, n + 1):
        for lo in range(n - length + 1):
            hi = lo + length - 1
            options = []
            for k in range(lo, hi):
                (fl, left), (fr, right) = cost[lo, k], cost[k + 1, hi]
                out = (*left[:-1], *right[1:])
                options.append((fl + fr + int(np.prod(out)) * left[-1], out))
            cost[lo, hi] = min(options)
    return cost[0, n - 1]


def test_batched_chain_is_ordered():
    shapes = [(3, 64, 64)] * 11 + [(3, 64, 1)]  # at 16x16 each product costs its launch alone: any order will do
    operands = _matrices(shapes)
    fast = eqsat.optimize(_left_to_right)
    np.testing.assert_allclose(fast(*operands), _left_to_right(*operands), rtol=2e-3, atol=1e-4)
    assert _dot_flops(fast.plan(*operands)) == 11 * 3 * 64 * 64  # every product a matrix times a vector


def test_chain_of_50_keeps_the_egraph_small():
    operands = _matrices([(64, 64)] * 49 + [(64, 1)])
    plan = eqsat.optimize(_left_to_right).plan(*operands)
    assert _dot_flops(plan) == 49 * 64 * 64
    assert plan.stats["enodes"] < 2_000  # the chain's 99 nodes, its best order, and what the rules add around it


def test_sum_of_30_products_sharing_an_operand_is_factored():
    x, *weights = _matrices([(64, 32)] + [(32, 32)] * 30)

    def f(x, *weights):
        return functools.reduce(operator.add, [x @ w for w in weights])

    fast = eqsat.optimize(f)
    np.testing.assert_allclose(fast(x, *weights), f(x, *weights), rtol=2e-3, atol=1e-3)
    plan = fast.plan(x, *weights)
    assert sum(node.op == "Dot" for node in plan.nodes) == 1
    assert plan.rules_fired.get("dot-factor-left", 0) >= 1


def test_sum_groups_by_the_operand_that_pays():
    """Terms sharing a right operand and terms sharing a left one: each group factored, leftovers kept."""
    a, b, c, w, x = _matrices([(64, 32), (64, 32), (64, 32), (32, 16), (64, 64)])
    v1, v2 = _matrices([(64, 16), (64, 16)], seed=1)

    def f(a, b, c, w, x, v1, v2):
        return a @ w + b @ w + c @ w + x @ v1 + x @ v2 + jnp.ones((64, 16))

    args = (a, b, c, w, x, v1, v2)
    fast = eqsat.optimize(f)
    np.testing.assert_allclose(fast(*args), f(*args), rtol=2e-3, atol=1e-3)
    assert sum(node.op == "Dot" for node in fast.plan(*args).nodes) == 2


def test_disabled_algebra_orders_nothing():
    operands = _matrices([(32, 32)] * 19 + [(32, 2)])
    plan = eqsat.optimize(_left_to_right, disabled_rules=("algebra",)).plan(*operands)
    assert plan.unchanged and "dot-assoc-right" not in plan.rules_fired


def test_shared_intermediate_bounds_the_chain():
    """A product used twice is computed once; the chains on either side of it are ordered on their own."""
    a, b, c, v = _matrices([(32, 32), (32, 32), (32, 32), (32, 1)])

    def f(a, b, c, v):
        ab = a @ b
        return (ab @ c) @ v, ab

    fast = eqsat.optimize(f)
    for got, want in zip(fast(a, b, c, v), f(a, b, c, v), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-4)


def test_chain_under_grad_matches():
    """The pass runs on a gradient's chains too, and the result stays the gradient's."""
    shapes = [(16, 16)] * 9 + [(16, 1)]
    operands = _matrices(shapes)

    def loss(*ms):
        return jnp.sum(_left_to_right(*ms) ** 2)

    grad = jax.grad(loss, argnums=tuple(range(len(shapes))))
    fast = eqsat.optimize(grad)
    for got, want in zip(fast(*operands), grad(*operands), strict=True):
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=1e-4)


SUMS = {  # a sum of x @ w over the weights as people write it
    "python-sum": lambda x, ws: sum(x @ w for w in ws),  # starts from the integer 0: `0 + x@w0 + ...`
    "reduce": lambda x, ws: functools.reduce(operator.add, [x @ w for w in ws]),
    "reduce-from-0": lambda x, ws: functools.reduce(operator.add, [x @ w for w in ws], 0),
    "reduce-from-zeros": lambda x, ws: functools.reduce(operator.add, [x @ w for w in ws], jnp.zeros((64, 32))),
    "zeros-like": lambda x, ws: sum((x @ w for w in ws), jnp.zeros_like(x @ ws[0])),
    "stack-sum": lambda x, ws: jnp.sum(jnp.stack([x @ w for w in ws]), 0),
}


@pytest.mark.parametrize("form", SUMS)
@pytest.mark.parametrize("stacked", [False, True], ids=["list", "array"])
def test_sums_as_people_write_them_are_factored(form, stacked):
    """Python's sum(), functools.reduce (from 0, from zeros or from the first term) and jnp.sum of a stack, over a
    list of weights or the rows of one array (jax's unstack): one contraction, the result unchanged."""
    x, *weights = _matrices([(64, 32)] + [(32, 32)] * 12)
    ws = jnp.stack(weights) if stacked else weights

    def f(x, ws):
        return SUMS[form](x, ws)

    fast = eqsat.optimize(f)
    np.testing.assert_allclose(fast(x, ws), f(x, ws), rtol=2e-3, atol=1e-3)
    plan = fast.plan(x, ws)
    assert plan.fallback is None
    assert sum(node.op == "Dot" for node in plan.nodes) == 1
    assert plan.rules_fired.get("dot-factor-left", 0) >= 1


@pytest.mark.parametrize(
    "start",
    [lambda: jnp.ones((64, 32)), lambda: 0.5, lambda: jnp.zeros((2, 64, 32))],
    ids=["ones", "scalar-half", "zeros-broadcast-wider"],
)
def test_a_start_that_is_not_an_identity_is_kept(start):
    """Only zeros of the sum's own shape (or a scalar zero) are dropped: a nonzero start stays a term, and a zero
    array that broadcasts the terms wider leaves the sum as it is."""
    x, *weights = _matrices([(64, 32)] + [(32, 32)] * 4)

    def f(x, *ws):
        return sum((x @ w for w in ws), start())

    fast = eqsat.optimize(f)
    np.testing.assert_allclose(fast(x, *weights), f(x, *weights), rtol=2e-3, atol=1e-3)
