"""The guard on a busy machine (issue 27): how often a plan is kept, in fresh processes, with busy processes beside.

    python -m benches.guard_under_load                       # 10 processes each, two busy ones (one per core)
    python -m benches.guard_under_load --runs 5 --busy 0     # the same on a quiet machine
    python -m benches.guard_under_load --example xent        # the LM loss alone
    python -m benches.guard_under_load --example slower      # a plan slower on purpose: refused?
    python -m benches.guard_under_load --example mobilenetv2_train --runs 5 --vary --time 6   # and its speed after

Each run is a new process with an empty cache directory (no stored plan, no timing cache) that plans one example
of eqsat/tools/examples.py or one case of benches/kernels.py (`distributivity` and `xent`, the LM loss over 4x512x32000
logits, by default), waits for the plan and its guard's decision (on the first call, or on the live calls that
follow an undecided one) and prints it. The busy processes spin for the whole bench and are stopped at its end.

`wrong:CASE` plans CASE with a wrong rule (a product's second factor dropped): validation must refuse it. `--vary`
gives each run other weights and inputs. `slower` is a plan made slower on purpose: a batched matmul (16 x 64x64
by 64x64) beside its broadcast-multiply form (BcastBatchDot, what rules/kernels.egg offers for tiny matrices only;
a user rule here offers it at any size), with a timing cache whose entry for that form is poisoned (a tenth of the
GEMM's time, where it runs several times slower): the cost model picks it, and the guard must refuse it.
"""

import argparse
import dataclasses
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from eqsat.support.workload import Workload
from eqsat.tools.examples import EXAMPLES

_RUN = """
import json, eqsat
from benches.guard_under_load import RULES, WRONG, vary, workload
from eqsat.tools.versus import settled
work = vary(workload({name!r}.removeprefix("wrong:")), {seed!r})
rules = [WRONG] if {name!r}.startswith("wrong:") else RULES.get({name!r})
fast = eqsat.optimize(work.fn, params_argnums=work.params_argnums, rules=rules)
fast(*work.args)
plan = settled(fast, work.args)  # undecided on the first call: live calls go on measuring until they decide
timed = None
if {seconds!r}:  # what runs from now on against jax.jit, interleaved, the busy processes still beside
    import jax
    from eqsat.numerics.measure import interleaved
    timed = interleaved(jax.jit(work.fn), fast, work.args, seconds={seconds!r}).ratio
print(json.dumps({{"measured": plan.measured, "fallback": plan.fallback, "timed": timed}}))
"""


# any batched matmul beside its broadcast-multiply form (the built-in rule offers it for tiny matrices only)
RULES = {
    "slower": [
        "; @real: the sum over K is re-associated\n"
        '(rule ((= e (BatchDot a b))) ((union e (BcastBatchDot a b))) :name "any-batchdot-broadcast")'
    ]
}


# a wrong rule for `wrong:CASE` (a product's second factor dropped where that keeps the shape: batch norm's scale;
# dropping an addition's term is right on keras' zero biases): validation must refuse the plan it gives
WRONG = '(rule ((= e (Mul x y)) (= (shape e) (shape x))) ((union e x)) :name "wrong-mul")'


def workload(name: str) -> Workload:
    """An example of eqsat/tools/examples.py at full scale, else a case of benches/kernels.py."""
    if name == "slower":
        a, b = (jax.random.normal(jax.random.key(i), (16, 64, 64)) for i in (0, 1))
        return Workload("slower", lambda a, b: jnp.tanh(a @ b), (a, b))
    if name in EXAMPLES:
        return EXAMPLES[name]("full")
    from benches.kernels import workload as kernel_case

    return kernel_case(name)


