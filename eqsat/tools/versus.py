"""One workload optimized by eqsat and timed against jax.jit in the same process: what the demo, the suite and
the acceptance script all measure."""

from typing import Any

import jax

import eqsat
from eqsat.numerics import guard
from eqsat.numerics.measure import Comparison, interleaved
from eqsat.support.workload import Workload


def settled(fast: eqsat.Optimized, args: tuple) -> eqsat.Plan:
    """The plan for args once the guard has decided: called until live calls stop measuring it
    (eqsat/numerics/guard.py), so that what is timed next is what runs from then on, not the calls that take turns
    running both programs."""
    plan = fast.plan(*args)
    for _ in range(2 * guard.LIVE_ROUNDS):
        if not (plan.measured or {}).get("live"):
            break
        jax.block_until_ready(fast(*args))
    return plan


def ready(fast: eqsat.Optimized, args: tuple) -> eqsat.Plan:
    """The plan for args built here (a first call alone leaves a slow plan to the background), validated and timed
    against the original by a first call, and settled: what runs from then on."""
    fast.plan(*args)
    jax.block_until_ready(fast(*args))
    return settled(fast, args)


def against_jit(
    work: Workload, target: str = "cpu", prepared: bool = True, seconds: float = 2.0
) -> tuple[Comparison, eqsat.Optimized]:
    """The interleaved comparison, and the optimized function (its plans, memory, timings).

    With `prepared` and parameters declared by the workload, eqsat's side is `fast.prepare(params)` (parameter-only
    work done once) and jax.jit's side the original called with the same parameters."""
    baseline = jax.jit(work.fn)
    prepared = prepared and bool(work.params_argnums)
    fast = eqsat.optimize(work.fn, target=target, params_argnums=work.params_argnums if prepared else ())
    if not prepared:
        ready(fast, work.args)
        return interleaved(baseline, fast, work.args, seconds), fast
    params = [work.args[i] for i in work.params_argnums]
    rest = tuple(a for i, a in enumerate(work.args) if i not in work.params_argnums)

    def full(rest_args: tuple) -> list[Any]:
        given, others = iter(params), iter(rest_args)
        return [next(given) if i in work.params_argnums else next(others) for i in range(len(work.args))]

    run = fast.prepare(*params)
    jax.block_until_ready(run(*rest))
    return interleaved(lambda *r: baseline(*full(r)), run, rest, seconds), fast
