"""The guard on a busy machine (issue 27): how often a plan is kept, in fresh processes, with busy processes beside.

    python -m benches.guard_under_load                       # 10 processes, two busy ones (one per core)
    python -m benches.guard_under_load --runs 5 --busy 0     # the same on a quiet machine

Each run is a new process with an empty cache directory (no stored plan, no timing cache) that plans one example
of eqsat/tools/examples.py (`distributivity` by default), waits for the plan and prints its guard's decision. The busy
processes spin for the whole bench and are stopped at its end.
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile

_RUN = """
import json, eqsat
from eqsat.tools.examples import EXAMPLES
work = EXAMPLES[{name!r}]("full")
fast = eqsat.optimize(work.fn, params_argnums=work.params_argnums)
fast(*work.args)
plan = fast.plan(*work.args)
print(json.dumps(plan.measured))
"""


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", default="distributivity", help="an example of eqsat/tools/examples.py")
    parser.add_argument("--runs", type=int, default=10, help="fresh processes")
    parser.add_argument("--busy", type=int, default=2, help="busy processes spinning beside them")
    options = parser.parse_args()
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(options.busy)]
    for process in busy:
        process.start()
    kept = 0
    try:
        for run in range(options.runs):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "EQSAT_CACHE_DIR": cache, "EQSAT_BACKGROUND": "0"}
                out = subprocess.run(
                    [sys.executable, "-c", _RUN.format(name=options.example)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            kept += bool(measured and measured["kept"])
            decision = measured and f"{measured['decision']} ({measured['faster_rounds']}/{measured['rounds']})"
            print(f"run {run + 1}: {decision}, ratio {measured and measured['ratio']:.2f}, kept {measured['kept']}")
    finally:
        for process in busy:
            process.terminate()
    print(f"{options.example}: kept in {kept} of {options.runs} fresh processes, {options.busy} busy beside")


if __name__ == "__main__":
    main()
