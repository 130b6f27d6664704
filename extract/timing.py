"""The timing cache: what single kernels measured on a device, where the roofline cannot tell.

XLA's kernels are not all near the roofline of their op class (a depthwise conv on XLA:CPU runs ~50x below a dense
one), so a contraction-class node and each of its alternatives is priced by compiling it alone and running it on
the device the plan is for, the median kept. Entries are keyed by op, attributes, input shapes and dtype, and kept
per device and jax version as versioned JSON in eqsat's cache directory, so a later process measures nothing again;
processes sharing that directory (jobs, hosts on a network file system) merge their entries into the file under its
lock, so none is lost.
A cache measured elsewhere (a GPU machine) is imported with `python -m eqsat tune --import FILE` and prices plans
for the profile that names that device. A new shape of a kernel measured before is priced from the nearest shape
measured (`transferred`) instead of measured again: what a kernel achieves against its roofline changes little
between nearby shapes, and the plan's guard times the result anyway.

A timing is a finite positive number of seconds: anything else is refused at import (the error names the entry)
and left out, with a warning, where a cache file is read for planning; no cache file, however damaged, stops a
function from being planned, and a cache that cannot be written keeps its timings in memory.
"""

import contextlib
import json
import logging
import math
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import jaxlib
import numpy as np
from jax import lax

from eqsat.egraph.saturate import Snapshot
from eqsat.extract.cost import Profile, cache_dir, cache_file_lock, keep_cache, node_cost, node_key, write_cache_file
from eqsat.numerics.measure import median_time
from eqsat.numerics.sample import example_array
from eqsat.ops.table import OPS, CostClass, infer
from eqsat.support import progress
from eqsat.support.errors import EqsatWarning

# 2: kernels too fast to measure listed in "too_fast" (1 wrote them as null timings); 3: an op with operand layouts
# timed on operands made in them (2 timed ShiftConvBG with its transposes unfolded, 2-4x slow); 4: a large kernel
# timed warm, in back-to-back calls (3 timed its first calls one at a time: up to 2x slow); 5: Take and ScatterRows
# read their operand once more, to check that it is finite (4 timed them without that pass)
FORMAT = 5
Shape = tuple[int, ...]
log = logging.getLogger("eqsat")


def local_device() -> str:
    """The device plans run on here, as timing caches name it: backend and device kind, e.g. 'cpu:cpu'."""
    device = jax.devices()[0]
    return f"{device.platform}:{device.device_kind}"


def versions() -> str:
    return f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"


_MEASURED = {CostClass.CONTRACTION, CostClass.GATHER, CostClass.CHECKED_GATHER, CostClass.WINDOW, CostClass.REDUCTION}


def measurable(op: str) -> bool:
    """Contraction-, gather-, window- and reduction-class ops (GEMMs, convs, pools, argmax and their alternatives):
    the kernels whose speed the roofline misses."""
    return op in OPS and OPS[op].cost_class in _MEASURED


