"""What a TPU fuses, measured by XLA's own TPU compiler on this machine without one: the two lists of the device
profile that eqsat's memory model reads (backends/fusion.py).

    python -m eqsat calibrate --target tpu-v5e      # needs libtpu, the optional extra `tpu-aot`; seconds

For each cost class of heavy op, two small programs are compiled for the target's topology deviceless: an
elementwise producer read by the op (`op(exp(x))`), and the op's value read by an elementwise consumer
(`tanh(op(x))`). The intermediate value is fused where the buffer assigner gives the program less temp memory than
half its size. The lists are written to the user cache as the target's calibrated profile (eqsat/extract/cost.py
load_profile merges them over the bundled one).
"""

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from eqsat.extract.cost import calibrated_path, load_bundled, value_bytes
from eqsat.ops.table import CostClass
from eqsat.tools import tpu_check

_SIDE = 1024  # probes over 1024x1024 float32: 4 MiB intermediates, compiled in a second or two each


def _pool(x: Any) -> Any:
    return lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID")


# cost class -> the op as a function of x (and w, a second matrix), each a heavy op of that class
_HEAVY: dict[CostClass, Callable[[Any, Any], Any]] = {
    CostClass.CONTRACTION: lambda x, w: x @ w,
    CostClass.WINDOW: lambda x, w: _pool(x),
    CostClass.GATHER: lambda x, w: jnp.take_along_axis(x, (w[:, : _SIDE // 2] > 0).astype(jnp.int32) * 7, axis=1),
    CostClass.CHECKED_GATHER: lambda x, w: x[jnp.arange(0, _SIDE, 2)],
    CostClass.REDUCTION: lambda x, w: jnp.cumsum(x, axis=1),
}


def measure(target: str) -> dict[str, Any]:
    """Each heavy class's two probes compiled for the target's TPU topology: the temp bytes each needed, the
    intermediate's size, and the two lists."""
    device = tpu_check.tpu_device(tpu_check.topology_of(target))
    square = jax.ShapeDtypeStruct((_SIDE, _SIDE), jnp.float32)
    structs = tpu_check.on_device([square, square], device)
    probes, producers, consumers = {}, [], []
    for cost_class, op in _HEAVY.items():
        after = jax.eval_shape(op, square, square)
        for side, probe, size, fused in (
            ("producer", lambda x, w, op=op: op(jnp.exp(x), w), value_bytes(square.shape, "float32"), producers),
            ("consumer", lambda x, w, op=op: jnp.tanh(op(x, w)), value_bytes(after.shape, str(after.dtype)), consumers),
        ):
            compiled = tpu_check.compile_figures(lambda probe=probe: jax.jit(probe).lower(*structs))
            if compiled.error:
                raise tpu_check.TpuCompilerMissing(f"the {cost_class} {side} probe did not compile: {compiled.error}")
            probes[f"{cost_class}/{side}"] = {"temp": compiled.temp, "intermediate": size}
            if compiled.temp < size / 2:
                fused.append(str(cost_class))
    return {"probes": probes, "fuses_producers_into": producers, "fuses_into_consumers": consumers}


def calibrate_fusion(target: str, out: str | Path | None = None) -> dict[str, Any]:
    """Measure what the target fuses and write it as the target's calibrated profile (default: the user cache);
    the profile as written, with its path."""
    load_bundled(target)  # an unknown target fails here, before libtpu is loaded
    found = measure(target)
    profile = {
        "name": target,
        "fuses_producers_into": found["fuses_producers_into"],
        "fuses_into_consumers": found["fuses_into_consumers"],
        "calibration": {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "compiler": f"libtpu, deviceless for {tpu_check.topology_of(target)}",
            "jax": jax.__version__,
            "probes": found["probes"],
        },
    }
    path = Path(out) if out is not None else calibrated_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=1))
    return {**profile, "path": str(path)}


def summary(profile: dict[str, Any]) -> str:
    """What was measured, for the command line."""
    lines = [f"calibrated fusion of {profile['name']} written to {profile['path']}"]
    for name, probe in profile["calibration"]["probes"].items():
        lines.append(
            f"  {name:28s} temp {probe['temp'] / 2**20:6.2f} MiB, intermediate {probe['intermediate'] / 2**20:.2f} MiB"
        )
    lines.append(f"  fuses producers into {', '.join(profile['fuses_producers_into']) or 'none'}")
    lines.append(f"  fuses into consumers {', '.join(profile['fuses_into_consumers']) or 'none'}")
    return "\n".join(lines)
