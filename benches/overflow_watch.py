"""What the overflow watch costs (issue 24, must-be-true 3): plans that rely on rules marked `; @real` check their
results for inf/NaN on device and run the original where any is (backends/lower.py with_overflow_watch).

    python -m benches.overflow_watch                 # the re-association and distributivity demos, full size
    python -m benches.overflow_watch --seconds 1     # shorter rounds

Per case, timed interleaved in one process (ratio: the first's time / the second's, > 1: the second is faster):
jax.jit against the watched plan, the unwatched plan against the watched one, the same three under vmap over a
batch of 4 (where one custom_vmap rule keeps one check for the whole batch), and each plan's compile time.
"""

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
from jax.extend import core as jcore

import eqsat
from eqsat.backends.lower import lower, with_overflow_watch
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
    assert plan.overflow_watch, f"{name}: the plan is not watched ({plan.rules_fired})"
    original = jcore.jaxpr_as_fun(jax.make_jaxpr(lambda *xs: [work.fn(*xs)])(*args))
    watch = plan.rewritten_frontier()
    plain, watched = lower(plan), with_overflow_watch(lower(plan, watch=watch), original, len(watch))
    batched = tuple(jax.numpy.stack([x] * BATCH) for x in args)
    lines = [f"{name} ({work.note}): {plan.predicted_speedup:.1f}x predicted, watched for {plan.overflow_watch}"]
    for label, wrap, xs in (("", lambda f: f, args), (f"vmap x{BATCH} ", jax.vmap, batched)):
        jitted = jax.jit(wrap(lambda *a: [work.fn(*a)]))
        unwatched, checked = jax.jit(wrap(plain)), jax.jit(wrap(watched))
        compiled = ", ".join(f"{k} {_compile_s(f, xs) * 1e3:.0f} ms" for k, f in (("jax.jit", jitted),
                             ("unwatched plan", unwatched), ("watched plan", checked)))  # fmt: skip
        lines += [
            f"  {label}jax.jit / watched plan     {interleaved(jitted, checked, xs, seconds)}",
            f"  {label}unwatched / watched plan   {interleaved(unwatched, checked, xs, seconds)}",
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
