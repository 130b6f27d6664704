"""The guard on a busy machine (issue 27): how often a plan is kept, in fresh processes, with busy processes beside.

    python -m benches.guard_under_load                       # 10 processes each, two busy ones (one per core)
    python -m benches.guard_under_load --runs 5 --busy 0     # the same on a quiet machine
    python -m benches.guard_under_load --example xent        # the LM loss alone

Each run is a new process with an empty cache directory (no stored plan, no timing cache) that plans one example
of eqsat/tools/examples.py or one case of benches/kernels.py (`distributivity` and `xent`, the LM loss over 4x512x32000
logits, by default), waits for the plan and its guard's decision (on the first call, or on the live calls that
follow an undecided one) and prints it. The busy processes spin for the whole
bench and are stopped at its end.
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile

from eqsat.tools.examples import EXAMPLES
from eqsat.workload import Workload

_RUN = """
import json, eqsat
from benches.guard_under_load import workload
from eqsat.tools.versus import settled
work = workload({name!r})
fast = eqsat.optimize(work.fn, params_argnums=work.params_argnums)
fast(*work.args)
plan = settled(fast, work.args)  # undecided on the first call: live calls go on measuring until they decide
print(json.dumps(plan.measured))
"""


def workload(name: str) -> Workload:
    """An example of eqsat/tools/examples.py at full scale, else a case of benches/kernels.py."""
    if name in EXAMPLES:
        return EXAMPLES[name]("full")
    from benches.kernels import workload as kernel_case

    return kernel_case(name)


def _spin() -> None:
    while True:
        pass


def _kept(example: str, runs: int) -> int:
    """How many of `runs` fresh processes keep the example's plan, each printing its guard's decision."""
    kept = 0
    for run in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "EQSAT_CACHE_DIR": cache, "EQSAT_BACKGROUND": "0"}
            out = subprocess.run(
                [sys.executable, "-c", _RUN.format(name=example)], env=env, capture_output=True, text=True, check=True
            )
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        kept += bool(measured and measured["kept"])
        decision = measured and f"{measured['decision']} ({measured['faster_rounds']}/{measured['rounds']})"
        source = measured and measured.get("source")
        print(
            f"{example} run {run + 1}: {decision} from the {source}, ratio {measured and measured['ratio']:.2f}, "
            f"kept {measured and measured['kept']}",
            flush=True,
        )
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", default="distributivity,xent", help="comma-separated examples or cases")
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per example")
    parser.add_argument("--busy", type=int, default=2, help="busy processes spinning beside them")
    options = parser.parse_args()
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(options.busy)]
    for process in busy:
        process.start()
    try:
        kept = {example: _kept(example, options.runs) for example in options.example.split(",")}
    finally:
        for process in busy:
            process.terminate()
    for example, count in kept.items():
        print(f"{example}: kept in {count} of {options.runs} fresh processes, {options.busy} busy beside")


if __name__ == "__main__":
    main()
