"""Many processes, one program: on multi-host JAX (`jax.distributed`, one process per host) every process must run
the same program at the same call, or their collectives wait on each other forever. Each decision that changes what
runs is made once and shared here, through the key-value store of the coordination service that
`jax.distributed.initialize` starts:

- the plan (built, loaded or refused) is process 0's: the others trace the function and run its plan (`share`);
- a verdict combines every process's evidence (`gather`): a plan wrong in any process is wrong everywhere, and the
  guard's rounds take the slowest process's times (`slowest`), so every process stops after the same round;
- what differs by process (a background plan landing, a guard left undecided to live calls) is not done at all.

Every exchange happens while the processes build or check a new signature's plan, which they do at the same call (the
first of that signature); the calls after it make none. With EQSAT_CHECK_LOCKSTEP=1 every call also gathers a
fingerprint of the program it ran and raises where the processes ran different ones (a debug mode: one round trip
per call). A process that waits longer than EQSAT_PROCESS_TIMEOUT seconds (default 900) for the others raises.
"""

import collections
import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from eqsat.support.errors import EqsatError

TIMEOUT_S = float(os.environ.get("EQSAT_PROCESS_TIMEOUT", "900"))
CHECK_LOCKSTEP = os.environ.get("EQSAT_CHECK_LOCKSTEP", "0").lower() not in ("0", "off", "false", "no", "")
# tests only: this process reports the plan's rounds as this many times slower (a guard that disagrees by process)
_PLAN_CLOCK = float(os.environ.get("EQSAT_TEST_PLAN_CLOCK", "1"))

_uses: collections.Counter[str] = collections.Counter()  # how often each topic was exchanged: the key's suffix
_uses_lock = threading.Lock()
_leading = threading.local()  # the topic this thread plans under for the others, in process 0


def count() -> int:
    """How many processes run this program (1 without jax.distributed)."""
    return jax.process_count()


def leads() -> bool:
    """Whether this process makes the decisions the others take (process 0)."""
    return jax.process_index() == 0


def index() -> int:
    return jax.process_index()


@contextlib.contextmanager
def leading(topic: str) -> Iterator[None]:
    """Process 0 plans under `topic` in here: its steps that the others take part in (measuring kernels) send them
    messages on it (`led`), which they follow until the plan comes."""
    _leading.topic = topic
    try:
        yield
    finally:
        _leading.topic = None


def led() -> str | None:
    """The topic process 0 plans under on this thread, None elsewhere (and with one process)."""
    return getattr(_leading, "topic", None)


def share(topic: str, value: str | None) -> str:
    """Process 0's `value` for `topic`, in every process: process 0 publishes it, the others wait for it (their
    `value` is ignored)."""
    key = _key(topic)
    if leads():
        _client().key_value_set(key, value if value is not None else "")
        return value if value is not None else ""
    return _waited(key, topic, 0)


def gather(topic: str, value: str) -> list[str]:
    """Every process's `value` for `topic`, in process order."""
    key = _key(topic)
    _client().key_value_set(f"{key}/{jax.process_index()}", value)
    return [_waited(f"{key}/{i}", topic, i) for i in range(count())]


def any_of(topic: str, mine: bool) -> bool:
    """Whether `mine` holds in any process."""
    return any(v == "1" for v in gather(topic, "1" if mine else "0"))


def slowest(topic: str, seconds: Sequence[float], stop: bool) -> tuple[list[float], bool]:
    """One guard round across the processes: each of `seconds` (the original's, then the plan's) as the slowest
    process measured it, and whether any process wants to stop (its time budget spent)."""
    mine = [seconds[0], *(s * _PLAN_CLOCK for s in seconds[1:]), float(stop)]
    rows = np.array([json.loads(v) for v in gather(topic, json.dumps(mine))])
    combined = rows.max(axis=0)
    return [float(s) for s in combined[:-1]], bool(combined[-1])


def whole(values: Sequence[Any]) -> list[Any]:
    """The values whole in this process: a global array that spans other processes' devices gathered (a
    collective: every process gathers the same values in the same order); any other value as it is."""
    from jax.experimental import multihost_utils

    def gathered(x: Any) -> Any:
        spans = isinstance(x, jax.Array) and not x.is_fully_addressable
        return multihost_utils.process_allgather(x, tiled=True) if spans else x

    return [gathered(x) for x in values]


def check_lockstep(name: str, program: str) -> None:
    """EQSAT_CHECK_LOCKSTEP: raise where another process's call ran another program than this one's."""
    found = gather(f"lockstep/{name}", program)
    if len(set(found)) > 1:
        raise EqsatError(
            f"eqsat: the processes ran different programs at one call of {name}: "
            + ", ".join(f"process {i}: {p}" for i, p in enumerate(found))
        )


def fingerprint(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _key(topic: str) -> str:
    """The store's key for this use of `topic`: the n-th exchange of a topic in one process meets the n-th in the
    others."""
    with _uses_lock:
        _uses[topic] += 1
        return f"eqsat/{topic}/{_uses[topic]}"


def _client() -> Any:
    from jax._src import distributed  # jax's own runtime: no public handle on its key-value store

    client = distributed.global_state.client
    if client is None:
        raise EqsatError("eqsat: several processes run this program, but not through jax.distributed.initialize")
    return client


def _waited(key: str, topic: str, process: int) -> str:
    try:
        return _client().blocking_key_value_get(key, int(TIMEOUT_S * 1000))
    except Exception as error:  # the coordination service's deadline, or its shutdown
        raise EqsatError(
            f"eqsat: process {jax.process_index()} waited {TIMEOUT_S:.0f} s for process {process} to decide "
            f"{topic!r} and gave up ({type(error).__name__}); every process must call the optimized function with "
            "the same signatures in the same order (set EQSAT_PROCESS_TIMEOUT to wait longer)"
        ) from None