@dataclass
class TimingCache:
    """Measured seconds per node key for one device and jax version; `path` is where it is kept."""

    device: str
    versions: str
    entries: dict[str, float | None] = field(default_factory=dict)  # None: too fast to measure, roofline-priced
    path: Path | None = None
    # prices carried over from another shape's measurement (see `transferred`): not saved, a measurement wins
    transfers: dict[str, float | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def to_json(self) -> str:
        seconds = {k: v for k, v in self.entries.items() if v is not None}
        too_fast = sorted(k for k, v in self.entries.items() if v is None)
        data = {"format": FORMAT, "device": self.device, "versions": self.versions, "entries": seconds}
        return json.dumps({**data, "too_fast": too_fast}, indent=1, sort_keys=True, allow_nan=False)

    def save(self) -> None:
        """Write the cache to its path, with what the file holds merged in: processes measuring into one cache
        directory keep each other's entries (this cache's win a key both hold), read, merged and written under the
        file's lock. OSError where it cannot be written: `measure` keeps it in memory instead."""
        if self.path is None:
            return
        with cache_file_lock(self.path):
            # none yet, or one to write over (damaged, another jax version's)
            with contextlib.suppress(FileNotFoundError, ValueError):
                self.merge(parse(self.path.read_bytes(), str(self.path)))
            with self.lock:
                text = self.to_json()
            write_cache_file(self.path, text)

    def merge(self, other: "TimingCache") -> int:
        """Take another cache's entries for the same device and versions; returns how many were new."""
        if (other.device, other.versions) != (self.device, self.versions):
            raise ValueError(
                f"timing cache for {other.device} ({other.versions}) cannot join one for {self.device} "
                f"({self.versions})"
            )
        with self.lock:
            new = {k: v for k, v in other.entries.items() if k not in self.entries}
            self.entries.update(new)
        return len(new)


class OlderFormat(ValueError):
    """A cache an earlier eqsat wrote: measured again, as one of another jax version is."""


def parse(text: str | bytes, origin: str, drop_bad: bool = False) -> TimingCache:
    """A timing cache from its JSON text; `origin` names the file in errors. A timing that is not a finite positive
    number of seconds, or a key not shaped as a kernel's, is an error that names it; with `drop_bad` (a cache file read
    for planning) it is left out, with a warning."""
    try:
        data = json.loads(text)
    except ValueError as error:  # not JSON, or bytes that are not UTF-8
        raise ValueError(f"{origin}: not a timing cache (invalid JSON: {error})") from None
    found = data.get("format") if isinstance(data, dict) else type(data).__name__
    if isinstance(found, int) and not isinstance(found, bool) and 0 < found < FORMAT:
        raise OlderFormat(f"{origin}: a timing cache of format {found}, older than this eqsat's ({FORMAT})")
    if found != FORMAT:
        raise ValueError(f"{origin}: not a timing cache of format {FORMAT} (format: {found!r})")
    fields = {"device": str, "versions": str, "entries": dict, "too_fast": list}
    for name, kind in fields.items():
        if not isinstance(data.get(name), kind):
            raise ValueError(f"{origin}: {name!r} must be a JSON {kind.__name__}, found {data.get(name)!r}")
    entries: dict[str, float | None] = {}
    bad = []
    for key, seconds in data["entries"].items():
        if not _kernel_key(key):
            bad.append(f"key {key!r} is not a kernel's key ([op, attributes, input shapes, dtype])")
        elif isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < math.inf:
            bad.append(f"{key}: {seconds!r} is not a timing (a finite positive number of seconds)")
        else:
            entries[key] = float(seconds)
    for key in data["too_fast"]:
        if _kernel_key(key):
            entries.setdefault(key, None)
        else:
            bad.append(f"too_fast: {key!r} is not a kernel's key")
    if bad:
        problem = bad[0] + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        if not drop_bad:
            raise ValueError(f"{origin}: {problem}")
        warnings.warn(f"eqsat: ignoring entries of the timing cache {origin}: {problem}", EqsatWarning, stacklevel=3)
    return TimingCache(data["device"], data["versions"], entries)


def _kernel_key(key: object) -> bool:
    """Whether a key is shaped as node_key writes it: [op, attributes, input shapes (lists of sizes), dtype] (an op
    this eqsat lacks is kept: another version's entry, never asked for here)."""
    try:
        op, _, shapes, dtype = json.loads(key)  # type: ignore[arg-type]
        sizes = [d for shape in shapes for d in shape]
    except (TypeError, ValueError):
        return False
    whole = all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in sizes)
    return isinstance(op, str) and isinstance(dtype, str) and isinstance(shapes, list) and whole


def cache_path(device: str) -> Path:
    return cache_dir() / "timing" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", device) + ".json")


_LOADED: dict[tuple[str, str], TimingCache] = {}
_LOADING = threading.Lock()


def cache_for(device: str) -> TimingCache:
    """The process's timing cache for a device (loaded once from the cache directory); entries of another jax
    version are not kept, since a new XLA may run the same op differently."""
    key = (device, str(cache_path(device)))
    with _LOADING:
        if key not in _LOADED:
            path = cache_path(device)
            cache = TimingCache(device, versions(), path=path)
            try:
                stored = parse(path.read_bytes(), str(path), drop_bad=True)
                if stored.versions == cache.versions and stored.device == device:
                    cache.entries = stored.entries
            except (FileNotFoundError, NotADirectoryError):  # nothing measured yet
                pass
            except OlderFormat as error:  # an upgrade: measured again and written over, nothing to warn of
                log.info("eqsat: %s; measuring again", error)
            except (OSError, ValueError) as error:  # measured again, and written over where the cache can be
                warnings.warn(f"eqsat: ignoring the timing cache {path}: {error}", EqsatWarning, stacklevel=3)
            _LOADED[key] = cache
        return _LOADED[key]


