"""Multi-host JAX on this machine: N processes with jax.distributed on localhost (CPU, gloo), each one CPU device of
a global mesh, running one case of tests/multihost_programs.py optimized by eqsat against jax.jit, in interleaved
rounds after the plan is in place (every process runs the same rounds: each round's times are the slowest
process's). Prints each case's ratio (jax.jit's time / eqsat's) and what the plan did.

    python -m benches.multihost [--processes 2] [--cases sum,train,tp] [--size 512] [--seconds 4]

The processes share this machine's cores: the ratio says what the rewrite saves when every process computes and
communicates, not what a real cluster's network would give.
"""

import argparse
import socket
import tempfile
from pathlib import Path

from tests.multihost_programs import launch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--cases", default="sum,train,tp")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    # timed calls make no exchange of their own (the lockstep check is one per call)
    quiet = {i: {"EQSAT_CHECK_LOCKSTEP": "0"} for i in range(args.processes)}
    for case in args.cases.split(","):
        with tempfile.TemporaryDirectory() as cache, socket.socket() as probe:
            probe.bind(("localhost", 0))
            port = probe.getsockname()[1]
            probe.close()
            caches = [Path(cache) / f"host{i}" for i in range(args.processes)]
            extra = [f"--size={args.size}", f"--seconds={args.seconds}", "--calls=2"]
            reports = launch(args.processes, case, caches, port, 900, extra, quiet)
        first = reports[0]
        plan = first["fallback"] or ", ".join(f"{op} x{n}" for op, n in sorted(first["rewritten"].items()))
        print(
            f"{case:6s} {args.processes} processes: {first['ratio']:.2f}x ({first['rounds']} rounds; jax.jit "
            f"{first['jit_s'] * 1e3:.2f} ms, eqsat {first['eqsat_s'] * 1e3:.2f} ms; guard: {first['measured']}); "
            f"plan: {plan}; largest difference from jax.jit {max(max(r['differences']) for r in reports):.2g}"
        )


if __name__ == "__main__":
    main()
