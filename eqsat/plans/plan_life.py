"""A plan's life: the states of one signature's entry, and the only transitions between them (TRANSITIONS).

```
 (new) -pending-> building -landed-> cleared          (the plan built in the background takes its place)
 (new) -planned | loaded-> built -validated-> validated -kept-> kept
                           built -mismatched-> original      validated -slower | fell back-> original
                           built -replanned-> built          validated -unmerged-> validated
 (new) -unplanned-> original                                 built -trusted-> kept   (validation off)
 validated -leaning-> trial  -kept-> kept      validated -undecided-> measuring -kept-> kept
                      trial  -slower-> original                       measuring -slower-> original
 built | original -stored-> (the same)      built | kept | original -refitted-> built | kept | kept
 any state -cleared-> cleared
```

`built`, `validated`, `trial` and `kept` run the plan; `building`, `measuring`, `original` and `cleared` run the
original. In `trial` and `measuring` the guard was undecided: live calls go on timing both (eqsat/numerics/guard.py).
Planning returns the entries it makes still new, with their first events (NewEntry); validation, the guard and the
memory budget return verdicts (eqsat/checks/validate.py, eqsat/checks/budget.py), as does planning's answer to a refusal
(eqsat/planning/refusals.py); the calls' side (eqsat/dispatch/) applies them here, so that what an entry runs changes in
this module only, at the dispatcher's request. `stored` records
that the plan (or its refusal) was written to the plan store (eqsat/plans/plan_store.py).
"""

import enum
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from eqsat.extract.plan import Plan
from eqsat.plans.signature import Signature


class State(enum.Enum):
    NEW = "new"  # before the first transition
    BUILDING = "building"  # its plan is built in the background; the original runs meanwhile
    BUILT = "built"  # a plan that runs, not compared with the original yet
    VALIDATED = "validated"  # the same results as the original; its time not measured yet
    TRIAL = "trial"  # validated, its timing undecided but leaning its way: the plan runs while live calls measure
    MEASURING = "measuring"  # validated, its timing undecided: the original runs while live calls measure
    KEPT = "kept"  # validated and not slower (or validation off): the plan runs
    ORIGINAL = "original"  # the original runs; plan.fallback (or nothing to gain) says why
    CLEARED = "cleared"  # forgotten (clear_cache), or its plan built in the background took its place


class Event(enum.Enum):
    PENDING = "pending"  # its plan left to the background
    PLANNED = "planned"  # extracted now
    LOADED = "loaded"  # kept from another process (eqsat/plans/plan_store.py): validated again in this one
    UNPLANNED = "unplanned"  # nothing to gain, a stored refusal or eqsat's own failure: the original runs
    TRUSTED = "trusted"  # validation is off: the plan runs unchecked
    STORED = "stored"  # written to the plan store
    VALIDATED = "validated"  # compared with the original: the same results
    MISMATCHED = "mismatched"  # compared with the original: other results
    REPLANNED = "replanned"  # a plan from the store gave other results: planned afresh, compared again
    UNMERGED = "unmerged"  # extracted again without the merges that added collectives on sharded arguments
    FELL_BACK = "fell back"  # its collectives differ from jax.jit's even unmerged
    KEPT = "kept"  # measured not slower than the original (or not measured)
    SLOWER = "slower"  # measured slower than the original
    LEANING = "leaning"  # measured undecided, leaning its way and predicted clearly faster: runs, measured on
    UNDECIDED = "undecided"  # measured undecided otherwise: the original runs, both measured on
    REFITTED = "refitted"  # over the memory budget: runs as rematerialized segments
    LANDED = "landed"  # the plan built in the background took its place
    CLEARED = "cleared"  # forgotten by clear_cache


_RUN_PLAN = (State.BUILT, State.VALIDATED, State.TRIAL, State.KEPT)
# (state, event) -> the state after it; nothing else may happen to an entry
TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.NEW, Event.PENDING): State.BUILDING,
    (State.NEW, Event.PLANNED): State.BUILT,
    (State.NEW, Event.LOADED): State.BUILT,
    (State.NEW, Event.UNPLANNED): State.ORIGINAL,
    (State.BUILT, Event.TRUSTED): State.KEPT,
    (State.BUILT, Event.STORED): State.BUILT,
    (State.ORIGINAL, Event.STORED): State.ORIGINAL,
    (State.BUILT, Event.VALIDATED): State.VALIDATED,
    (State.BUILT, Event.MISMATCHED): State.ORIGINAL,
    (State.BUILT, Event.REPLANNED): State.BUILT,
    (State.VALIDATED, Event.UNMERGED): State.VALIDATED,
    (State.VALIDATED, Event.FELL_BACK): State.ORIGINAL,
    (State.VALIDATED, Event.KEPT): State.KEPT,
    (State.VALIDATED, Event.SLOWER): State.ORIGINAL,
    (State.VALIDATED, Event.LEANING): State.TRIAL,
    (State.VALIDATED, Event.UNDECIDED): State.MEASURING,
    **{(state, Event.KEPT): State.KEPT for state in (State.TRIAL, State.MEASURING)},
    **{(state, Event.SLOWER): State.ORIGINAL for state in (State.TRIAL, State.MEASURING)},
    (State.BUILT, Event.REFITTED): State.BUILT,
    (State.KEPT, Event.REFITTED): State.KEPT,
    (State.ORIGINAL, Event.REFITTED): State.KEPT,
    (State.BUILDING, Event.LANDED): State.CLEARED,
    **{(state, Event.CLEARED): State.CLEARED for state in State if state is not State.NEW},
}


# what a check may find out about a plan, as the plan's fields it is recorded in (Verdict.findings)
FINDINGS = frozenset({"fallback", "measured", "blamed", "memory"})