@dataclass(frozen=True)
class Wanted:
    """A node to price by measurement: its key and how to build it."""

    key: str
    op: str
    attrs: tuple
    in_shapes: tuple[Shape, ...]
    dtype: str
    in_dtypes: tuple[str, ...]
    eclass: str = ""  # the e-class whose choice it is, beside its rivals


def _call_overhead() -> float:
    """Seconds one jitted call costs on its own here, taken off each measurement so kernels are priced alone."""
    if "call" not in _OVERHEAD:
        tiny = jax.numpy.zeros((8,), jax.numpy.float32)
        _OVERHEAD["call"] = median_time(jax.jit(lambda x: x + 1), (tiny,), 0.0, 7, 0.002)
    return _OVERHEAD["call"]


_OVERHEAD: dict[str, float] = {}


def too_fast_s() -> float:
    """The most a kernel measured too fast to time (an entry of None) takes: two calls' overhead here."""
    return 2 * _call_overhead()


def measure_one(wanted: Wanted) -> float | None:
    """Compile the node alone on random inputs and return the median seconds of a few runs, call overhead off;
    None for a kernel that runs in less than two calls' overhead: dispatch noise hides it, the roofline prices it."""
    with jax.ensure_compile_time_eval():  # planning may run inside the caller's jax.jit trace: run, do not trace
        return time_alone(*kernel_program(wanted))


def kernel_program(wanted: Wanted) -> tuple[Callable[..., Any], tuple]:
    """The node alone as a jitted function, and random inputs for it. An op with operand layouts gets each operand
    as capture makes it: made in the order its lowering transposes it into, and transposed back (XLA folds both)."""
    spec = OPS[wanted.op]
    rng = np.random.default_rng(0)
    shapes = list(wanted.in_shapes)
    orders = spec.operand_layouts(len(shapes[0])) if spec.operand_layouts else [tuple(range(len(s))) for s in shapes]
    with jax.ensure_compile_time_eval():
        args = tuple(
            jax.numpy.asarray(example_array(tuple(s[k] for k in order), d, rng))
            for s, d, order in zip(shapes, wanted.in_dtypes, orders, strict=True)
        )

    def kernel(*xs: Any) -> Any:
        made = (lax.transpose(x, tuple(map(int, np.argsort(o)))) for x, o in zip(xs, orders, strict=True))
        return spec.lower(wanted.attrs, *made)

    return jax.jit(kernel), args


# kernel choices differ by integer factors: 3 rounds tell, of back-to-back calls as a program runs them (a call at a
# time lets XLA's threads sleep in between: BERT's GEMMs timed up to 2x slow), once warm (a large kernel's first
# calls run up to 2x slow: 4.5-9 ms, then 3.5 ms, for BERT's 128x3072 by 3072x768)
_ROUND_S, _WARM = 0.01, (5, 0.02)


def time_alone(fn: Callable[..., Any], args: tuple) -> float | None:
    """Median seconds of a few runs of a jitted kernel, call overhead off; None below two calls' overhead."""
    with jax.ensure_compile_time_eval():
        seconds = median_time(fn, args, 0.0, 3, _ROUND_S, _WARM)
        overhead = _call_overhead()
        return seconds - overhead if seconds > 3 * overhead else None


def measure(
    cache: TimingCache,
    wanted: list[Wanted],
    measure_seconds: float,
    timer: Callable[[Wanted], float | None] | None = None,
) -> dict[str, int]:
    """Measure the wanted nodes the cache lacks, in order, until `measure_seconds` are spent (the rivals of the
    choice under way still measured); save the cache. `timer`: how one is measured (a kernel of the op table by
    default).

    Returns counts: hits (already cached), measured, skipped (over budget)."""
    missing = list({w.key: w for w in wanted if w.key not in cache.entries}.values())
    counts = {"hits": len({w.key for w in wanted}) - len(missing), "measured": 0, "skipped": 0}
    if not missing or measure_seconds <= 0:
        counts["skipped"] = len(missing)
        return counts
    start = time.perf_counter()
    progress.begin("measure", f"measure {len(missing)} kernels", total=len(missing))
    for k, item in enumerate(missing):
        # a choice is measured whole: a rival left to its roofline (a lower bound) would win against measured ones
        rival = k > 0 and item.eclass != "" and item.eclass == missing[k - 1].eclass
        if not rival and time.perf_counter() - start >= measure_seconds:
            counts["skipped"] = len(missing) - k
            break
        try:
            seconds = (timer or measure_one)(item)
        except Exception as error:  # a node that does not compile alone keeps its roofline price
            log.info("eqsat: could not measure %s: %s", item.key, error)
            continue
        with cache.lock:
            cache.entries[item.key] = seconds
        counts["measured"] += 1
        progress.step("measure", f"measure: {item.op} {k + 1}/{len(missing)}", k + 1, len(missing))
    if cache.path is not None:
        keep_cache(cache.path, cache.save)
    return counts


