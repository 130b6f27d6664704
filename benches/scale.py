"""Issue 17's measurements: long chains, big sums, depth, plans kept across processes, many shapes.

    python -m benches.scale                      # every case
    python -m benches.scale --only chain_20,sum_30

Each case prints one JSON line: what was measured, the figure, and the issue's bar. Times against jax.jit are
interleaved in one process (ratio = the other side's time / eqsat's, above 1 is faster); cases that need a fresh
process (a second process planning the same model, memory over many shapes) run themselves as subprocesses.
"""

import argparse
import contextlib
import ctypes
import functools
import gc
import json
import operator
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import eqsat
from eqsat.numerics.measure import interleaved

SEED = 0


def _normal(shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
    rng = np.random.default_rng(SEED + len(shape) + sum(shape))
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32))


def _left_to_right(*operands: jax.Array) -> jax.Array:
    return functools.reduce(operator.matmul, operands)


def _right_to_left(*operands: jax.Array) -> jax.Array:
    out = operands[-1]
    for m in reversed(operands[:-1]):
        out = m @ out
    return out


def chain(n: int, seconds: float) -> dict[str, Any]:
    """A left-to-right chain of n-1 256x256 matrices ending in a 256x2 one, against the hand-ordered chain."""
    operands = [_normal((256, 256), 1 / 16) for _ in range(n - 1)] + [_normal((256, 2))]
    fast = eqsat.optimize(_left_to_right)
    start = time.perf_counter()
    jax.block_until_ready(fast(*operands))
    first_s = time.perf_counter() - start
    plan = fast.plan(*operands)
    hand = interleaved(jax.jit(_right_to_left), fast, tuple(operands), seconds)
    as_written = interleaved(jax.jit(_left_to_right), fast, tuple(operands), seconds)
    return {
        "case": f"chain_{n}",
        "vs_hand_ordered": str(hand),
        "vs_jit_as_written": str(as_written),
        "enodes": plan.stats["enodes"],
        "stop": plan.stop_reason,
        "first_call_s": round(first_s, 2),
        "bar": "within 10 % of the hand-ordered chain (ratio >= 0.9)",
        "holds": hand.ratio >= 0.9,
    }


def shared_sum(n: int, seconds: float) -> dict[str, Any]:
    """x @ B1 + ... + x @ Bn, x 1024x512 and each B 512x512, against jax.jit."""
    x = _normal((1024, 512))
    weights = [
        jnp.asarray(np.random.default_rng(k).standard_normal((512, 512)).astype(np.float32) / 20) for k in range(n)
    ]

    def f(x: jax.Array, *weights: jax.Array) -> jax.Array:
        return functools.reduce(operator.add, [x @ w for w in weights])

    fast = eqsat.optimize(f)
    plan = fast.plan(x, *weights)
    jax.block_until_ready(fast(x, *weights))
    timing = interleaved(jax.jit(f), fast, (x, *weights), seconds)
    return {
        "case": f"sum_{n}",
        "vs_jit": str(timing),
        "dots_in_plan": sum(node.op == "Dot" for node in plan.nodes),
        "enodes": plan.stats["enodes"],
        "bar": ">= 10x",
        "holds": timing.ratio >= 10,
    }


# ------------------------------------------------------------------------------------------------ depth

_D, _SEQ = 64, 16


def _layer_params(k: int) -> dict[str, jax.Array]:
    names = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
    return {name: _normal((_D, _D), 1 / 8) * (1 + 0.01 * (k + i)) for i, name in enumerate(names)}


