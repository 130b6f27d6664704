"""A call's own cost: eqsat's call against jax.jit's on programs where the call is most of the time (issue 27).

    python -m benches.dispatch                  # 20,000 interleaved calls of each program
    python -m benches.dispatch --calls 5000

Each program is planned first (`fast.plan(*args)`, then calls until the plan has settled), then eqsat's and
jax.jit's calls alternate, the order flipped every call, each timed alone; the medians are compared. The bar:
eqsat's median within 10% of jax.jit's, or within 1 us of it.
"""

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import eqsat


def _affine(x: jax.Array) -> jax.Array:
    return x * 2 + 1


def _mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:  # about 0.3 ms on 2 cores
    return jnp.tanh(x @ w1) @ w2


def _programs() -> dict[str, tuple[Callable[..., Any], tuple]]:
    key = jax.random.split(jax.random.key(0), 3)
    mlp_args = (
        jax.random.normal(key[0], (64, 256)),
        jax.random.normal(key[1], (256, 512)),
        jax.random.normal(key[2], (512, 256)),
    )
    return {"x * 2 + 1, 8 floats": (_affine, (jnp.arange(8.0),)), "tanh(x @ w1) @ w2": (_mlp, mlp_args)}


def interleaved(calls: int, fast: Callable[..., Any], jitted: Callable[..., Any], args: tuple) -> dict[str, float]:
    """Median seconds of a call of each, alternating which goes first."""
    times: dict[str, list[int]] = {"eqsat": [], "jax.jit": []}
    clock = time.perf_counter_ns
    for i in range(calls):
        order = (("eqsat", fast), ("jax.jit", jitted)) if i % 2 else (("jax.jit", jitted), ("eqsat", fast))
        for name, fn in order:
            start = clock()
            jax.block_until_ready(fn(*args))
            times[name].append(clock() - start)
    return {name: statistics.median(t) / 1e9 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000, help="interleaved calls of each program")
    options = parser.parse_args()
    for name, (fun, args) in _programs().items():
        fast, jitted = eqsat.optimize(fun), jax.jit(fun)
        fast.plan(*args)
        for _ in range(100):  # past the switch to the plan and its settling
            jax.block_until_ready(fast(*args))
            jax.block_until_ready(jitted(*args))
        median = interleaved(options.calls, fast, jitted, args)
        e, j = median["eqsat"] * 1e6, median["jax.jit"] * 1e6
        verdict = "within the bar" if e <= j * 1.1 or e - j <= 1.0 else "OVER the bar"
        print(f"{name:24s} eqsat {e:9.2f} us  jax.jit {j:9.2f} us  ratio {e / j:.3f}  +{e - j:.2f} us  {verdict}")


if __name__ == "__main__":
    main()
