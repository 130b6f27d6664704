"""Measure this machine through jax.jit and write a calibrated `cpu` device profile to the user cache.

    python -m eqsat calibrate [--seconds 60] [--out PATH]

What is measured, each as the median of repeated jitted calls (eqsat.numerics.measure.median_time):
- the fixed cost of one jitted call (a tiny elementwise op), subtracted from every other figure;
- GEMM throughput per dtype at a few sizes (the best is the peak), and how GEMVs and small GEMMs do;
- convolution throughput (NHWC x HWIO) on a few typical layer shapes;
- bandwidth of a streaming elementwise op (x*2+1) at several working-set sizes (cache and memory);
- the per-kernel overhead (a chain of small reductions) and the per-dot overhead (a chain of tiny dots).

Then a per-contraction overhead is fitted so that max(flops/peak, bytes/bandwidth) + overhead matches the
measured GEMMs and GEMVs best (median absolute error in log time); the fit's error is stored next to the plain
roofline's, so one can see what the extra term buys.
"""

import datetime
import json
import os
import platform
import time
from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat.extract.cost import Profile, calibrated_path, load_bundled
from eqsat.numerics.measure import median_time

_GEMM_SIZES = (256, 512, 1024)
_GEMV_SHAPES = ((1, 1024, 1024), (1, 2048, 2048), (8, 1024, 1024), (64, 512, 512))  # (M, K, N)
_SMALL_SHAPES = ((16, 16, 16), (32, 32, 32), (64, 64, 64), (128, 128, 128))
_CONV_SHAPES = (  # (N, H, W, C_in), (KH, KW, C_in, C_out)
    ((1, 56, 56, 64), (3, 3, 64, 64)),
    ((1, 28, 28, 128), (3, 3, 128, 128)),
    ((8, 32, 32, 32), (3, 3, 32, 32)),
    ((1, 56, 56, 64), (1, 1, 64, 256)),
)
_BANDWIDTH_MB = (1, 4, 16, 64)
_CHAIN = 64  # ops in the overhead chains
_NARROW_CHAIN = 4  # steps (multiply, add, tanh) of the bfloat16 chain whose roundings are timed


def calibrate(seconds_budget: float = 60, out: str | Path | None = None, scale: float = 1.0) -> dict[str, Any]:
    """Measure this machine and write the profile JSON (default: the user cache, see extract.cost).

    scale < 1 shrinks every problem size (tests use it); the budget bounds the timing, not compilation.
    Returns the profile as written, with the raw measurements under "calibration".
    """
    start = time.perf_counter()
    per = max(0.02, 0.6 * seconds_budget / 40)  # ~40 timed functions; the rest of the budget compiles them
    dims = _scaled(scale)

    call = median_time(jax.jit(lambda x: x * 2 + 1), (jnp.ones(4, jnp.float32),), per)

    def kernel(fn: Callable[..., Any], *args: Any) -> float:
        """Seconds per call, less the fixed cost of a jitted call."""
        return max(median_time(jax.jit(fn), args, per) - call, 1e-9)

    bandwidth = [_copy_rate(kernel, mb) for mb in dims["bandwidth_mb"]]
    gemm, peak = _gemms(kernel, dims["gemm"], per)
    shapes = [*dims["gemv"], *dims["small"]]
    dots = [r for r in (_dot(kernel, s, "float32") for s in shapes) if r is not None]
    conv = [_conv_rate(kernel, xs, ws) for xs, ws in dims["conv"]]

    # per-kernel overhead: a dependent chain of small reductions (XLA cannot fuse a reduce into its consumer's
    # producer here); per-dot overhead: a chain of tiny dots. Both as (chain - single) / (n - 1).
    small = jnp.ones((8, 8), jnp.float32)
    launch = (kernel(_reduce_chain(_CHAIN), small) - kernel(_reduce_chain(1), small)) / (_CHAIN - 1)
    tiny_dot = (kernel(_dot_chain(_CHAIN), small, small) - kernel(_dot_chain(1), small, small)) / (_CHAIN - 1)

    rounding = _narrow_rounding(kernel, max(1024, int(dims["bandwidth_mb"][1] * 2**20 / 4)))
    base = load_bundled("cpu")
    bw, cache_bw, cache_bytes = _bandwidth_levels(bandwidth)
    peak_f32 = peak.get("float32", max(peak.values()))
    conv_ratio = max(r["flops_per_s"] for r in conv) / peak_f32
    draft = Profile(
        name="cpu",
        description=f"XLA:CPU calibrated on {platform.node()} ({os.cpu_count()} cpus) by `python -m eqsat calibrate`",
        peak_flops={**{k: v for k, v in base.peak_flops.items() if k not in peak}, **peak},
        bandwidth=bw,
        launch_overhead=max(launch, 1e-8),
        fuses_elementwise=base.fuses_elementwise,
        disabled_rules=base.disabled_rules,
        notes=base.notes,
        conv_peak_flops={dt: f * conv_ratio for dt, f in {**base.peak_flops, **peak}.items()},
        cache_bandwidth=cache_bw,
        cache_bytes=cache_bytes,
        call_overhead=call,
    )
    overhead, fit = _fit_contraction_overhead(draft, gemm + dots)
    measured = {"tiny_dot_overhead": tiny_dot, "fit": fit, "bandwidth": bandwidth, "gemm": gemm, "dots": dots}
    profile = _profile_json(draft, overhead, rounding, scale, time.perf_counter() - start, {**measured, "conv": conv})
    path = Path(out) if out is not None else calibrated_path("cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=1, default=_jsonable))
    profile["path"] = str(path)
    return profile


def _profile_json(
    draft: Profile, overhead: float, rounding: float, scale: float, seconds: float, measured: dict[str, Any]
) -> dict[str, Any]:
    """The calibrated profile as written: the draft's fields, the fitted overheads, and the raw measurements under
    "calibration"."""
    profile = {
        name: getattr(draft, name)
        for name in ("name", "description", "peak_flops", "bandwidth", "launch_overhead", "fuses_elementwise")
    }
    profile.update(
        contraction_overhead=overhead,
        conv_peak_flops=draft.conv_peak_flops,
        cache_bandwidth=draft.cache_bandwidth,
        cache_bytes=draft.cache_bytes,
        call_overhead=draft.call_overhead,
        narrow_rounding=rounding,
        calibration={
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()} {platform.processor()} cpus={os.cpu_count()}",
            "jax": jax.__version__,
            "scale": scale,
            "seconds": round(seconds, 1),
            **measured,
        },
    )
    return profile


