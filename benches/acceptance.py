"""The issues' acceptance measurements, each against jax.jit in the same process, interleaved.

    python -m benches.acceptance            # all cases
    python -m benches.acceptance --only conv_bn,inception_siblings

Prints one line per case: what was optimized, how (target, parameters prepared or not), the measured ratio
(jax.jit time / eqsat time: above 1 is faster) with its interquartile range, and the bar the issue sets.
"""

import argparse

from benches.models import nasrnn
from eqsat.tools.examples import EXAMPLES
from eqsat.tools.versus import against_jit

# the demo's examples and five NasRNN steps, the published NasRNN benchmark
WORKLOADS = {**EXAMPLES, "nasrnn_5_steps": nasrnn.build}

# name -> (example, target, parameters prepared, the bar)
CASES: dict[str, tuple[str, str, bool, str]] = {
    "matmul_chain": ("matmul_chain", "cpu", False, "issue 2: >= 10x"),
    "distributivity": ("distributivity", "cpu", False, "issue 2: >= 1.3x"),
    "nasrnn_5_steps": ("nasrnn_5_steps", "cpu", True, "issue 3: >= 1.5x"),
    "nasrnn_cell": ("nasrnn_cell", "cpu", True, "(one step)"),
    "nasrnn_cell_h100_plan": ("nasrnn_cell", "h100", True, "(the GPU plan, run here)"),
    "inception_siblings": ("inception_siblings", "cpu", True, "issue 3: >= 1.2x"),
    "conv_bn": ("conv_bn", "cpu", True, "issue 3: not slower (fold off on cpu, as measured)"),
    "conv_bn_h100_plan": ("conv_bn", "h100", True, "issue 3: not slower, fold in the plan"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.acceptance", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--seconds", type=float, default=4.0, help="timing budget per case")
    args = parser.parse_args(argv)
    for name in args.only.split(",") if args.only else CASES:
        example, target, prepared, bar = CASES[name]
        work = WORKLOADS[example]("full")
        timing, fast = against_jit(work, target, prepared, args.seconds)
        plan = fast.plan(*work.args)
        how = f"target {target}{', prepared' if prepared else ''}"
        print(f"{name:<24} {how:<22} {timing}  [{bar}]  rewritten {plan.rewritten_ops()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
