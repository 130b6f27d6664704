"""The first call of a new signature: eqsat's against jax.jit's, per model of the suite and benches/real_models.py.

    python -m benches.first_call                     # every model (the real ones need `pip install -e .[models]`)
    python -m benches.first_call --models bert,vgg19 --markdown first_call.md
    python -m benches.first_call --models MobileNetV2,mamba_mixer,volumetric_cnn   # cases of benches/kernels.py

Each first call runs in a fresh process (what a user's script pays: tracing, planning, compiling, validating),
after the backend has started: jax.jit's, eqsat's with an empty cache directory (no timing cache, no stored
plans), and eqsat's again in a new process that keeps that directory (its plans stored). The bar (issue 17): eqsat's
first call at most jax.jit's plus 1 s.

A plan is built in the background while the first call runs jax.jit's program (eqsat/support/background.py), so each
eqsat row also says when the plan was ready (seconds from the first call's start: built, validated, timed and
compiled) and what the call that switched to it cost.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp

_MODES = ("jit", "eqsat", "eqsat_kept")


def _workload(name: str) -> Any:
    """A model of the suite, of benches/real_models.py, or a case of benches/kernels.py (mamba_mixer, MobileNetV2)."""
    from benches.models.registry import MODELS

    if name in MODELS:
        return MODELS[name]("full")
    from benches.real_models import REAL_MODELS

    if name in REAL_MODELS:
        return REAL_MODELS[name]()
    from benches.kernels import workload

    return workload(name)


def _first_call(name: str, mode: str) -> dict[str, Any]:
    """In this process: the model's first call under jax.jit or eqsat, in seconds, and where eqsat's went."""
    import eqsat

    work = _workload(name)
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.ones(3)))  # the backend started, as in any program
    fn = jax.jit(work.fn) if mode == "jit" else eqsat.optimize(work.fn)
    start = time.perf_counter()
    jax.block_until_ready(fn(*work.args))
    row: dict[str, Any] = {"model": work.name, "mode": mode, "seconds": round(time.perf_counter() - start, 3)}
    if mode != "jit":
        plan = fn.plan(*work.args)  # waits for a plan left to the background
        row["ready_s"] = round(time.perf_counter() - start, 3)
        switch = time.perf_counter()
        jax.block_until_ready(fn(*work.args))
        row["switch_s"] = round(time.perf_counter() - switch, 3)
        keys = ("capture_s", "saturate_s", "extract_s", "measure_s", "load_s")
        row.update({k: round(plan.stats[k], 3) for k in keys if k in plan.stats})
        row["rewritten"] = bool(plan.rewritten_ops()) and plan.fallback is None
        row["ops"] = len(plan.graph.nodes) if plan.graph is not None else None
    return row


def measure(name: str) -> dict[str, Any]:
    """One model's three first calls, each in its own process."""
    cache = tempfile.mkdtemp(prefix="eqsat-first-call-")
    rows = {}
    for mode in _MODES:
        env = {**os.environ, "EQSAT_CACHE_DIR": cache}
        done = subprocess.run(
            [sys.executable, "-m", "benches.first_call", "--child", name, mode],
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode != 0:
            return {"model": name, "error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
        rows[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    eq, jit = rows["eqsat"], rows["jit"]
    return {
        "model": jit["model"],
        "ops": eq.get("ops"),
        "jit_s": jit["seconds"],
        "eqsat_s": eq["seconds"],
        "difference_s": round(eq["seconds"] - jit["seconds"], 3),
        "eqsat_kept_s": rows["eqsat_kept"]["seconds"],
        "ready_s": [eq["ready_s"], rows["eqsat_kept"]["ready_s"]],
        "switch_s": [eq["switch_s"], rows["eqsat_kept"]["switch_s"]],
        "kept_difference_s": round(rows["eqsat_kept"]["seconds"] - jit["seconds"], 3),
        "rewritten": eq.get("rewritten"),
        "eqsat_breakdown": {k: v for k, v in eq.items() if k.endswith("_s")},
        "holds": max(eq["seconds"], rows["eqsat_kept"]["seconds"]) - jit["seconds"] <= 1.0,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | ops | jax.jit first call | eqsat first call | difference | eqsat, plan kept | difference "
        "| plan ready after (cold / kept) | switching call (cold / kept) "
        "| eqsat's capture / saturate / extract / measure s | plan rewritten |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | not run: {r['error'][:80]} | | | | | | | | | |")
            continue
        b = r["eqsat_breakdown"]
        parts = " / ".join(f"{b.get(k, 0.0):.2f}" for k in ("capture_s", "saturate_s", "extract_s", "measure_s"))
        lines.append(
            f"| {r['model']} | {r['ops']} | {r['jit_s']:.2f} s | {r['eqsat_s']:.2f} s | **{r['difference_s']:+.2f} s** "
            f"| {r['eqsat_kept_s']:.2f} s | {r['kept_difference_s']:+.2f} s "
            f"| {r['ready_s'][0]:.2f} / {r['ready_s'][1]:.2f} s | {r['switch_s'][0]:.2f} / {r['switch_s'][1]:.2f} s "
            f"| {parts} | {r['rewritten']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.first_call", description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: the suite and the real models)")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # one first call, in this process
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_first_call(*args.child)), flush=True)
        return 0
    from benches.models.registry import MODELS
    from benches.real_models import REAL_MODELS

    names = args.models.split(",") if args.models else [*MODELS, *REAL_MODELS]
    rows = []
    for name in names:
        rows.append(measure(name))
        print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
