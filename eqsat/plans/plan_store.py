"""Plans kept across processes: each plan stored as versioned JSON in the cache directory, by a key of its program
(the captured jaxpr and its constants) and of everything else that decides it (target profile, rules, limits,
extractor, parameters, eqsat's and jax's versions, and the hardware: a plan stored with its refusal by the guard
was measured on one machine, and is measured again on another).

A new process optimizing the same function traces it, finds the plan by that key and skips saturation and
extraction; capture (one pass over the equations, which gives the constants and opaque calls a plan runs with)
runs. A plan priced by measured kernel times is reused only while the timing cache holds the same times for its
kernels. A file from disk is checked before it runs: it carries a digest of its content, checked on load, and a
kept plan is validated on its first call in each process as a new one is (a plan is validated once per signature
within a process). A file that fails either (or is not UTF-8, not JSON, of other types or another version) is set
aside as `<key>.json.rejected`, with one warning, and the function is planned again. A cache that cannot be written
keeps the plan in memory. Set EQSAT_PLAN_STORE=off to neither read nor write stored plans.
"""

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from eqsat.capture.encode import prelude
from eqsat.egraph.saturate import Snapshot
from eqsat.extract.cost import Profile, cache_dir, keep_cache_file
from eqsat.extract.plan import Plan
from eqsat.extract.timing import cache_for, wanted_nodes
from eqsat.plans.plan_json import plan_from_dict, plan_to_dict
from eqsat.support.errors import EqsatWarning

log = logging.getLogger("eqsat")

FORMAT = "eqsat-plan-store"
VERSION = 3  # 2: a digest of the content, checked on load; 3: plan format 3 (parameter_only, parameter)
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # a function's address in a printed parameter differs per process


def enabled() -> bool:
    return os.environ.get("EQSAT_PLAN_STORE", "on").lower() not in ("off", "0", "false", "no")


def program_key(closed: jcore.ClosedJaxpr, settings: tuple, portable: bool = False) -> str:
    """The key of a program under these settings: a digest of the jaxpr's equations, its constants and the
    settings (written out here rather than printed by jax: printing a 2,000-equation jaxpr takes 0.2 s).
    `portable`: without the machine and the versions of jax and eqsat, which may differ between the hosts of one
    job (eqsat/support/processes.py)."""
    digest = hashlib.blake2b(digest_size=20)
    where = "" if portable else f"/jax {jax.__version__}/{hardware()}/{code_version()}"
    digest.update(f"{FORMAT}/{VERSION}{where}/{settings!r}".encode())
    _feed(digest, closed.jaxpr)
    for value in closed.consts:
        array = np.asarray(value)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


@functools.cache
def code_version() -> str:
    """eqsat's version and a digest of its op table (the prelude it generates: every op's constructor, attributes
    and shape rules), so that a plan of another op table is never lowered with this one."""
    try:
        version = importlib.metadata.version("eqsat")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version}/{hashlib.blake2b(prelude().encode(), digest_size=12).hexdigest()}"


@functools.cache
def hardware() -> str:
    """The machine a plan is measured on (read once per process): jax's default device kind, and on the CPU
    backend the processor's model and core count."""
    device = jax.devices()[0]
    if device.platform != "cpu":
        return f"{device.platform} {device.device_kind}"
    return f"cpu {_cpu_model()} x{os.cpu_count()}"


