"""User rules are data: bounded by the limits, checked by validation, blamed by name when wrong."""

import time

import jax
import jax.numpy as jnp
import numpy as np

import eqsat
from eqsat.capture import capture
from eqsat.rules import RuleSource, collect
from eqsat.saturate import saturate

NEVER_SATURATES = "(rule ((= e (Exp x))) ((union e (Exp (Neg (Neg x))))){ruleset})"


def test_an_analysis_that_never_saturates_stops_at_the_limits():
    # only the op table can add to the analysis (a user's :ruleset is refused), but the analysis is bounded as the
    # rewrites are: saturated one iteration at a time, the limits checked between iterations
    graph = capture(jax.make_jaxpr(lambda x: jnp.exp(x) * 2.0)(jnp.ones(4)))
    endless = RuleSource("endless", "<endless>", NEVER_SATURATES.format(ruleset=" :ruleset analysis"))
    for limits, reason in [(eqsat.Limits(seconds=0.5, nodes=10**7), "seconds"), (eqsat.Limits(nodes=2000), "nodes")]:
        start = time.perf_counter()
        snapshot = saturate(graph, [*collect(), endless], limits)
        assert snapshot.stop_reason == reason
        assert time.perf_counter() - start < limits.seconds + 1.0


def test_a_user_rule_that_never_saturates_returns_within_the_limit():
    fast = eqsat.optimize(
        lambda x: jnp.exp(x) * 2.0, rules=NEVER_SATURATES.format(ruleset=""), limits=eqsat.Limits(seconds=1.0)
    )
    start = time.perf_counter()
    np.testing.assert_allclose(fast(jnp.ones(4)), np.exp(1.0) * 2.0, rtol=1e-6)
    assert time.perf_counter() - start < 4.0  # the limit, extraction and two compilations
