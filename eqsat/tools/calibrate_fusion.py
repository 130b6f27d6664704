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
    rows = _loop_contraction_rows(device, probes)
    reads = _matrix_reads(device, probes)
    return {
        "probes": probes,
        "fuses_producers_into": producers,
        "fuses_into_consumers": consumers,
        "copies": copies,
        "loop_contraction_rows": rows,
        "matrix_reads": reads,
    }


_SIBLINGS, _WIDTH = 8, 512  # nasrnn's: eight products of one 512-wide state


def _loop_contraction_rows(device: Any, probes: dict[str, Any]) -> int:
    """The most rows a product of one matrix has where the target still runs it as a loop fused with its siblings:
    eight products of one input, each under a tanh, compiled in fewer fusions than eight (0: none is)."""
    fused = 0
    for rows in (1, 2, 4, 8):
        inputs = [jax.ShapeDtypeStruct((rows, _WIDTH), jnp.float32)]
        inputs += [jax.ShapeDtypeStruct((_WIDTH, _WIDTH), jnp.float32)] * _SIBLINGS
        structs = tpu_check.on_device(inputs, device)
        compiled = _compiled(lambda h, *ws: sum(jnp.tanh(h @ w) for w in ws), structs, f"the {rows}-row products")
        probes[f"siblings/{rows} rows"] = {"fusions": compiled.fusions, "products": _SIBLINGS}
        if compiled.fusions >= _SIBLINGS:
            break
        fused = rows
    return fused


def _matrix_reads(device: Any, probes: dict[str, Any]) -> float:
    """How often XLA's count reads the matrix of an 8-row product: its bytes beyond the rows and the result, in
    matrices."""
    rows, matrix = jax.ShapeDtypeStruct((8, _WIDTH), jnp.float32), jax.ShapeDtypeStruct((_WIDTH, _WIDTH), jnp.float32)
    compiled = _compiled(lambda a, w: a @ w, tpu_check.on_device([rows, matrix], device), "the 8-row product")
    beyond = compiled.bytes - 2 * value_bytes(rows.shape, "float32")
    reads = round(beyond / value_bytes(matrix.shape, "float32"), 2)
    probes["products/8 rows"] = {"bytes": compiled.bytes, "matrix reads": reads}
    return reads


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
        "loop_contraction_rows": found["loop_contraction_rows"],
        "matrix_reads": found["matrix_reads"],
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
        if "fusions" in probe:
            lines.append(f"  {name:28s} {probe['products']} products of one input in {probe['fusions']} fusions")
            continue
        if "matrix reads" in probe:
            lines.append(f"  {name:28s} {probe['bytes']:.4g} bytes: the matrix read {probe['matrix reads']:g} times")
            continue
        beyond = probe["beyond"] / 2**20
        of = f"inputs {probe['inputs'] / 2**20:.2f}" if "inputs" in probe else ""
        of = of or f"intermediate {probe['intermediate'] / 2**20:.2f}"
        lines.append(f"  {name:28s} {beyond:6.2f} MiB beyond arguments and result, {of} MiB")
    lines.append(f"  fuses producers into {', '.join(profile['fuses_producers_into']) or 'none'}")
    lines.append(f"  fuses into consumers {', '.join(profile['fuses_into_consumers']) or 'none'}")
    copies = ", ".join(f"{k} {v:g}" for k, v in profile["layout_copies"].items())
    lines.append(f"  layout copies        {copies} (share of the op's inputs)")
    rows = profile["loop_contraction_rows"]
    lines.append(f"  loops, not kernels   products of at most {rows} row(s), fused with their siblings")
    lines.append(f"  matrix reads         {profile['matrix_reads']:g} per product of more rows")
    return "\n".join(lines)