def wanted_nodes(snapshot: Snapshot) -> list[Wanted]:
    """The kernel choices: contraction-class e-nodes of e-classes that hold more than one such op (a Conv and its
    ShiftConv), with known shapes. Other kernels keep the roofline: a single kernel without rivals is priced the
    same in every candidate plan, and on a loaded machine a small kernel's measurement is mostly noise."""
    by_class: dict[str, set[str]] = {}
    items: list[tuple] = []  # (e-class, e-node, input shapes, dtype)
    for node in snapshot.nodes:
        if not measurable(node.op) or node.subsumed:  # before any shape lookup: most nodes are not kernels
            continue
        in_shapes = tuple(snapshot.shape.get(c) for c in node.children)
        dtype = snapshot.dtype.get(node.eclass)
        if dtype is None or any(s is None for s in in_shapes):
            continue
        by_class.setdefault(node.eclass, set()).add(node.op)
        items.append((node.eclass, node, in_shapes, dtype))
    wanted = []
    for eclass, node, in_shapes, dtype in items:
        if len(by_class[eclass]) > 1:  # keys only for the choices
            key = node_key(node.op, tuple(node.attrs), list(in_shapes), dtype)
            in_dtypes = tuple(snapshot.dtype.get(c) or dtype for c in node.children)
            wanted.append(Wanted(key, node.op, tuple(node.attrs), in_shapes, dtype, in_dtypes, eclass))
    return wanted


def transferred(
    cache: TimingCache, wanted: list[Wanted], profile: Profile, timing_transfer: float
) -> dict[str, float | None]:
    """Prices for the wanted kernels the cache lacks, from the same kernel (op, attributes, dtype, input ranks)
    measured at shapes that differ in at most two dimensions in all (a batch size, a sequence length, an image's
    height and width; not another layer's channels), the one whose roofline is nearest, if within
    `timing_transfer` times this one's: its seconds scaled by the rooflines' ratio. A kernel too fast to measure
    there passes that on only to shapes no bigger. Where the rivals of one choice, so priced, come within _CLEAR
    of each other, none of them is carried over: a close choice is measured."""
    missing = {w.key: w for w in wanted if w.key not in cache.entries}
    if timing_transfer < 1 or not missing:
        return {}
    with cache.lock:
        entries = dict(cache.entries)
    measured_shapes: dict[str, list[tuple[Shape, ...]]] = {}
    for key in entries:
        family, shapes = _family(key)
        measured_shapes.setdefault(family, []).append(shapes)
    bare = replace(profile, timings={})
    prices: dict[str, float | None] = {}
    for w in missing.values():
        family, _ = _family(w.key)
        near = [s for s in measured_shapes.get(family, ()) if _dims_apart(s, w.in_shapes) <= _DIMS_APART]
        rooflines = [(r, s) for s in near if (r := _roofline(w, s, bare)) is not None]
        here = _roofline(w, w.in_shapes, bare) if rooflines else None  # no op traced where nothing is near
        if here is None:
            continue
        there, shapes = min(rooflines, key=lambda rs: abs(math.log(here / rs[0])))
        ratio = here / there
        seconds = entries[node_key(w.op, w.attrs, list(shapes), w.dtype)]
        if not 1 / timing_transfer <= ratio <= timing_transfer or (seconds is None and ratio > 1):
            continue
        prices[w.key] = None if seconds is None else seconds * ratio
    for rivals in _by_class(wanted).values():  # a close choice is measured at this very shape
        if any(w.key in prices for w in rivals) and _close(rivals, prices, entries, profile.switch_margin):
            for w in rivals:
                prices.pop(w.key, None)
    return prices


# Rivals carried over are trusted only when one is this many times cheaper than the next (the profile's switch
# margin applied): on NASNet-A, ResNeXt-50 and SqueezeNet at batch 2, all 145 choices priced from batch 1 matched
# the choice measured at batch 2 but one, a max pool whose rivals were 1.07x apart; ResNeXt-50's grouped convs as
# patches were 1.3-3.6x apart.
_CLEAR = 1.5


