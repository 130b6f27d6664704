"""What a TPU fuses, measured by XLA's own TPU compiler on this machine without one: the lists of the device
profile that eqsat's memory model reads (backends/fusion.py), and the layout copies it makes around each heavy op.

    python -m eqsat calibrate --target tpu-v5e      # needs libtpu, the optional extra `tpu-aot`; seconds

For each cost class of heavy op, two small programs are compiled for the target's topology deviceless: an
elementwise producer read by the op (`op(exp(x))`), and the op's value read by an elementwise consumer
(`tanh(op(x))`), beside the op alone. The intermediate value is fused where the program needs less memory beyond its
arguments and result than the op alone needs plus half the intermediate's size (XLA's peak: a TPU's temp bytes,
deviceless, leave out intermediate buffers). What the op alone needs beyond its arguments and result, as a share of
its inputs' bytes, is the layout copies the target makes around it (a TPU relays out a dot's operand). The lists are
written to the user cache as the target's calibrated profile (eqsat/extract/cost.py load_profile merges them over
the bundled one).
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


# cost class -> the op as a function of x (and w, a second matrix), each a heavy op of that class, and whether it
# reads w
_HEAVY: dict[CostClass, tuple[Callable[[Any, Any], Any], bool]] = {
    CostClass.CONTRACTION: (lambda x, w: x @ w, True),
    CostClass.WINDOW: (lambda x, w: _pool(x), False),
    CostClass.GATHER: (lambda x, w: jnp.take_along_axis(x, (w[:, : _SIDE // 2] > 0).astype(jnp.int32) * 7, 1), True),
    CostClass.CHECKED_GATHER: (lambda x, w: x[jnp.arange(0, _SIDE, 2)], False),
    CostClass.REDUCTION: (lambda x, w: jnp.cumsum(x, axis=1), False),
}


def measure(target: str) -> dict[str, Any]:
    """Each heavy class's probes compiled for the target's TPU topology: the op alone (what it needs beyond its
    inputs and result: layout copies, as a share of its inputs' bytes), under an elementwise producer and over an
    elementwise consumer (what each needs beyond its arguments and result, against the intermediate's size), and the
    three results."""
    device = tpu_check.tpu_device(tpu_check.topology_of(target))
    square = jax.ShapeDtypeStruct((_SIDE, _SIDE), jnp.float32)
    structs = tpu_check.on_device([square, square], device)
    size = value_bytes(square.shape, "float32")
    probes, producers, consumers, copies = {}, [], [], {}
    for cost_class, (op, reads_w) in _HEAVY.items():
        after = jax.eval_shape(op, square, square)
        alone = _compiled(op, structs, f"the {cost_class} probe")
        beyond, inputs = alone.peak - alone.resident, size * (1 + reads_w)
        copies[str(cost_class)] = round(max(beyond, 0) / inputs, 3)
        probes[f"{cost_class}/alone"] = {"beyond": beyond, "inputs": inputs}
        for side, probe, between, fused in (
            ("producer", lambda x, w, op=op: op(jnp.exp(x), w), size, producers),
            ("consumer", lambda x, w, op=op: jnp.tanh(op(x, w)), value_bytes(after.shape, str(after.dtype)), consumers),
        ):
            compiled = _compiled(probe, structs, f"the {cost_class} {side} probe")
            probes[f"{cost_class}/{side}"] = {"beyond": compiled.peak - compiled.resident, "intermediate": between}
            if compiled.peak - compiled.resident < beyond + between / 2:  # no buffer for the intermediate
                fused.append(str(cost_class))
    return {"probes": probes, "fuses_producers_into": producers, "fuses_into_consumers": consumers, "copies": copies}


def _compiled(probe: Callable[..., Any], structs: list[Any], what: str) -> tpu_check.Compiled:
    compiled = tpu_check.compile_figures(lambda: jax.jit(probe).lower(*structs))
    if compiled.error:
        raise tpu_check.TpuCompilerMissing(f"{what} did not compile: {compiled.error}")
    return compiled


def calibrate_fusion(target: str, out: str | Path | None = None) -> dict[str, Any]:
    """Measure what the target fuses and write it as the target's calibrated profile (default: the user cache);
    the profile as written, with its path."""
    load_bundled(target)  # an unknown target fails here, before libtpu is loaded
    found = measure(target)
    profile = {
        "name": target,
        "fuses_producers_into": found["fuses_producers_into"],
        "fuses_into_consumers": found["fuses_into_consumers"],
        "layout_copies": found["copies"],
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
        beyond = probe["beyond"] / 2**20
        of = f"inputs {probe['inputs'] / 2**20:.2f}" if "inputs" in probe else ""
        of = of or f"intermediate {probe['intermediate'] / 2**20:.2f}"
        lines.append(f"  {name:28s} {beyond:6.2f} MiB beyond arguments and result, {of} MiB")
    lines.append(f"  fuses producers into {', '.join(profile['fuses_producers_into']) or 'none'}")
    lines.append(f"  fuses into consumers {', '.join(profile['fuses_into_consumers']) or 'none'}")
    copies = ", ".join(f"{k} {v:g}" for k, v in profile["layout_copies"].items())
    lines.append(f"  layout copies        {copies} (share of the op's inputs)")
    return "\n".join(lines)