@dataclass(frozen=True)
class Verdict:
    """What a check found (eqsat/checks/validate.py, eqsat/checks/budget.py) or what planning did after it
    (eqsat/planning/refusals.py), for the dispatcher to apply (Entry.apply): the transitions, with the plan and the
    program they bring, what was found (`findings`: plan fields, FINDINGS) and whether the plan, or its refusal, is to
    be written to the plan store (`store`: the dispatcher writes it, then records Event.STORED)."""

    events: tuple[Event, ...]
    plan: Plan | None = None
    plan_program: Callable[..., list[Any]] | None = None
    findings: tuple[tuple[str, Any], ...] = ()
    store: bool = False

    def __post_init__(self) -> None:
        unknown = {name for name, _ in self.findings} - FINDINGS
        if unknown:
            raise ValueError(f"a verdict records {sorted(FINDINGS)}, not {sorted(unknown)}")

    def then(self, later: "Verdict") -> "Verdict":
        return Verdict(
            self.events + later.events,
            later.plan or self.plan,
            later.plan_program or self.plan_program,
            self.findings + later.findings,
            self.store or later.store,
        )


def diagram() -> str:
    """TRANSITIONS as a mermaid state diagram, one arrow per pair of states with its events (the architecture page
    shows it; tests/test_plan_life.py checks the page against it)."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for (before, event), after in TRANSITIONS.items():
        source = "[*]" if before is State.NEW else before.value
        arrows.setdefault((source, after.value), []).append(event.value)
    lines = [f"    {a} --> {b}: {', '.join(events)}" for (a, b), events in arrows.items()]
    return "\n".join(["stateDiagram-v2", *lines])


class IllegalTransition(RuntimeError):
    """An entry was asked to change in a way its life does not allow: eqsat's own bug."""


@dataclass(eq=False)
class Entry:
    """One signature's plan and its life: what runs (`running`: the plan's program in the states that run it, else
    the original) follows from `state`, which only `move` changes."""

    signature: Signature
    plan: Plan
    original: Callable[..., list[Any]]  # the original, jitted, as the reference and the fallback
    out_tree: Any
    plan_program: Callable[..., list[Any]] | None = None  # flat args -> flat results
    prepared: bool = False  # extracted for `prepare`: parameter-only work priced as done once
    # the original compiled for validation in the background while the caller's jax.jit compiles the plan
    reference: Future | None = None
    key: str | None = None  # where the plan is kept across processes (eqsat/plans/plan_store.py)
    agreement: str | None = None  # the topic its processes agree on it under, with several (eqsat/support/processes.py)
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while validating: once, by one thread
    # the plan being built in the background (eqsat/support/background.py): until it is ready this entry runs the
    # original
    job: Future | None = None
    traced: bool = False  # a dispatch's trace runs it, so a call may have
    captured: Any = None  # the program its background job plans (the job holds it weakly)
    state: State = State.NEW
    history: list[Event] = field(default_factory=list)
    live_half: float | None = None  # undecided (trial, measuring): the seconds of the live round's first call
    # told after every move: the shared plans' index of states (eqsat/plans/plan_cache.py), once the entry is in the
    # cache; held weakly (the shared plans hold the entry: a cycle would wait for the garbage collector)
    observer: "weakref.WeakMethod | None" = None

    def move(
        self, *events: Event, plan: Plan | None = None, plan_program: Callable[..., list[Any]] | None = None
    ) -> "Entry":
        """The transitions `events`, in order (with the plan and program the last brings, where it brings them);
        one the life does not allow is refused."""
        for event in events:
            after = TRANSITIONS.get((self.state, event))
            if after is None:
                raise IllegalTransition(f"eqsat: a plan {self.state.value} cannot be {event.value}")
            self.state = after
            self.history.append(event)
        self.plan = plan or self.plan
        self.plan_program = plan_program or self.plan_program
        observe = None if self.observer is None else self.observer()
        if observe is not None:
            observe(self)
        return self

    def apply(self, verdict: Verdict) -> "Entry":
        self.move(*verdict.events, plan=verdict.plan, plan_program=verdict.plan_program)
        for name, value in verdict.findings:
            setattr(self.plan, name, value)
        return self

    @property
    def running(self) -> Callable[..., list[Any]]:
        """What a trace of this signature runs: the plan's program, or the original."""
        return self.plan_program if self.state in _RUN_PLAN and self.plan_program is not None else self.original

    @property
    def undecided(self) -> bool:
        """Its timing was undecided: live calls go on timing both programs (eqsat/numerics/guard.py)."""
        return self.state in (State.TRIAL, State.MEASURING)

    @property
    def unvalidated(self) -> bool:
        """A plan that runs and has not been compared with the original yet (built): a call that may have run it
        settles it."""
        return self.state is State.BUILT

    @property
    def mismatched(self) -> bool:
        """Its plan gave other results than the original's at some point: a call that ran it runs again."""
        return Event.MISMATCHED in self.history or Event.REPLANNED in self.history


@dataclass(frozen=True)
class NewEntry:
    """An entry planning made (eqsat/planning/planner.py), still new, and the first events of its life: the
    dispatcher applies them as it takes the entry, so that no module but the dispatcher moves an entry."""

    entry: Entry
    events: tuple[Event, ...]

    @property
    def becomes(self) -> State:
        """The state its first events take it to (TRANSITIONS), without taking it there."""
        state = self.entry.state
        for event in self.events:
            state = TRANSITIONS[state, event]
        return state

    @property
    def runs_plan(self) -> bool:
        return self.becomes in _RUN_PLAN and self.entry.plan_program is not None
