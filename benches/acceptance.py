"""The issues' acceptance measurements, each against jax.jit in the same process, interleaved.

    python -m benches.acceptance            # all cases
    python -m benches.acceptance --only conv_bn,inception_siblings

Prints one line per case: what was optimized, how (target, parameters prepared or not), the measured ratio
(jax.jit time / eqsat time: above 1 is faster) with its interquartile range, and the bar the issue sets.
"""

import argparse
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import eqsat
from benches.examples import EXAMPLES
from benches.models import layers
from benches.workload import Workload
from eqsat.measure import Comparison, compare


def nasrnn_cell() -> Workload:
    """One NasRNN cell (hidden 512, batch 1): eight gates, each x @ W_i + h @ U_i."""
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "W": jax.random.normal(keys[0], (8, 512, 512)) * 0.04,
        "U": jax.random.normal(keys[1], (8, 512, 512)) * 0.04,
    }
    x, h = jax.random.normal(keys[2], (1, 512)), jax.random.normal(keys[3], (1, 512))

    def cell(p: Any, x: jax.Array, h: jax.Array) -> jax.Array:
        gates = [x @ p["W"][i] + h @ p["U"][i] for i in range(8)]
        mixed = [jax.nn.sigmoid(gates[0]) * jnp.tanh(gates[1]), jax.nn.relu(gates[2]) * jax.nn.sigmoid(gates[3])]
        mixed += [jnp.tanh(gates[4]) + jax.nn.sigmoid(gates[5]), jax.nn.relu(gates[6]) * jnp.tanh(gates[7])]
        return jnp.tanh(mixed[0] * mixed[1] + mixed[2] * mixed[3])

    return Workload("nasrnn_cell", cell, (params, x, h), (0,))


def inception_siblings() -> Workload:
    """Four sibling 1x1 convs of one input (Inception-v3's 35x35 stage) feeding a concat."""
    keys = jax.random.split(jax.random.PRNGKey(1), 5)
    params = {f"w{i}": jax.random.normal(keys[i], (1, 1, 192, c)) * 0.05 for i, c in enumerate((64, 48, 64, 32))}
    x = jax.random.normal(keys[4], (1, 35, 35, 192))

    def siblings(p: Any, x: jax.Array) -> jax.Array:
        return jnp.concatenate([layers.conv2d(x, p[f"w{i}"]) for i in range(4)], axis=-1)

    return Workload("inception_siblings", siblings, (params, x), (0,))


def conv_bn() -> Workload:
    """A conv + BatchNorm (inference) + relu block, 56x56x64 -> 64."""
    keys = jax.random.split(jax.random.PRNGKey(2), 4)
    params = {
        "conv": {"w": jax.random.normal(keys[0], (3, 3, 64, 64)) * 0.05},
        "bn": {"scale": jax.random.normal(keys[1], (64,)), "shift": jax.random.normal(keys[2], (64,))},
    }
    x = jax.random.normal(keys[3], (1, 56, 56, 64))
    return Workload("conv_bn_relu", lambda p, x: layers.conv_bn(x, p), (params, x), (0,))


def measure(work: Workload, target: str, prepared: bool, seconds: float) -> tuple[Comparison, eqsat.Plan]:
    baseline = jax.jit(work.fn)
    fast = eqsat.optimize(work.fn, target=target, params_argnums=work.params_argnums if prepared else ())
    if prepared:
        params, rest = work.args[0], work.args[1:]
        run = fast.prepare(params)
        return compare(lambda *r: baseline(params, *r), run, rest, seconds), fast.plan(*work.args)
    return compare(baseline, fast, work.args, seconds), fast.plan(*work.args)


# name -> (workload, target, parameters prepared, the bar)
CASES: dict[str, tuple[Callable[[], Workload], str, bool, str]] = {
    "matmul_chain": (lambda: EXAMPLES["matmul_chain"]("full"), "cpu", False, "issue 2: >= 10x"),
    "distributivity": (lambda: EXAMPLES["distributivity"]("full"), "cpu", False, "issue 2: >= 1.3x"),
    "nasrnn_cell": (nasrnn_cell, "cpu", True, "issue 3: >= 1.5x"),
    "nasrnn_cell_h100_plan": (nasrnn_cell, "h100", True, "(the GPU plan, run here)"),
    "inception_siblings": (inception_siblings, "cpu", True, "issue 3: >= 1.2x"),
    "conv_bn": (conv_bn, "cpu", True, "issue 3: not slower, fold in the plan"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.acceptance", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--seconds", type=float, default=4.0, help="timing budget per case")
    args = parser.parse_args(argv)
    for name in args.only.split(",") if args.only else CASES:
        build, target, prepared, bar = CASES[name]
        timing, plan = measure(build(), target, prepared, args.seconds)
        how = f"target {target}{', prepared' if prepared else ''}"
        print(f"{name:<24} {how:<22} {timing}  [{bar}]  rewritten {plan.rewritten_ops()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
