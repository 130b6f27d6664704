"""The cost model: a roofline per op class, priced against a device profile (a data file).

XLA fuses elementwise chains into their neighbours, so an elementwise op is priced as the memory pass of its
output and no kernel of its own; contractions cost max(compute, memory) plus a kernel launch.
"""

import json
from dataclasses import dataclass
from importlib import resources
from math import prod
from pathlib import Path

import numpy as np

from eqsat.ops import OPS, contraction_flops

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    peak_flops: dict[str, float]
    bandwidth: float
    launch_overhead: float
    fuses_elementwise: bool
    disabled_rules: tuple[str, ...] = ()  # rule groups that do not pay on this target, as measured
    notes: str = ""

    def flops_per_second(self, dtype: str) -> float:
        return self.peak_flops.get(dtype, min(self.peak_flops.values()))


@dataclass(frozen=True)
class Cost:
    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    kernels: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.seconds + other.seconds,
            self.flops + other.flops,
            self.bytes + other.bytes,
            self.kernels + other.kernels,
        )


def profile_names() -> list[str]:
    return sorted(Path(e.name).stem for e in resources.files("extract").joinpath("profiles").iterdir())


def load_profile(target: str | Profile) -> Profile:
    if isinstance(target, Profile):
        return target
    entry = resources.files("extract").joinpath("profiles", f"{target}.json")
    if not entry.is_file():
        raise ValueError(f"unknown target {target!r}; the device profiles are {profile_names()}")
    data = json.loads(entry.read_text())
    data["disabled_rules"] = tuple(data.get("disabled_rules", ()))
    return Profile(**data)


def node_cost(
    op: str, in_shapes: list[Shape | None], out_shape: Shape | None, dtype: str | None, profile: Profile
) -> Cost:
    """The predicted cost of one node; in_shapes are its tensor inputs' shapes."""
    itemsize = _itemsize(dtype)
    out_bytes = prod(out_shape) * itemsize if out_shape is not None else 0
    in_bytes = sum(prod(s) * itemsize for s in in_shapes if s is not None)
    cost_class = OPS[op].cost_class if op in OPS else ("opaque" if op == "Op" else "source")
    if cost_class == "source":
        return Cost()
    if cost_class == "elementwise":
        kernels = 0 if profile.fuses_elementwise else 1
        seconds = out_bytes / profile.bandwidth + kernels * profile.launch_overhead
        return Cost(seconds, float(prod(out_shape or ())), out_bytes, kernels)
    if cost_class == "contraction":
        assert out_shape is not None and in_shapes[0] is not None
        flops = float(contraction_flops(in_shapes, out_shape))
        moved = in_bytes + out_bytes
        seconds = max(flops / profile.flops_per_second(dtype or "float32"), moved / profile.bandwidth)
        return Cost(seconds + profile.launch_overhead, flops, moved, 1)
    # opaque primitives: one pass over their data, one kernel
    moved = in_bytes + out_bytes
    return Cost(moved / profile.bandwidth + profile.launch_overhead, 0.0, moved, 1)


def _itemsize(dtype: str | None) -> int:
    try:
        return np.dtype(dtype).itemsize if dtype else 4
    except TypeError:  # jax's extended dtypes (PRNG keys): priced as one word
        return 4
