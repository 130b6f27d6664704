"""Multi-host JAX on this machine: N processes with jax.distributed on localhost (CPU, gloo), each one CPU device of
a global mesh, running one case of tests/multihost_programs.py optimized by eqsat against jax.jit, in interleaved
rounds after the plan is in place (every process runs the same rounds: each round's times are the slowest
process's). Prints each case's ratio (jax.jit's time / eqsat's) and what the plan did.

    python -m benches.multihost [--processes 2] [--cases sum,train,tp] [--size 512] [--seconds 4]
    python -m benches.multihost --plan-time mobilenetv2_train [--processes 2] [--measure-seconds 120]

The processes share this machine's cores: the ratio says what the rewrite saves when every process computes and
communicates, not what a real cluster's network would give. --plan-time plans the case cold in 1 process and in N
(each measuring a share of the kernels the plan needs timed), and prints how long the plan took to be ready, how
long its kernel measurements took and how many each process measured.
"""

import argparse
import socket
import tempfile
from pathlib import Path
from typing import Any

from tests.multihost_programs import launch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--cases", default="sum,train,tp")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--plan-time", metavar="CASE", help="a cold plan's time in 1 process and in --processes")
    parser.add_argument("--measure-seconds", type=float, default=120.0, help="with --plan-time: Limits' budget")
    args = parser.parse_args(argv)
    if args.plan_time:
        for n in (1, args.processes):
            extra = [f"--size={args.size}", "--calls=1", f"--measure-seconds={args.measure_seconds}"]
            first = _job(n, args.plan_time, extra, _unchecked(n))[0]
            timing = first["measured"]
            print(
                f"{args.plan_time} cold, {n} process{'es' if n > 1 else ''}: plan ready in {first['plan_s']:.1f} s, "
                f"its kernels measured in {first['measure_s'] or 0:.1f} s ({timing.get('measured', 0):.0f} by "
                f"process 0, {timing.get('measured_elsewhere', 0):.0f} by the others, "
                f"{timing.get('skipped', 0):.0f} left to the roofline)"
            )
        return
    quiet = _unchecked(args.processes)
    for case in args.cases.split(","):
        extra = [f"--size={args.size}", f"--seconds={args.seconds}", "--calls=2"]
        reports = _job(args.processes, case, extra, quiet)
        first = reports[0]
        plan = first["fallback"] or ", ".join(f"{op} x{n}" for op, n in sorted(first["rewritten"].items()))
        print(
            f"{case:6s} {args.processes} processes: {first['ratio']:.2f}x ({first['rounds']} rounds; jax.jit "
            f"{first['jit_s'] * 1e3:.2f} ms, eqsat {first['eqsat_s'] * 1e3:.2f} ms; guard: {first['guard']}); "
            f"plan: {plan}; largest difference from jax.jit {max(max(r['differences']) for r in reports):.2g}"
        )


def _unchecked(processes: int) -> dict[int, dict[str, str]]:
    """Each process's environment: timed calls make no exchange of their own (the lockstep check is one a call)."""
    return {i: {"EQSAT_CHECK_LOCKSTEP": "0"} for i in range(processes)}


def _job(processes: int, case: str, extra: list[str], env: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    """The case run by `processes` processes on localhost, each with a cold cache of its own."""
    with tempfile.TemporaryDirectory() as cache, socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
        probe.close()
        return launch(processes, case, [Path(cache) / f"host{i}" for i in range(processes)], port, 900, extra, env)


if __name__ == "__main__":
    main()
