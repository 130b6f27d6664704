"""What the overflow guard costs (issue 24, must-be-true 3): plans that rely on rules marked `; @real` check their
results for inf/NaN on device and run the original where any is (backends/lower.py overflow_guarded).

    python -m benches.overflow_guard                 # the re-association and distributivity demos, full size
    python -m benches.overflow_guard --seconds 1     # shorter rounds

Per case, timed interleaved in one process (ratio: the first's time / the second's, > 1: the second is faster):
jax.jit against the guarded plan, the unguarded plan against the guarded one, the same three under vmap over a
batch of 4 (where one custom_vmap rule keeps one check for the whole batch), and each plan's compile time.
"""

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
from jax.extend import core as jcore

import eqsat
from eqsat.backends.lower import lower, overflow_guarded
from eqsat.numerics.measure import interleaved
from eqsat.tools import examples

CASES = ("matmul_chain", "distributivity")
BATCH = 4


def _compile_s(fn: Callable[..., Any], args: tuple) -> float:
    start = time.perf_counter()
    fn.lower(*args).compile()
    return time.perf_counter() - start


def run(name: str, seconds: float) -> list[str]:
    work = examples.EXAMPLES[name]()
    args = work.args
    plan = eqsat.optimize(work.fn, background=False).plan(*args)
    assert plan.overflow_guard, f"{name}: the plan is not guarded ({plan.rules_fired})"
    original = jcore.jaxpr_as_fun(jax.make_jaxpr(lambda *xs: [work.fn(*xs)])(*args))
    watch = plan.rewritten_frontier()
    plain, guarded = lower(plan), overflow_guarded(lower(plan, watch=watch), original, len(watch))
    batched = tuple(jax.numpy.stack([x] * BATCH) for x in args)
    lines = [f"{name} ({work.note}): {plan.predicted_speedup:.1f}x predicted, guarded for {plan.overflow_guard}"]
    for label, wrap, xs in (("", lambda f: f, args), (f"vmap x{BATCH} ", jax.vmap, batched)):
        jitted = jax.jit(wrap(lambda *a: [work.fn(*a)]))
        unguarded, checked = jax.jit(wrap(plain)), jax.jit(wrap(guarded))
        compiled = ", ".join(f"{k} {_compile_s(f, xs) * 1e3:.0f} ms" for k, f in (("jax.jit", jitted),
                             ("unguarded plan", unguarded), ("guarded plan", checked)))  # fmt: skip
        lines += [
            f"  {label}jax.jit / guarded plan     {interleaved(jitted, checked, xs, seconds)}",
            f"  {label}unguarded / guarded plan   {interleaved(unguarded, checked, xs, seconds)}",
            f"  {label}compile: {compiled}",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="interleaved timing per comparison")
    parser.add_argument("--only", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    options = parser.parse_args()
    for name in options.only.split(","):
        print("\n".join(run(name, options.seconds)), flush=True)


if __name__ == "__main__":
    main()