def _copy_rate(kernel: Callable[..., float], mb: float) -> dict[str, float]:
    """Bandwidth of an elementwise pass over `mb` megabytes (read and written)."""
    x = jnp.ones(max(1024, int(mb * 2**20 / 4)), jnp.float32)
    t = kernel(lambda x: x * 2 + 1, x)
    return {"bytes": 2 * x.nbytes, "seconds": t, "bytes_per_s": 2 * x.nbytes / t}


def _gemms(kernel: Callable[..., float], sizes: list[int], per: float) -> tuple[list[dict], dict[str, float]]:
    """Square GEMMs of each size and dtype, and each dtype's best rate; a slow (emulated) dtype stops early, where
    larger sizes would blow the budget."""
    gemm, peak = [], {}
    for dtype in ("float32", "float64", "bfloat16"):
        for n in sizes:
            row = _dot(kernel, (n, n, n), dtype)
            if row is None:
                break
            gemm.append(row)
            peak[dtype] = max(peak.get(dtype, 0.0), row["flops_per_s"])
            if row["seconds"] > per / 4:
                break
    return gemm, peak


def _conv_rate(kernel: Callable[..., float], xs: tuple[int, ...], ws: tuple[int, ...]) -> dict[str, Any]:
    x, w = jnp.ones(xs, jnp.float32), jnp.ones(ws, jnp.float32) * 0.01
    t = kernel(_conv, x, w)
    flops = 2 * prod(xs[:3]) * prod(ws)  # SAME, stride 1: output N*H*W*C_out, each KH*KW*C_in
    return {"x": xs, "w": ws, "seconds": t, "flops_per_s": flops / t}


def summary(profile: dict[str, Any]) -> str:
    """What was measured, for the command line."""
    cal = profile["calibration"]
    lines = [f"calibrated profile written to {profile.get('path')} ({cal['seconds']} s)"]
    lines.append(
        "  peak GEMM       " + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in profile["peak_flops"].items())
    )
    lines.append(
        "  conv            "
        + ", ".join(f"{r['w'][:2]}x{r['w'][2]}->{r['w'][3]} {r['flops_per_s'] / 1e9:.0f}" for r in cal["conv"])
        + " GFLOP/s"
    )
    lines.append(
        "  GEMV/small GEMM "
        + ", ".join(f"{'x'.join(map(str, r['shape']))} {r['efficiency']:.0%}" for r in cal["dots"])
        + " of peak"
    )
    lines.append(
        "  bandwidth       "
        + ", ".join(f"{r['bytes'] / 2**20:.1f} MiB {r['bytes_per_s'] / 1e9:.1f}" for r in cal["bandwidth"])
        + " GB/s"
    )
    cache = profile["cache_bandwidth"]
    lines.append(
        f"  roofline        memory {profile['bandwidth'] / 1e9:.1f} GB/s"
        + (f", cache {cache / 1e9:.1f} GB/s up to {profile['cache_bytes'] / 2**20:.1f} MiB" if cache else "")
    )
    fit, us = cal["fit"], 1e6
    lines.append(
        f"  overheads       call {profile['call_overhead'] * us:.2f} us,"
        f" kernel {profile['launch_overhead'] * us:.2f} us,"
        f" tiny dot {cal['tiny_dot_overhead'] * us:.2f} us,"
        f" fitted per contraction {profile['contraction_overhead'] * us:.2f} us,"
        f" bfloat16 rounding {profile['narrow_rounding'] * 1e9:.2f} ns per element"
    )
    lines.append(
        f"  contraction fit median |log10 error| {fit['median_abs_log10_fitted']:.3f}"
        f" (plain roofline {fit['median_abs_log10_roofline']:.3f})"
    )
    return "\n".join(lines)