def _layer(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """A transformer layer whose feed-forward reads x @ w1 + x @ w2: distributivity makes it one GEMM."""
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    attention = jax.nn.softmax(q @ k.T / np.sqrt(_D), axis=-1) @ v
    x = x + attention @ p["wo"]
    return x + jax.nn.relu(x @ p["w1"] + x @ p["w2"]) @ p["w3"]


def _looped(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for p in params:
        x = _layer(x, p)
    return x


def _scanned(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jax.lax.scan(lambda h, p: (_layer(h, p), None), x, params)[0]


def _loss(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    return jnp.sum(_looped(params, x) ** 2)


def _factored(plan: eqsat.Plan) -> int:
    """Rewritten contractions whose weight operand is a new sum of two weights: the distributivity rewrite, once
    per layer (a gradient's own contractions that read a residual sum are not it)."""

    def sum_of_weights(node: Any) -> bool:
        return node.op == "Add" and node.rewritten and all(plan.nodes[j].op == "Var" for j in node.inputs)

    return sum(
        node.op == "Dot" and node.rewritten and sum_of_weights(plan.nodes[node.inputs[1]]) for node in plan.nodes
    )


def _plan_seconds(fn: Callable[..., Any], args: tuple) -> tuple[float, eqsat.Plan]:
    """Wall seconds from a fresh optimize() to its plan (capture to extraction, nothing compiled), of a new
    function each time: plans of one function are shared in memory."""
    start = time.perf_counter()
    plan = eqsat.optimize(lambda *a: fn(*a)).plan(*args)
    return time.perf_counter() - start, plan


def depth(form: str) -> dict[str, Any]:
    """N=2 against N=32 layers: the optimization time ratio and every layer's rewrite. Each depth is planned
    three times, the two interleaved, and the medians kept: one planning of N=2 reads 0.7-1.0 s on a shared VM."""
    x = _normal((_SEQ, _D))
    programs = {}
    for n in (2, 32):
        layers = [_layer_params(k) for k in range(n)]
        if form == "scan":
            programs[n] = _scanned, (jax.tree.map(lambda *w: jnp.stack(w), *layers), x)
        elif form == "grad":
            programs[n] = jax.grad(_loss), (layers, x)
        else:
            programs[n] = _looped, (layers, x)
        _plan_seconds(*programs[n])  # jax's own first-use costs (tracing machinery, compiles of helpers) paid once
    runs: dict[int, list[tuple[float, eqsat.Plan]]] = {2: [], 32: []}
    for _ in range(3):
        for n, (fn, args) in programs.items():
            runs[n].append(_plan_seconds(fn, args))
    rows = {}
    for n, planned in runs.items():
        plan = planned[0][1]
        rewritten = plan.stats.get("bodies_rewritten", 0) if form == "scan" else _factored(plan)
        rows[n] = {
            "optimize_s": round(statistics.median(s for s, _ in planned), 3),
            "optimize_s_runs": [round(s, 3) for s, _ in planned],
            # eqsat's own part: the rest is jax's trace of the function (which jax.jit's first call pays too)
            "saturate_extract_s": round(
                statistics.median(p.stats["saturate_s"] + p.stats["extract_s"] for _, p in planned), 3
            ),
            "layers_rewritten": int(rewritten),
            "nodes": len(plan.graph.nodes),
        }
    ratio = rows[32]["optimize_s"] / rows[2]["optimize_s"]
    # a scan's one body is rewritten once; 32 layers get 16 times the 2-layer program's rewrites
    every = rows[2]["layers_rewritten"] >= 1 and rows[32]["layers_rewritten"] >= rows[2]["layers_rewritten"] * (
        1 if form == "scan" else 16
    )
    return {
        "case": f"depth_{form}",
        "n2": rows[2],
        "n32": rows[32],
        "time_ratio": round(ratio, 2),
        "saturate_extract_ratio": round(rows[32]["saturate_extract_s"] / rows[2]["saturate_extract_s"], 2),
        "bar": "every layer rewritten, optimization time ratio <= 2",
        "holds": bool(every and ratio <= 2),
    }


def new_shape(model: str, seconds: float) -> dict[str, Any]:
    """A suite model planned at its batch, then at twice it: the kernels priced from the first batch's
    measurements (the default) against measured again (timing_transfer=0); planning time and each plan's speed
    against jax.jit."""
    from benches.models.registry import MODELS
    from eqsat.extract import timing

    work = MODELS[model]("full")
    params, x = work.args
    bigger = (params, jnp.concatenate([x, x]))
    rows = {}
    cache = timing.cache_for(timing.local_device())
    measured_at_batch: dict[str, float | None] = {}
    for label, limits, args in (
        ("batch", eqsat.Limits(), work.args),
        ("twice the batch, priced from the batch", eqsat.Limits(), bigger),
        ("twice the batch, measured", eqsat.Limits(timing_transfer=0), bigger),
    ):
        if label != "batch":  # each twice-the-batch row starts from what the batch measured, nothing more
            cache.entries, cache.transfers = dict(measured_at_batch), {}
        fast = eqsat.optimize(work.fn, params_argnums=work.params_argnums, limits=limits)
        start = time.perf_counter()
        plan = fast.plan(*args)
        plan_s = time.perf_counter() - start
        stats = plan.stats
        rows[label] = {
            "plan_s": round(plan_s, 2),
            "kernels_measured": int(stats.get("timing_measured", 0)),
            "kernels_transferred": int(stats.get("timing_transferred", 0)),
            "vs_jit": str(interleaved(jax.jit(work.fn), fast, args, seconds)),
            "rewritten": plan.rewritten_ops(),
        }
        if label == "batch":
            measured_at_batch = dict(cache.entries)
    carried, measured = rows["twice the batch, priced from the batch"], rows["twice the batch, measured"]
    return {
        "case": f"new_shape_{model}",
        "model": work.name,
        **rows,
        "bar": "a new shape of a planned program reuses what does not depend on shape: less planning, only close "
        "kernel choices measured again",
        "holds": carried["kernels_measured"] < measured["kernels_measured"] and carried["plan_s"] < measured["plan_s"],
    }


# ------------------------------------------------------------------------------------------------ processes


def _child(*argv: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run this module as a subprocess in its child mode; its last output line is a JSON object."""
    out = subprocess.run(
        [sys.executable, "-m", "benches.scale", "--child", *argv],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def second_process() -> dict[str, Any]:
    """A model planned in one process and again in a second one sharing the cache directory."""
    cache = tempfile.mkdtemp(prefix="eqsat-scale-cache-")
    env = {"EQSAT_CACHE_DIR": cache, "EQSAT_PLAN_STORE": "on"}
    first, second = _child("plan_bert", env=env), _child("plan_bert", env=env)
    ratio = first["optimize_s"] / second["optimize_s"]
    return {
        "case": "second_process",
        "model": first["model"],
        "first_process_s": first["optimize_s"],
        "second_process_s": second["optimize_s"],
        "ratio": round(ratio, 1),
        "second_from_store": second["from_store"],
        "bar": ">= 5x less optimization time",
        "holds": ratio >= 5 and bool(second["from_store"]),
    }


def _plan_bert() -> dict[str, Any]:
    from benches.models.registry import MODELS

    work = MODELS["bert"]("full")
    fast = eqsat.optimize(work.fn, params_argnums=work.params_argnums)
    start = time.perf_counter()
    plan = fast.plan(*work.args)
    return {
        "model": work.name,
        "optimize_s": round(time.perf_counter() - start, 3),
        "from_store": "stored" in plan.stats,
    }


def shapes() -> dict[str, Any]:
    """One function called at 60 batch sizes: memory growth against jax.jit's, and plans made with buckets."""
    rows = {mode: _child("shapes", mode) for mode in ("jit", "eqsat", "eqsat_buckets")}
    extra = rows["eqsat"]["rss_growth_mb"] - rows["jit"]["rss_growth_mb"]
    buckets = rows["eqsat_buckets"]
    return {
        "case": "shapes_60",
        **{mode: row for mode, row in rows.items()},
        "eqsat_minus_jit_mb": round(extra, 1),
        "bar": "memory no more than jax.jit's plus the bounded cache (past the cache, each new shape keeps at most "
        "1.1x what jax.jit keeps); with buckets one optimization per bucket",
        "holds": buckets["plans"] <= buckets["buckets_used"]
        and rows["eqsat"]["mb_per_shape_62_to_121"] <= 1.1 * rows["jit"]["mb_per_shape_62_to_121"],
    }


_BUCKETS = (8, 16, 32, 64)
_CACHE_SIZE = 8


def _mlp(params: list[jax.Array], x: jax.Array) -> jax.Array:
    for w in params:
        x = jax.nn.relu(x @ w)
    return x


def _shapes(mode: str) -> dict[str, Any]:
    params = [_normal((256, 256), 1 / 16) for _ in range(6)]
    if mode == "jit":
        fn = jax.jit(_mlp)
    elif mode == "eqsat":
        fn = eqsat.optimize(_mlp, cache_size=_CACHE_SIZE)
    else:
        fn = eqsat.optimize(_mlp, buckets=eqsat.Buckets(_BUCKETS, argnums=(1,)))
    jax.block_until_ready(fn(params, _normal((1, 256))))  # the libraries' own first-use allocations
    before = _settled_rss_mb(fn, params, 1)  # the warm-up's plan is in the cache: the growth below is of 60 shapes
    start, first_calls = time.perf_counter(), []
    for n in range(2, 62):
        x = _normal((n, 256))
        call = time.perf_counter()
        jax.block_until_ready(fn(params, x))
        first_calls.append(time.perf_counter() - call)
    row = {
        "rss_growth_mb": round(_rss_mb() - before, 1),
        "seconds": round(time.perf_counter() - start, 1),
        "median_first_call_ms": round(statistics.median(first_calls) * 1e3, 1),
    }
    if mode == "eqsat_buckets":
        row["plans"] = fn.cache_info()["plans"]
        # the sizes 1..61 (the warm-up call included) fall in every bucket
        row["buckets_used"] = len({eqsat.Buckets(_BUCKETS).bucket(n) for n in range(1, 62)})
    # then 60 shapes more, long after the cache filled: what each new shape keeps
    settled = [_settled_rss_mb(fn, params, 61)]
    for n in range(62, 122):
        jax.block_until_ready(fn(params, _normal((n, 256))))
    settled.append(_settled_rss_mb(fn, params, 121))
    row["mb_per_shape_62_to_121"] = round((settled[1] - settled[0]) / 60, 3)  # with buckets: above the largest
    if mode == "eqsat":
        row["cache_size"] = _CACHE_SIZE
    return row


def _settled_rss_mb(fn: Callable[..., Any], params: list[jax.Array], n: int) -> float:
    """Resident memory once the plan of batch size n is built (it may be, in the background), the garbage
    collected and the allocator's free memory given back (glibc's malloc_trim, where there is one): freed memory
    the allocator holds would read as growth."""
    if hasattr(fn, "plan"):  # eqsat's, with or without buckets
        fn.plan(params, _normal((n, 256)))
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _rss_mb()


def _rss_mb() -> float:
    """Resident memory now, from /proc (the peak from getrusage where there is no /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


CASES: dict[str, Callable[[float], dict[str, Any]]] = {
    "chain_20": lambda s: chain(20, s),
    "chain_50": lambda s: chain(50, s),
    "sum_30": lambda s: shared_sum(30, s),
    "depth_loop": lambda s: depth("loop"),
    "depth_scan": lambda s: depth("scan"),
    "depth_grad": lambda s: depth("grad"),
    "second_process": lambda s: second_process(),
    "shapes_60": lambda s: shapes(),
    **{f"new_shape_{m}": functools.partial(new_shape, m) for m in ("nasnet_a", "resnext50", "squeezenet")},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--seconds", type=float, default=3.0, help="interleaved timing budget per comparison")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # a subprocess's own measurement
    args = parser.parse_args(argv)
    if args.child:
        what, *rest = args.child
        print(json.dumps(_plan_bert() if what == "plan_bert" else _shapes(*rest)), flush=True)
        return 0
    # an empty cache directory, and plans made afresh: what is measured here is planning (second_process keeps
    # plans in a directory of its own)
    os.environ["EQSAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqsat-scale-")
    os.environ["EQSAT_PLAN_STORE"] = "off"
    for name in args.only.split(",") if args.only else CASES:
        print(json.dumps(CASES[name](args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