def _cpu_model() -> str:
    """The processor's model name: /proc/cpuinfo's on Linux, else what the platform module says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine()


def _feed(digest: Any, jaxpr: jcore.Jaxpr) -> None:
    """Every equation of the jaxpr (sub-programs included): primitive, parameters, operands and types."""
    names: dict[Any, int] = {}
    types: dict[Any, str] = {}  # printing an aval is most of the cost: once per distinct aval

    def typed(aval: Any) -> str:
        if aval not in types:
            types[aval] = str(aval)
        return types[aval]

    def atom(v: Any) -> str:
        if isinstance(v, jcore.Literal):
            return f"{v.val!r}:{typed(v.aval)}"
        return f"%{names.setdefault(v, len(names))}:{typed(v.aval)}"

    digest.update(" ".join(map(atom, (*jaxpr.constvars, *jaxpr.invars))).encode())
    for eqn in jaxpr.eqns:
        digest.update(f"\n{eqn.primitive.name}({' '.join(map(atom, eqn.invars))})".encode())
        for name, value in sorted(eqn.params.items()):
            digest.update(f" {name}=".encode())
            _feed_param(digest, value)
        digest.update(f" -> {' '.join(map(atom, eqn.outvars))}".encode())
    digest.update(f"\nreturn {' '.join(map(atom, jaxpr.outvars))}".encode())


def _feed_param(digest: Any, value: Any) -> None:
    if isinstance(value, jcore.ClosedJaxpr):
        _feed(digest, value.jaxpr)
        for const in value.consts:
            digest.update(np.ascontiguousarray(np.asarray(const)).tobytes())
    elif isinstance(value, jcore.Jaxpr):
        _feed(digest, value)
    elif isinstance(value, tuple | list):
        for item in value:
            _feed_param(digest, item)
            digest.update(b",")
    else:
        digest.update(_ADDRESS.sub("", repr(value)).encode())


def _path(key: str) -> Path:
    return cache_dir() / "plans" / f"{key}.json"


def load(key: str, profile: Profile) -> Plan | None:
    """The stored plan of this key, or None: none stored, or priced by kernel times the timing cache no longer
    holds; a file that cannot be read as a stored plan, or fails its digest, is set aside. Its graph is None: the
    caller attaches the program it captured."""
    if not enabled():
        return None
    path = _path(key)
    if key in _SET_ASIDE:  # found wrong in this process, and not yet written over
        return None
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:  # unreadable here (permissions): planned afresh, and written over where it can be
        log.warning("eqsat: ignoring the stored plan %s (%s)", path, error)
        return None
    try:
        data = _checked(raw)
        if data["timings"] != _timings_now(profile, list(data["timings"])):
            return None
        return plan_from_dict(data["plan"])
    except Exception as error:  # whatever is wrong with the file, it never stops the function from being planned
        why = str(error) if isinstance(error, _Unreadable) else f"{type(error).__name__}: {error}"
        set_aside(key, f"cannot be used ({why})")
        return None


class _Unreadable(ValueError):
    """A plan file that is not a stored plan of this version whose content matches its digest."""


def _checked(raw: bytes) -> dict[str, Any]:
    """A stored plan file's content, checked: UTF-8 JSON of this format and version, its digest matching."""
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _Unreadable("not a stored plan")
    if data.get("version") != VERSION:
        raise _Unreadable(f"version {data.get('version')!r}, this eqsat reads version {VERSION}")
    content = {k: v for k, v in data.items() if k != "digest"}
    if data.get("digest") != content_digest(content):
        raise _Unreadable("its content does not match its digest: it changed after eqsat wrote it")
    if not isinstance(data.get("timings"), dict):
        raise _Unreadable("'timings' is not a JSON object")
    return data


def content_digest(content: dict[str, Any]) -> str:
    """The digest a stored plan file carries: of its other fields, as canonical JSON."""
    return hashlib.blake2b(json.dumps(content, sort_keys=True, allow_nan=False).encode(), digest_size=20).hexdigest()


def set_aside(key: str, why: str) -> None:
    """Move the stored plan of this key aside (to `<key>.json.rejected`, kept for a look), with one warning: the
    function is planned again, and the new plan stored in its place."""
    _SET_ASIDE.add(key)
    path = _path(key)
    aside = path.with_name(f"{path.name}.rejected")
    try:
        path.replace(aside)
        where = f"set aside as {aside}"
    except OSError as error:
        where = f"not set aside ({error})"
    warnings.warn(f"eqsat: the stored plan {path} {why}; {where}; planning again", EqsatWarning, stacklevel=2)


def save(key: str, plan: Plan, profile: Profile, snapshots: Sequence[Snapshot] = ()) -> None:
    """Store the plan under its key, with the measured kernel times it was priced by, those of the e-graphs it was
    extracted from, and a digest of all that (a failure to write warns once per process, never raises: the plan
    in memory is what runs)."""
    if not enabled():
        return
    keys = [w.key for snapshot in snapshots for w in wanted_nodes(snapshot)]
    try:
        content: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "timings": _timings_now(profile, keys),
            "plan": plan_to_dict(plan),
        }
        text = json.dumps({**content, "digest": content_digest(content)}, allow_nan=False)
    except (TypeError, ValueError) as error:  # a value the JSON format cannot hold: the plan is not kept
        log.warning("eqsat: the plan is not kept across processes: %s", error)
        return
    if keep_cache_file(_path(key), text):
        _SET_ASIDE.discard(key)


_SET_ASIDE: set[str] = set()  # keys whose stored plan this process set aside (a read-only cache keeps the file)


def _timings_now(profile: Profile, keys: list[str]) -> dict[str, float | None]:
    """What the profile's timing cache holds now for these kernel keys (None: not measured)."""
    if not profile.timing_device or not keys:
        return {}
    cache = cache_for(profile.timing_device)
    with cache.lock:
        return {k: cache.entries.get(k) for k in sorted(keys)}
