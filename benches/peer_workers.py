"""What one worker of benches/peers.py runs: one model under one framework, alone in its process.

torch and torchvision are imported inside the torch functions, so that benches/peers.py (and its tests) load
without them.
"""

import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# the peers' names for the four CNNs: torchvision's builder, keras.applications' class
MODELS: dict[str, tuple[str, str]] = {
    "MobileNetV2": ("mobilenet_v2", "MobileNetV2"),
    "EfficientNetB0": ("efficientnet_b0", "EfficientNetB0"),
    "MobileNetV3Small": ("mobilenet_v3_small", "MobileNetV3Small"),
    "ConvNeXtTiny": ("convnext_tiny", "ConvNeXtTiny"),
}
TORCH_COMPILE_MODES = {"compile": None, "max-autotune": "max-autotune"}  # our mode name: torch.compile's mode
TORCH_MODES = ("eager", *TORCH_COMPILE_MODES)
JAX_MODES = ("jax", "eqsat")
MODES = (*TORCH_MODES, *JAX_MODES)
MEMORY_FORMATS = ("contiguous", "channels_last")
WARM_UP = "warm-up"  # the worker mode that builds what torch.compile keeps once per machine
WARMUP_CALLS = 3  # after the first call: caches and allocators settle before timing
MIN_CALLS = 5  # a median of at least this many calls, however slow the model
SEED = 0


@dataclass(frozen=True)
class Settings:
    """What every worker of one bench run shares."""

    batch: int = 2
    size: int = 224
    seconds: float = 5.0  # timed calls run for this long
    threads: int = 2
    max_compile: float = 600.0  # a first call (compile, or eqsat's plan) longer than this is given up


def pin_threads(threads: int) -> None:
    """Keep this process to `threads` CPUs: XLA sizes its thread pool by the CPUs it may use, and torch is told too,
    so every framework gets the same share of the machine."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, allowed[:threads])


def until_ready(first_call: Callable[[], object], limit: float, what: str) -> float:
    """Seconds the first call (compiling, planning) took. A compile cannot be interrupted from Python, so past
    `limit` a timer prints the worker's answer, a skip, and ends the process."""

    def give_up() -> None:
        print(json.dumps({"skipped": f"{what} exceeded {limit:g} s"}), flush=True)
        os._exit(0)

    timer = threading.Timer(limit, give_up)
    timer.daemon = True
    start = time.perf_counter()
    timer.start()
    try:
        first_call()
    finally:
        timer.cancel()
    return time.perf_counter() - start


def latency_ms(call: Callable[[], object], seconds: float) -> tuple[float, int]:
    """Median milliseconds of one call over `seconds` of calls (at least MIN_CALLS), and how many ran."""
    for _ in range(WARMUP_CALLS):
        call()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < MIN_CALLS:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, len(times)


def torch_run(mode: str, model: str, memory_format: str, settings: Settings) -> dict[str, Any]:
    """torchvision's model, random init, eval, under inference_mode: eager or torch.compile in `mode`."""
    import torch
    import torchvision

    torch.set_num_threads(settings.threads)
    torch.manual_seed(SEED)
    net = getattr(torchvision.models, MODELS[model][0])(weights=None).eval()
    x = torch.randn(settings.batch, 3, settings.size, settings.size)
    if memory_format == "channels_last":
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    compiled = mode in TORCH_COMPILE_MODES
    run = torch.compile(net, mode=TORCH_COMPILE_MODES[mode]) if compiled else net
    what = f"torch.compile's {TORCH_COMPILE_MODES[mode] or 'default'} compile" if compiled else "first eager call"
    with torch.inference_mode():
        first_s = until_ready(lambda: run(x), settings.max_compile, what)
        median, calls = latency_ms(lambda: run(x), settings.seconds)
    return {"first_call_s": first_s, "median_ms": median, "calls": calls, "version": f"torch {torch.__version__}"}


def jax_run(mode: str, model: str, settings: Settings) -> dict[str, Any]:
    """keras.applications' model (KERAS_BACKEND=jax), random init, inference: under jax.jit, or eqsat's plan once
    the guard has settled (the plan's first call, its building, validating and timing all in `first_call_s`)."""
    import jax

    import eqsat
    from benches.models.keras_apps import keras_app
    from eqsat.tools.versus import settled

    work = keras_app(model, MODELS[model][1], size=settings.size, batch=settings.batch)
    row: dict[str, Any] = {"version": f"jax {jax.__version__}"}
    run = jax.jit(work.fn) if mode == "jax" else eqsat.optimize(work.fn)

    def first_call() -> None:
        start = time.perf_counter()
        jax.block_until_ready(run(*work.args))
        row["call_s"] = time.perf_counter() - start  # eqsat's runs the original while the plan is built
        if mode == "eqsat":  # the plan awaited and settled: what the timed calls run from then on
            row["plan"] = _plan_row(settled(run, work.args))

    row["first_call_s"] = until_ready(first_call, settings.max_compile, "eqsat's plan" if mode == "eqsat" else "jit")
    row["median_ms"], row["calls"] = latency_ms(lambda: jax.block_until_ready(run(*work.args)), settings.seconds)
    return row


def _plan_row(plan: Any) -> dict[str, Any]:
    """What runs after the guard's decision, and the guard's own measurement of plan against original."""
    measured = plan.measured or {}
    runs_plan = plan.fallback is None and bool(measured.get("kept", plan.rewritten_ops()))
    return {
        "runs": "plan" if runs_plan else "original",
        "guard_ratio": round(measured["ratio"], 3) if "ratio" in measured else None,
        "fallback": plan.fallback,
    }


def warm_up_torch() -> dict[str, Any]:
    """One tiny torch.compile: inductor builds its precompiled torch headers, once per machine and kept outside the
    workers' cache directories, so that no model's cold compile pays for them and every one pays the same."""
    import torch

    with torch.inference_mode():
        torch.compile(lambda x: torch.relu(x) * 2)(torch.randn(64))
    return {"warmed": True}


def worker_main(mode: str, model: str, memory_format: str, settings: Settings) -> int:
    """Run one measurement in this process and print it as one JSON line."""
    pin_threads(settings.threads)
    os.environ["KERAS_BACKEND"] = "jax"
    if mode == WARM_UP:
        row = warm_up_torch()
    elif mode in TORCH_MODES:
        row = torch_run(mode, model, memory_format, settings)
    else:
        row = jax_run(mode, model, settings)
    print(json.dumps(row, default=str), flush=True)
    return 0
