"""The plans of one function under one set of options, shared by every optimize() of it and by every thread.

One thread builds a signature's plan while the others that need it wait for it; a plan is validated once, under
its own lock, by the first call that settles it (on that call's arguments when they are of the plan's signature).
"""

import threading
import weakref
from collections.abc import Callable, Hashable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from eqsat.plans.plan_life import Entry
from eqsat.support.lru import LRU


@dataclass(eq=False)
class SharedPlans:
    entries: MutableMapping  # (signature, prepared) -> the entry api.Optimized runs
    saturated: MutableMapping  # signature -> capture and saturation, shared by both modes
    # An index of the cached entries' states, kept by the entries' own moves (track): the ids of those built and
    # not validated yet (a call in any thread may run one: jax.jit's trace cache is shared, so while this is not
    # empty every call settles its own signature's entry), and of those whose timing was undecided
    # (eqsat/numerics/guard.py; not prepare's, which times its own): while this is not empty, calls time them on live
    # calls
    unchecked: set[int] = field(default_factory=set)
    measuring: set[int] = field(default_factory=set)
    builds: int = 0  # how many entries were built unvalidated: a call during which it changed settles itself
    # how many plans built in the background became ready to run (or failed): a dispatch that has seen fewer
    # traces again, so that its next call runs them
    landings: int = 0
    # moves whenever a call may owe work after it runs (a trace, an unvalidated entry, a landing, a clear): a
    # call that finds it where its Optimized last settled skips straight to jax.jit's dispatch
    epoch: int = 0
    _locks: dict[Hashable, threading.RLock] = field(default_factory=dict)
    _locks_lock: threading.Lock = field(default_factory=threading.Lock)

    def building(self, signature: Hashable) -> threading.RLock:
        """The lock one thread holds while it builds this signature's plans (reentrant: a function may call
        itself, optimized, at another signature while it is captured)."""
        with self._locks_lock:
            return self._locks.setdefault(signature, threading.RLock())

    def track(self, entry: Entry) -> None:
        """An entry put in the cache: its state indexed, and again after each of its moves."""
        entry.observer = weakref.WeakMethod(self._index)
        self._index(entry)

    def _index(self, entry: Entry) -> None:
        key = id(entry)
        (self.unchecked.add if entry.unvalidated else self.unchecked.discard)(key)
        (self.measuring.add if entry.undecided and not entry.prepared else self.measuring.discard)(key)

    def land(self) -> None:
        """A plan built in the background is ready to run (from its job), or its job failed (its done-callback)."""
        with self._locks_lock:
            self.landings += 1
            self.epoch += 1

    def clear(self) -> None:
        """Forget the entries (the dispatcher moves each it may to cleared first); those still held by a thread
        move on unindexed."""
        for entry in list(self.entries.values()):
            entry.observer = None
        self.epoch += 1
        self.entries.clear()
        self.saturated.clear()
        self.unchecked.clear()
        self.measuring.clear()


@dataclass(eq=False)
class Handoff:
    """A first call's arguments, for the plan built in the background to be validated and compiled on (None where
    they were donated)."""

    call: tuple | None = None


class PerThread(threading.local):
    """What one thread's calls still owe the plans they built or ran: validation and the memory budget check."""

    def __init__(self) -> None:
        self.unvalidated: list[Any] = []
        self.unbudgeted: list[Any] = []
        self.staged = 0  # > 0 while a trace is not a call's (lower, trace, eval_shape, a settling rerun)
        # the call whose trace left its plan to the background and paused planning (eqsat/support/background.py) until
        # the call has run: it hands its arguments over, then resumes planning
        self.handoff: Handoff | None = None
        self.ready: tuple | None = None  # (key, entry) the planning thread compiles before it installs it


def per_thread(name: str, doc: str) -> property:
    """An attribute that is this thread's own, kept in the object's PerThread (`_pending`)."""
    return property(
        lambda self: getattr(self._pending, name), lambda self, value: setattr(self._pending, name, value), doc=doc
    )


# Plans are shared by every optimize() of one function with the same settings, as jax.jit shares its traces:
# weakly keyed by the function, so that `jax.jit(f)(x)` written inside a loop or a gradient plans f once.
_SHARED: "weakref.WeakKeyDictionary[Callable[..., Any], dict[tuple, SharedPlans]]" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared_plans(fun: Callable[..., Any], settings: tuple, cache_size: int) -> SharedPlans:
    """The plans of fun under these settings, each mapping keeping the `cache_size` signatures used last; fresh ones
    where fun cannot be weakly referenced."""
    try:
        with _SHARED_LOCK:
            return _SHARED.setdefault(fun, {}).setdefault(settings, SharedPlans(LRU(cache_size), LRU(cache_size)))
    except TypeError:  # not weakly referable or not hashable
        return SharedPlans(LRU(cache_size), LRU(cache_size))
