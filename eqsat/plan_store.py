"""Plans kept across processes: each plan stored as versioned JSON in the cache directory, by a key of its program
(the captured jaxpr and its constants) and of everything else that decides it (target profile, rules, limits,
extractor, parameters, eqsat's and jax's versions).

A new process optimizing the same function traces it, finds the plan by that key and skips saturation and
extraction; capture (one pass over the equations, which gives the constants and opaque calls a plan runs with)
runs. A plan priced by measured kernel times is reused only while the timing cache holds the same times for its
kernels. Validation runs on a kept plan's first call unless it accepted that plan in an earlier process (a plan is
validated once per signature within a process too). Set EQSAT_PLAN_STORE=off to neither read nor write stored plans.
"""

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from eqsat.encode import prelude
from eqsat.extract.cost import Profile, cache_dir
from eqsat.extract.plan import Plan
from eqsat.extract.report import PlanFormatError, plan_from_dict, plan_to_dict
from eqsat.extract.timing import cache_for, wanted_nodes
from eqsat.saturate import Snapshot

log = logging.getLogger("eqsat")

FORMAT = "eqsat-plan-store"
VERSION = 1
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # a function's address in a printed parameter differs per process


def enabled() -> bool:
    return os.environ.get("EQSAT_PLAN_STORE", "on").lower() not in ("off", "0", "false", "no")


def program_key(closed: jcore.ClosedJaxpr, settings: tuple) -> str:
    """The key of a program under these settings: a digest of the jaxpr's equations, its constants and the
    settings (written out here rather than printed by jax: printing a 2,000-equation jaxpr takes 0.2 s)."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{FORMAT}/{VERSION}/jax {jax.__version__}/{_code_version()}/{settings!r}".encode())
    _feed(digest, closed.jaxpr)
    for value in closed.consts:
        array = np.asarray(value)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


@functools.cache
def _code_version() -> str:
    """eqsat's version and a digest of its op table (the prelude it generates: every op's constructor, attributes
    and shape rules), so that a plan of another op table is never lowered with this one."""
    try:
        version = importlib.metadata.version("eqsat")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version}/{hashlib.blake2b(prelude().encode(), digest_size=12).hexdigest()}"


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
    """The stored plan of this key, or None: none stored, unreadable, of another version, or priced by kernel
    times the timing cache no longer holds. Its graph is None: the caller attaches the program it captured."""
    if not enabled():
        return None
    path = _path(key)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as error:
        log.warning("eqsat: ignoring the stored plan %s (%s)", path, error)
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        return None
    if data.get("timings") != _timings_now(profile, list(data.get("timings") or {})):
        return None
    try:
        plan = plan_from_dict(data["plan"])
    except (KeyError, PlanFormatError) as error:
        log.warning("eqsat: ignoring the stored plan %s (%s)", path, error)
        return None
    if data.get("validated"):
        plan.stats["stored_validated"] = 1.0
    return plan


def save(key: str, plan: Plan, profile: Profile, snapshots: Sequence[Snapshot] = ()) -> None:
    """Store the plan under its key, with the measured kernel times it was priced by, those of the e-graphs it was
    extracted from (a failure to write is logged, never raised: the plan in memory is what runs)."""
    if not enabled():
        return
    keys = [w.key for snapshot in snapshots for w in wanted_nodes(snapshot)]
    try:
        data: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "timings": _timings_now(profile, keys),
            "plan": plan_to_dict(plan),
        }
    except (TypeError, ValueError) as error:  # a value the JSON format cannot hold: the plan is not kept
        log.warning("eqsat: the plan is not kept across processes: %s", error)
        return
    _write(key, data)


def mark_validated(key: str) -> None:
    """Record that validation accepted the stored plan of this key: a later process does not validate it again."""
    if not enabled():
        return
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, json.JSONDecodeError):
        return
    if isinstance(data, dict) and data.get("format") == FORMAT and not data.get("validated"):
        _write(key, {**data, "validated": True})


def _write(key: str, data: dict[str, Any]) -> None:
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, allow_nan=False))
        tmp.replace(path)  # atomic: a reader in another process sees the old file or the new one
    except (OSError, TypeError, ValueError) as error:
        log.warning("eqsat: could not store the plan in %s (%s)", path, error)


def _timings_now(profile: Profile, keys: list[str]) -> dict[str, float | None]:
    """What the profile's timing cache holds now for these kernel keys (None: not measured)."""
    if not profile.timing_device or not keys:
        return {}
    cache = cache_for(profile.timing_device)
    with cache.lock:
        return {k: cache.entries.get(k) for k in sorted(keys)}