def vary(work: Workload, seed: int | None) -> Workload:
    """The workload with its floating-point arguments (weights and inputs) each multiplied by 1 + 0.1 * a standard
    normal draw of this seed (None: as it is)."""
    if seed is None:
        return work
    leaves, tree = jax.tree.flatten(work.args)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    varied = [
        x * (1 + 0.1 * jax.random.normal(k, jnp.shape(x), x.dtype)) if jnp.issubdtype(x.dtype, jnp.floating) else x
        for x, k in zip(leaves, keys, strict=True)
    ]
    return dataclasses.replace(work, args=jax.tree.unflatten(tree, varied))


def _spin() -> None:
    while True:
        pass


def _planned(example: str, cache: str, seed: int | None = None, seconds: float = 0.0) -> dict[str, Any]:
    """The guard's measurement of the example's plan and why the original runs where it does, planned in a fresh
    process with this cache directory (its arguments varied by `seed`); with `seconds`, also its ratio to jax.jit
    over that long, interleaved, once the guard has decided."""
    env = {**os.environ, "EQSAT_CACHE_DIR": cache, "EQSAT_BACKGROUND": "0", "EQSAT_PLAN_STORE": "off"}
    out = subprocess.run(
        [sys.executable, "-c", _RUN.format(name=example, seed=seed, seconds=seconds)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _poisoned_timings(cache: str) -> Path:
    """The timing cache of the `slower` example, measured here once, with the broadcast form's entries set to a
    tenth of the GEMM's time."""
    _planned("slower", cache)
    (path,) = Path(cache, "timing").glob("*.json")
    content = json.loads(path.read_text())
    gemm = min(t for k, t in content["entries"].items() if k.startswith('["BatchDot"') and t)
    for key in content["entries"]:
        if key.startswith('["BcastBatchDot"'):
            content["entries"][key] = gemm / 10
    path.write_text(json.dumps(content))
    return path


def _kept(example: str, runs: int, vary: bool = False, seconds: float = 0.0) -> int:
    """How many of `runs` fresh processes keep the example's plan, each printing its guard's decision (`vary`: run
    k's weights and inputs varied by seed k; `seconds`: and the ratio to jax.jit timed that long afterwards)."""
    kept = 0
    with tempfile.TemporaryDirectory() as seed:
        timings = _poisoned_timings(seed) if example == "slower" else None
        for run in range(runs):
            with tempfile.TemporaryDirectory() as cache:
                if timings is not None:
                    Path(cache, "timing").mkdir()
                    shutil.copy(timings, Path(cache, "timing", timings.name))
                planned = _planned(example, cache, run if vary else None, seconds)
                measured = planned["measured"]
            runs_plan = bool(measured and measured["kept"])
            kept += runs_plan
            if measured:
                how = f"{measured['decision']} ({measured['faster_rounds']}/{measured['rounds']}) from the "
                how += f"{measured.get('source')}, ratio {measured['ratio']:.2f}"
            else:  # never timed: validation refused it, or nothing to gain
                how = f"not timed: {(planned['fallback'] or 'no fallback')[:150]}"
            timed = f", then {planned['timed']:.2f}x against jax.jit over {seconds:g} s" if planned.get("timed") else ""
            print(f"{example} run {run + 1}: {how}, kept {runs_plan}{timed}", flush=True)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", default="distributivity,xent", help="comma-separated examples or cases")
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per example")
    parser.add_argument("--busy", type=int, default=2, help="busy processes spinning beside them")
    parser.add_argument("--vary", action="store_true", help="other random weights and inputs in each run")
    parser.add_argument(
        "--time", type=float, default=0.0, metavar="SECONDS", help="then time the function against jax.jit this long"
    )
    options = parser.parse_args()
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(options.busy)]
    for process in busy:
        process.start()
    try:
        kept = {
            example: _kept(example, options.runs, options.vary, options.time) for example in options.example.split(",")
        }
    finally:
        for process in busy:
            process.terminate()
    for example, count in kept.items():
        refusing = example == "slower" or example.startswith("wrong:")
        verdict = f"refused in {options.runs - count}" if refusing else f"kept in {count}"
        print(f"{example}: {verdict} of {options.runs} fresh processes, {options.busy} busy beside")


if __name__ == "__main__":
    main()
