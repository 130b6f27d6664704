"""One optimized function called from many threads at once, with old and new signatures."""

import collections
import threading
import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.checks import validate
from eqsat.planning import planner

# an unsound rule: every plan it rewrites must be caught by validation, in whichever thread runs it first
_BAD_RULE = '(rewrite (Tanh x) (Neg x) :name "bad-tanh")'


def _chain(a: Any, b: Any, v: Any) -> Any:
    return jnp.tanh((a @ b) @ v) + 1.0


def _hammer(fast: Any, sizes: list[int], threads: int = 4) -> tuple[list, list]:
    """Thread 0 loops over the first (cached) signature while the others call each new size together, released
    by a barrier. Returns the (thread, size) calls whose result was not the original's, and the errors."""
    rng = np.random.default_rng(0)
    args = {n: [rng.standard_normal(s).astype(np.float32) for s in ((n, n), (n, n), (n, 2))] for n in sizes}
    wrong, errors = [], []
    barrier = threading.Barrier(threads)

    def worker(k: int) -> None:
        try:
            for n in sizes[1:]:
                barrier.wait()
                m = n if k else sizes[0]
                if not np.allclose(fast(*args[m]), _chain(*args[m]), rtol=1e-3, atol=1e-2):
                    wrong.append((k, m))
        except Exception as error:  # reported, not lost in the thread
            errors.append(repr(error))

    fast(*args[sizes[0]])
    workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return wrong, errors


@pytest.mark.parametrize("rules", [None, _BAD_RULE], ids=["sound", "unsound-rule"])
def test_threads_get_correct_results_and_each_plan_is_built_and_validated_once(
    rules: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds, compares, foreign = collections.Counter(), collections.Counter(), []
    build, compare = planner.Planner.build, validate.results

    def counted_build(self: Any, signature: Any, prepared: bool) -> Any:
        builds[signature.avals[0].shape] += 1
        return build(self, signature, prepared)

    def counted_compare(entry: Any, flat: Any, got: Any, narrow: Any = None) -> Any:
        shape = entry.signature.avals[0].shape
        compares[shape] += 1
        if flat is None or tuple(flat[0].shape) != shape:  # every call here has concrete arguments of its own
            foreign.append(shape)
        return compare(entry, flat, got, narrow)

    monkeypatch.setattr(planner.Planner, "build", counted_build)
    monkeypatch.setattr(validate, "results", counted_compare)
    fast = eqsat.optimize(_chain, rules=rules, limits=eqsat.Limits(blame_seconds=0, measure_seconds=0))
    sizes = list(range(40, 72, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eqsat.EqsatWarning)  # the unsound rule's fallbacks
        wrong, errors = _hammer(fast, sizes)
    assert not errors and not wrong
    assert set(builds) == {(n, n) for n in sizes} and set(builds.values()) == {1}
    assert compares == builds and not foreign
    plans = [fast.plan(*(np.zeros(s, np.float32) for s in ((n, n), (n, n), (n, 2)))) for n in sizes]
    if rules is None:
        assert all(p.rewritten_ops() and p.fallback is None for p in plans)
    else:
        assert all("differed from the original" in p.fallback for p in plans)


@pytest.mark.parametrize("rules", [None, _BAD_RULE], ids=["sound", "unsound-rule"])
def test_threads_get_correct_results_while_plans_are_built_in_the_background(rules):
    """With background=True, every call runs the original or a validated plan, whichever thread's call switches.
    Kernels priced by roofline: timed while the threads run, they would follow the load."""
    sizes = list(range(40, 72, 8))
    limits = eqsat.Limits(blame_seconds=0, measure_seconds=0)
    fast = eqsat.optimize(_chain, rules=rules, background=True, limits=limits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eqsat.EqsatWarning)
        wrong, errors = _hammer(fast, sizes)
        assert not errors and not wrong
        plans = [fast.plan(*(np.zeros(s, np.float32) for s in ((n, n), (n, n), (n, 2)))) for n in sizes]
        wrong, errors = _hammer(fast, sizes)  # the plans are ready now: the calls switch to them
        assert not errors and not wrong
    if rules is None:
        assert all(p.rewritten_ops() and p.fallback is None for p in plans)
    else:
        assert all("differed from the original" in p.fallback for p in plans)