def _narrow_rounding(kernel: Callable[..., float], size: int) -> float:
    """Seconds per element XLA spends rounding each op of a bfloat16 elementwise chain: the chain as written against
    the same chain computed in float32 and rounded once, per element and rounding saved."""
    x = jnp.linspace(-3, 3, size, dtype=jnp.bfloat16)

    def chain(v: jax.Array) -> jax.Array:
        for _ in range(_NARROW_CHAIN):
            v = jnp.tanh(v * 1.5 + 0.25)
        return v

    saved = kernel(chain, x) - kernel(lambda v: chain(v.astype(jnp.float32)).astype(jnp.bfloat16), x)
    return max(saved, 0.0) / (size * (3 * _NARROW_CHAIN - 1))


def _scaled(scale: float) -> dict[str, Any]:
    def n(v: int) -> int:
        return max(4, round(v * scale / 4) * 4)

    return {
        "gemm": sorted({n(s) for s in _GEMM_SIZES}),
        "gemv": [(m, n(k), n(nn)) if m == 1 else (n(m), n(k), n(nn)) for m, k, nn in _GEMV_SHAPES],
        "small": [tuple(n(d) for d in s) for s in _SMALL_SHAPES] if scale < 1 else list(_SMALL_SHAPES),
        "conv": [
            ((x[0], n(x[1]), n(x[2]), x[3]), w) if scale < 1 else (x, w)
            for x, w in _CONV_SHAPES[: 2 if scale < 1 else None]
        ],
        "bandwidth_mb": [mb * scale for mb in _BANDWIDTH_MB],
    }


def _dot(kernel: Callable[..., float], shape: tuple[int, int, int], dtype: str) -> dict[str, Any] | None:
    """One (M, K) x (K, N) product timed; None if the dtype does not run here."""
    m, k, n = shape
    with jax.enable_x64(dtype == "float64"):
        try:
            a, b = jnp.ones((m, k), dtype), jnp.ones((k, n), dtype)
            t = kernel(lambda a, b: a @ b, a, b)
        except Exception:
            return None
    flops, moved = 2 * m * k * n, (m * k + k * n + m * n) * np.dtype(a.dtype).itemsize
    return {"shape": shape, "dtype": dtype, "flops": flops, "bytes": moved, "seconds": t, "flops_per_s": flops / t}


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _reduce_chain(n: int) -> Callable[[jax.Array], jax.Array]:
    def f(x: jax.Array) -> jax.Array:
        for _ in range(n):
            x = x - jnp.sum(x, axis=1, keepdims=True) * 0.1
        return x

    return f


def _dot_chain(n: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        for _ in range(n):
            x = jnp.tanh(x @ w)
        return x

    return f


def _bandwidth_levels(rows: list[dict[str, Any]]) -> tuple[float, float | None, float]:
    """Memory bandwidth (the largest working set), and cache bandwidth with the size up to which it holds."""
    memory = rows[-1]["bytes_per_s"]
    cached = [r for r in rows[:-1] if r["bytes_per_s"] > 1.5 * memory]
    if not cached:
        return memory, None, 0.0
    best = max(r["bytes_per_s"] for r in cached)
    return memory, best, float(max(r["bytes"] for r in cached if r["bytes_per_s"] >= 0.5 * best))


def _fit_contraction_overhead(profile: Profile, rows: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    """The per-contraction overhead c minimising the median absolute log error of max(flops/peak, bytes/bw) + c."""
    roof = np.array(
        [
            max(r["flops"] / profile.flops_per_second(r["dtype"]), r["bytes"] / profile.bandwidth_for(r["bytes"]))
            for r in rows
        ]
    )
    measured = np.array([r["seconds"] for r in rows])

    def error(c: float) -> float:
        return float(np.median(np.abs(np.log10((roof + c) / measured))))  # robust: one GEMV off-roof skews no fit

    candidates = np.concatenate([[0.0], np.geomspace(1e-8, 1e-4, 161)])
    best = float(min(candidates, key=error))
    for r, t in zip(rows, roof, strict=True):
        r["efficiency"] = float(t / r["seconds"])  # measured fraction of the roofline (1 = at the roof)
        r["predicted_s"] = float(t + best)
    fit = {
        "median_abs_log10_fitted": error(best),
        "median_abs_log10_roofline": error(profile.launch_overhead),
        "samples": len(rows),
    }
    return best, fit


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")
