"""The cost model: a roofline per cost class (PRICES: one pricing function each), against a device profile (a
data file), with measured kernel times from the timing cache where it has them.

XLA fuses elementwise chains into their neighbours, so an elementwise op is priced as the memory pass of its
output and no kernel of its own; contractions cost max(compute, memory) plus a kernel launch.
"""

import contextlib
import fcntl
import functools
import json
import logging
import os
import secrets
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from eqsat.ops.table import CONV, OPS, CostClass, PoolAttrs, contraction_flops
from eqsat.support.errors import EqsatWarning

Shape = tuple[int, ...]
log = logging.getLogger("eqsat")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    peak_flops: dict[str, float]
    bandwidth: float
    launch_overhead: float
    fuses_elementwise: bool
    # activations a GEMM runs in its epilogue with the bias add (cuBLASLt: relu; TPU output fusion: any); empty: none
    epilogue_activations: tuple[str, ...] = ()
    disabled_rules: tuple[str, ...] = ()  # rule groups that do not pay on this target, as measured
    notes: str = ""
    # Measured by `python -m eqsat calibrate` (eqsat/tools/calibrate.py); the defaults keep older profiles as they were.
    contraction_overhead: float | None = None  # fixed seconds per dot/conv kernel; None: launch_overhead
    conv_peak_flops: dict[str, float] | None = None  # convolutions reach less than GEMMs on CPUs; None: peak_flops
    cache_bandwidth: float | None = None  # bandwidth while a node's bytes fit in cache_bytes
    cache_bytes: float = 0.0
    min_gain: float = 0.05  # predicted gains below this fraction are within the model's error: keep the original
    call_overhead: float = 0.0  # fixed seconds per jitted call: the same for every plan, so not priced per node
    # the device whose timing cache (extract/timing.py) prices this target's contractions, as local_device() names it
    timing_device: str = ""
    # how much faster a measured alternative kernel must be than the one it replaces (ResNeXt-50's grouped convs as
    # patches measured 1.0-1.2x alone and made the model 0.79x of jax.jit in context)
    switch_margin: float = 1.3
    # seconds per element a bfloat16 or float16 elementwise op spends on rounding its result (XLA:CPU computes each
    # in float32 and rounds it back); 0: the target computes them natively, and no chain is widened (extract/widen.py)
    narrow_rounding: float = 0.0
    # cost classes the target fuses an elementwise producer into, and those whose values it fuses into their
    # elementwise consumers (an output fusion): the memory model keeps such values in no buffer (backends/fusion.py);
    # measured by XLA's own compiler for the target (`python -m eqsat calibrate --target tpu-v5e`); empty: none
    fuses_producers_into: tuple[str, ...] = ()
    fuses_into_consumers: tuple[str, ...] = ()
    # cost class -> the bytes the target copies its inputs into while such an op runs (another layout: a TPU relays
    # out a dot's operand), as a share of the op's inputs' bytes; measured by the same command; empty: none
    layout_copies: dict[str, float] = field(default_factory=dict)
    topology: str = ""  # a TPU's: the topology XLA's TPU compiler compiles this target's plans for, deviceless
    # a row product (OpSpec.row_product) of at most this many rows (a GEMV's one) runs as a loop the target fuses with
    # its siblings and elementwise consumers, no kernel of its own (XLA's TPU compiler: 8 sibling GEMVs, 2 fusions);
    # measured by `python -m eqsat calibrate --target tpu-v5e`; 0: every contraction is a kernel
    loop_contraction_rows: int = 0
    # how often a row product of more rows reads its matrix, by the target compiler's count (XLA's TPU cost analysis:
    # 5 times, tiles fetched again, from 2 rows to 128); measured by the same command; 1: once
    matrix_reads: float = 1.0
    # measured seconds per node key (node_key), attached at planning time; they replace the roofline where present
    timings: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    def flops_per_second(self, dtype: str, conv: bool = False) -> float:
        peak = self.conv_peak_flops if conv and self.conv_peak_flops else self.peak_flops
        return peak.get(dtype, min(peak.values()))

    def bandwidth_for(self, moved: float) -> float:
        """Bytes per second for a node moving `moved` bytes: small working sets stay in cache."""
        return self.cache_bandwidth if self.cache_bandwidth and moved <= self.cache_bytes else self.bandwidth


@dataclass(frozen=True)
class Cost:
    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    kernels: int = 0
    measured: int = 0  # nodes whose seconds came from the timing cache, not the roofline

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.seconds + other.seconds,
            self.flops + other.flops,
            self.bytes + other.bytes,
            self.kernels + other.kernels,
            self.measured + other.measured,
        )