def _by_class(wanted: list[Wanted]) -> dict[str, list[Wanted]]:
    rivals: dict[str, list[Wanted]] = {}
    for w in wanted:
        rivals.setdefault(w.eclass, []).append(w)
    return rivals


def _close(
    rivals: list[Wanted], prices: dict[str, float | None], entries: dict[str, float | None], margin: float
) -> bool:
    """Whether the two cheapest rivals, priced as extraction will price them, are within _CLEAR of each other;
    False where one lacks a price or is too fast to measure (the roofline prices those)."""
    seconds = [prices[w.key] if w.key in prices else entries.get(w.key) for w in rivals]
    if any(s is None for s in seconds) or len(seconds) < 2:
        return False
    priced = sorted(s * (margin if OPS[w.op].alternative else 1.0) for s, w in zip(seconds, rivals, strict=True))
    return priced[1] < _CLEAR * priced[0]


_DIMS_APART = 2


def _dims_apart(a: tuple[Shape, ...], b: tuple[Shape, ...]) -> int:
    """How many dimensions of the inputs' shapes differ (the ranks are equal)."""
    return sum(x != y for sa, sb in zip(a, b, strict=True) for x, y in zip(sa, sb, strict=True))


def _family(key: str) -> tuple[str, tuple[Shape, ...]]:
    """A timing-cache key without its shapes (kept: their ranks), and the shapes."""
    op, attrs, shapes, dtype = json.loads(key)
    return json.dumps([op, attrs, [len(s) for s in shapes], dtype]), tuple(tuple(s) for s in shapes)


def _roofline(wanted: Wanted, in_shapes: tuple[Shape, ...], profile: Profile) -> float | None:
    """The roofline seconds of the wanted kernel at these input shapes (None where the op does not take them)."""
    out = infer(wanted.op, wanted.attrs, tuple(zip(in_shapes, wanted.in_dtypes, strict=True)))
    if out is None:
        return None
    return max(node_cost(wanted.op, list(in_shapes), out[0], wanted.dtype, profile, wanted.attrs).seconds, 1e-12)


def priced(
    profile: Profile,
    snapshot: Snapshot,
    measure_seconds: float,
    timing_transfer: float,
    measured: Callable[[TimingCache, list[Wanted], float], dict[str, int]] | None = None,
) -> tuple[Profile, dict[str, float]]:
    """The profile with the timing cache of its device attached, after pricing what it lacks: from the nearest
    measured shape where one is within `timing_transfer` (see `transferred`), else by measuring (on this device
    only, within `measure_seconds`; `measured`: how, `measure` by default); and what happened, for the plan's
    stats."""
    if not profile.timing_device:
        return profile, {}
    cache = cache_for(profile.timing_device)
    here = profile.timing_device == local_device()
    start = time.perf_counter()
    wanted = wanted_nodes(snapshot)
    carried = transferred(cache, wanted, profile, timing_transfer)
    with cache.lock:
        cache.transfers.update(carried)
    missing = by_stake([w for w in wanted if w.key not in carried], profile)
    counts = (measured or measure)(cache, missing, measure_seconds if here else 0.0)
    counts["transferred"] = len(carried)
    stats = {f"timing_{k}": float(v) for k, v in counts.items()}
    if counts["measured"]:
        stats["measure_s"] = time.perf_counter() - start
    return attached(profile), stats


def by_stake(wanted: list[Wanted], profile: Profile) -> list[Wanted]:
    """The choices in the order to measure them: each e-class's rivals together, the e-class whose dearest rival
    has the highest roofline first. A budget that runs out leaves the smallest choices to the roofline, and no
    choice between a measured rival and one priced by its roofline but the last (keras MobileNetV2's training step,
    measured in the e-graph's order: four strided depthwise gradients left so, one chosen at 34 ms, its rival 1 ms)."""
    rivals: dict[str, list[Wanted]] = {}
    for w in wanted:
        rivals.setdefault(w.eclass, []).append(w)
    stake = {e: max(_roofline(w, w.in_shapes, profile) or 0.0 for w in ws) for e, ws in rivals.items()}
    return [w for e in sorted(rivals, key=lambda e: -stake[e]) for w in rivals[e]]


def attached(profile: Profile) -> Profile:
    """The profile with what its device's timing cache holds, measured or transferred (nothing is measured)."""
    if not profile.timing_device:
        return profile
    cache = cache_for(profile.timing_device)
    with cache.lock:
        entries = {k: v for k, v in {**cache.transfers, **cache.entries}.items() if v is not None}
    return replace(profile, timings=entries)
