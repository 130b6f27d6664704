"""The plans of one function under one set of options, shared by every optimize() of it and by every thread.

One thread builds a signature's plan while the others that need it wait for it; a plan is validated once, under
its own lock, by the first call that settles it (on that call's arguments when they are of the plan's signature).
"""

import threading
import weakref
from collections.abc import Callable, Hashable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from eqsat.lru import LRU


@dataclass(eq=False)
class SharedPlans:
    entries: MutableMapping  # (signature, prepared) -> the entry api.Optimized runs
    saturated: MutableMapping  # signature -> capture and saturation, shared by both modes
    # entries built and not validated yet: a call in any thread may run one (jax.jit's trace cache is shared), so
    # while this is not empty every call settles its own signature's entry
    unchecked: set[int] = field(default_factory=set)
    builds: int = 0  # how many entries were built unvalidated: a call during which it changed settles itself
    # how many plans built in the background became ready to run (or failed): a dispatch that has seen fewer
    # traces again, so that its next call runs them
    landings: int = 0
    _locks: dict[Hashable, threading.RLock] = field(default_factory=dict)
    _locks_lock: threading.Lock = field(default_factory=threading.Lock)

    def building(self, signature: Hashable) -> threading.RLock:
        """The lock one thread holds while it builds this signature's plans (reentrant: a function may call
        itself, optimized, at another signature while it is captured)."""
        with self._locks_lock:
            return self._locks.setdefault(signature, threading.RLock())

    def land(self) -> None:
        """A plan built in the background is ready to run (from its job), or its job failed (its done-callback)."""
        with self._locks_lock:
            self.landings += 1

    def clear(self) -> None:
        self.entries.clear()
        self.saturated.clear()
        self.unchecked.clear()


class PerThread(threading.local):
    """What one thread's calls still owe the plans they built or ran: validation and the memory budget check."""

    def __init__(self) -> None:
        self.unvalidated: list[Any] = []
        self.unbudgeted: list[Any] = []
        self.call: tuple | None = None  # the arguments of the call whose dispatch runs now
        self.paused = False  # that call paused planning in the background (eqsat/background.py)
        self.ready: tuple | None = None  # (key, entry) the planning thread compiles before it installs it


# Plans are shared by every optimize() of one function with the same settings, as jax.jit shares its traces:
# weakly keyed by the function, so that `jax.jit(f)(x)` written inside a loop or a gradient plans f once.
_SHARED: "weakref.WeakKeyDictionary[Callable[..., Any], dict[tuple, SharedPlans]]" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared_plans(fun: Callable[..., Any], settings: tuple, size: int) -> SharedPlans:
    """The plans of fun under these settings, each mapping keeping the `size` signatures used last; fresh ones
    where fun cannot be weakly referenced."""
    try:
        with _SHARED_LOCK:
            return _SHARED.setdefault(fun, {}).setdefault(settings, SharedPlans(LRU(size), LRU(size)))
    except TypeError:  # not weakly referable or not hashable
        return SharedPlans(LRU(size), LRU(size))