def profile_names() -> list[str]:
    return sorted(Path(e.name).stem for e in resources.files("eqsat.extract").joinpath("profiles").iterdir())


def cache_dir() -> Path:
    """Where eqsat keeps per-machine data: $EQSAT_CACHE_DIR, else $XDG_CACHE_HOME/eqsat, else ~/.cache/eqsat."""
    if os.environ.get("EQSAT_CACHE_DIR"):
        return Path(os.environ["EQSAT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eqsat"


def write_cache_file(path: Path, text: str) -> None:
    """Write a file whole: a reader in another process sees the old file or the new one (OSError where it cannot).
    Many threads, processes and hosts may write one cache directory: each write has a temporary file of its own
    (two threads sharing one had a rename fail and their writes mixed in one file), and the last rename wins."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def cache_file_lock(path: Path) -> Iterator[None]:
    """Hold the lock of a cache file (`<path>.lock`, beside it) for a read-merge-write, against other processes
    and hosts (flock) and this process's other threads (flock on NFS locks for the whole process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THIS_PROCESS, open(path.with_name(f"{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        yield


_THIS_PROCESS = threading.Lock()


def keep_cache_file(path: Path, text: str) -> bool:
    """write_cache_file where a cache that cannot be written is no reason to stop (see keep_cache)."""
    return keep_cache(path, functools.partial(write_cache_file, path, text))


def keep_cache(path: Path, write: Callable[[], None]) -> bool:
    """Run `write`, which writes the cache file at `path`, where a cache that cannot be written is no reason to
    stop: what was to be kept stays in this process's memory, and the first failure in the process warns, naming
    the path. Writers racing each other do not fail, so only a real OSError (permissions, a full disk) warns.
    Returns whether it wrote."""
    try:
        write()
        return True
    except OSError as error:
        with _UNWRITABLE_LOCK:
            first = not _UNWRITABLE
            _UNWRITABLE.append(path)
        if first:
            warnings.warn(
                f"eqsat: cannot write its cache at {path} ({error}); plans and kernel timings are kept in this "
                "process's memory only (set EQSAT_CACHE_DIR to a writable directory to keep them)",
                EqsatWarning,
                stacklevel=3,
            )
        log.debug("eqsat: could not write %s (%s)", path, error)
        return False


_UNWRITABLE: list[Path] = []  # cache files this process could not write (the first one warned)
_UNWRITABLE_LOCK = threading.Lock()


def calibrated_path(target: str) -> Path:
    return cache_dir() / "profiles" / f"{target}.json"


def load_profile(target: str | Profile) -> Profile:
    """A target's profile: the bundled one, its measured figures replaced by those `python -m eqsat calibrate`
    wrote to the cache, if any. What was learnt about the target (rule groups that do not pay) stays bundled."""
    if isinstance(target, Profile):
        return target
    bundled = load_bundled(target)
    calibrated = calibrated_path(target)
    try:
        if not calibrated.is_file():
            return bundled
        measured = json.loads(calibrated.read_bytes().decode("utf-8"))
        for key in _KNOWLEDGE:
            measured.pop(key, None)
        return _from_json(json.dumps({**asdict(bundled), **measured}))
    except (OSError, ValueError, TypeError, AttributeError) as error:  # a file of the cache never stops planning
        warnings.warn(
            f"eqsat: ignoring the calibrated profile {calibrated} ({type(error).__name__}: {error}); the bundled "
            f"{target!r} profile is used (run `python -m eqsat calibrate` to measure again)",
            EqsatWarning,
            stacklevel=2,
        )
        return bundled


_KNOWLEDGE = ("disabled_rules", "notes")  # bundled facts about a target, never taken from a calibration


def load_bundled(target: str) -> Profile:
    entry = resources.files("eqsat.extract").joinpath("profiles", f"{target}.json")
    if not entry.is_file():
        raise ValueError(f"unknown target {target!r}; the device profiles are {profile_names()}")
    return _from_json(entry.read_text())


def _from_json(text: str) -> Profile:
    data = json.loads(text)
    for listed in ("disabled_rules", "epilogue_activations", "fuses_producers_into", "fuses_into_consumers"):
        data[listed] = tuple(data.get(listed, ()))
    known = {f.name for f in fields(Profile)}
    return Profile(**{k: v for k, v in data.items() if k in known})  # extra keys: raw measurements, newer fields


def class_of(op: str) -> CostClass:
    """The cost class of an IR op, from the op table."""
    return OPS[op].cost_class


@dataclass(frozen=True)
class _Node:
    """What pricing one node reads: the op, its attributes, its inputs' and output's shapes and bytes."""

    op: str
    attrs: tuple
    in_shapes: list[Shape | None]
    out_shape: Shape | None
    dtype: str | None
    in_bytes: int
    out_bytes: int


def _free(node: _Node, profile: Profile) -> Cost:
    return Cost()


def _fused_pass(node: _Node, profile: Profile) -> Cost:
    """XLA fuses elementwise ops into their neighbours: the memory pass of the output, no kernel of its own; in a
    narrow float type, the rounding of each element; the op's own work per element where the op table gives one."""
    kernels, elements = 0 if profile.fuses_elementwise else 1, prod(node.out_shape or ())
    seconds = node.out_bytes / profile.bandwidth_for(node.out_bytes) + kernels * profile.launch_overhead
    seconds += rounding_seconds(node.out_shape, node.dtype, profile)
    flops = elements * max(OPS[node.op].flops_per_element, 1.0)
    seconds += elements * OPS[node.op].flops_per_element / profile.flops_per_second(node.dtype or "float32")
    return Cost(seconds, float(flops), node.out_bytes, kernels)


NARROW_FLOATS = ("bfloat16", "float16")


def rounding_seconds(shape: Shape | None, dtype: str | None, profile: Profile) -> float:
    """What rounding a value of this shape to a narrow float type costs on the target (0 for other dtypes)."""
    return profile.narrow_rounding * prod(shape or ()) if dtype in NARROW_FLOATS else 0.0


def _fused_read(node: _Node, profile: Profile) -> Cost:
    """A fused reduction that reads its input again: the memory pass of its input (logsumexp of an input already
    computed for something else costs what reading it costs, not what its small output does)."""
    kernels = 0 if profile.fuses_elementwise else 1
    seconds = node.in_bytes / profile.bandwidth_for(node.in_bytes) + kernels * profile.launch_overhead
    return Cost(seconds, float(prod(node.in_shapes[0] or ())), node.in_bytes, kernels)


def _contraction(node: _Node, profile: Profile) -> Cost:
    """max(compute, memory) and a kernel launch (none for a GEMV the target fuses as a loop), or what the timing
    cache measured."""
    assert node.out_shape is not None and node.in_shapes[0] is not None
    flops = float(contraction_flops(node.op, node.in_shapes, node.out_shape))
    matrix, rows = _row_product(node)
    loop = matrix is not None and rows <= profile.loop_contraction_rows
    moved = node.in_bytes + node.out_bytes
    if matrix is not None and not loop:
        moved += round((profile.matrix_reads - 1) * value_bytes(matrix, node.dtype))
    measured = _timed(profile, node)
    if measured is not None:
        return Cost(measured, flops, moved, 1, measured=1)
    peak = profile.flops_per_second(node.dtype or "float32", conv=node.op == CONV)
    seconds = max(flops / peak, moved / profile.bandwidth_for(moved))
    seconds += _epilogue_passes(node.op, node.attrs, profile) * node.out_bytes / profile.bandwidth_for(node.out_bytes)
    if loop:
        return Cost(seconds, flops, moved, 0)  # fused with its neighbours
    overhead = profile.launch_overhead if profile.contraction_overhead is None else profile.contraction_overhead
    return Cost(seconds + overhead, flops, moved, 1)


def _row_product(node: _Node) -> tuple[Shape | None, int]:
    """The matrix a row product multiplies (None for any other contraction) and how many rows it multiplies."""
    a, w = node.in_shapes[0] or (), node.in_shapes[1] or ()
    return (w, prod(a[:-1])) if OPS[node.op].row_product and len(w) == 2 else (None, 0)


def _gather(node: _Node, profile: Profile, checked: bool = False) -> Cost:
    """Reads the rows it returns and the indices, writes them: the table stays put (`checked`: read once too, for
    the check that it is finite); or measured."""
    moved = 2 * node.out_bytes + (value_bytes(node.in_shapes[-1], node.dtype) if node.in_shapes else 0)
    if checked and node.in_shapes and node.in_shapes[0] is not None:
        moved += value_bytes(node.in_shapes[0], node.dtype)
    return _pass_or_measured(node, profile, moved, 0.0)


def _window(node: _Node, profile: Profile) -> Cost:
    """A pool: one pass over its input and output, a compare or add per window element; or measured."""
    assert node.out_shape is not None
    flops = float(prod(node.out_shape) * prod(PoolAttrs(*node.attrs).window))
    return _pass_or_measured(node, profile, node.in_bytes + node.out_bytes, flops)


def _reduction(node: _Node, profile: Profile) -> Cost:
    """An index-returning reduction (argmax): one pass over its input; or measured."""
    return _pass_or_measured(node, profile, node.in_bytes + node.out_bytes, 0.0)


def _pass_or_measured(node: _Node, profile: Profile, moved: int, flops: float) -> Cost:
    """What the timing cache measured for the node, else one pass over the bytes it moves and a kernel launch."""
    measured = _timed(profile, node)
    if measured is not None:
        return Cost(measured, flops, moved, 1, measured=1)
    return Cost(moved / profile.bandwidth_for(moved) + profile.launch_overhead, flops, moved, 1)


def _one_pass(node: _Node, profile: Profile) -> Cost:
    """A primitive the table does not model: one pass over its data, one kernel."""
    moved = node.in_bytes + node.out_bytes
    return Cost(moved / profile.bandwidth_for(moved) + profile.launch_overhead, 0.0, moved, 1)


PRICES: dict[CostClass, Callable[[_Node, Profile], Cost]] = {
    CostClass.SOURCE: _free,
    CostClass.BITCAST: _free,
    CostClass.ELEMENTWISE: _fused_pass,
    CostClass.FUSED_READ: _fused_read,
    CostClass.CONTRACTION: _contraction,
    CostClass.GATHER: _gather,
    CostClass.CHECKED_GATHER: functools.partial(_gather, checked=True),
    CostClass.WINDOW: _window,
    CostClass.REDUCTION: _reduction,
    CostClass.OPAQUE: _one_pass,
}


def node_cost(
    op: str,
    in_shapes: list[Shape | None],
    out_shape: Shape | None,
    dtype: str | None,
    profile: Profile,
    attrs: tuple = (),
) -> Cost:
    """The predicted cost of one node; in_shapes are its tensor inputs' shapes, attrs its attributes."""
    in_bytes = sum(value_bytes(s, dtype) for s in in_shapes)
    node = _Node(op, attrs, in_shapes, out_shape, dtype, in_bytes, value_bytes(out_shape, dtype))
    return PRICES[class_of(op)](node, profile)


def _timed(profile: Profile, node: _Node) -> float | None:
    """The node's seconds from the timing cache attached to the profile, if it was measured. An alternative
    implementation pays the profile's switch_margin on top: a kernel measured alone, a few runs on a shared
    machine, must beat the one it replaces clearly to be trusted in context."""
    key = node_key(node.op, node.attrs, node.in_shapes, node.dtype)
    seconds = profile.timings.get(key) if profile.timings else None
    if seconds is not None and OPS[node.op].alternative:
        seconds *= profile.switch_margin
    return seconds


def _epilogue_passes(op: str, attrs: tuple, profile: Profile) -> int:
    """Passes over the output that a GEMM's epilogue (a Dense op's bias and activation) costs on this target: none
    where the epilogue runs inside the GEMM, else what the ops it groups cost apart (broadcast, add, activation)."""
    if op not in OPS or not OPS[op].epilogue:
        return 0
    activation = attrs[0] if attrs else "none"
    if profile.epilogue_activations:
        return 0 if activation in profile.epilogue_activations else 1
    return 2 + (activation != "none")


def node_key(op: str, attrs: tuple, in_shapes: list[Shape | None], dtype: str | None) -> str:
    """A node's key in the timing cache: op, attributes, input shapes and dtype, as canonical JSON."""

    def plain(value: Any) -> Any:
        return [plain(v) for v in value] if isinstance(value, tuple | list) else value

    return json.dumps([op, plain(tuple(attrs)), [plain(tuple(s)) for s in in_shapes if s is not None], dtype])


def value_bytes(shape: Shape | None, dtype: str | None) -> int:
    """Bytes of one array value; 0 for a value without a shape (the tuple of a multi-result opaque call)."""
    return 0 if shape is None else prod(shape) * _itemsize(dtype)


@functools.cache  # a dtype is parsed once, not once per e-node
def _itemsize(dtype: str | None) -> int:
    try:
        return np.dtype(dtype).itemsize if dtype else 4
    except TypeError:  # jax's extended dtypes: a PRNG key (key<fry>) is two uint32 words
        return 8
