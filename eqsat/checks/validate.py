"""Validation of one entry's plan before it is kept: its results against the original's, its collectives against
jax.jit's on sharded arguments, and its time against the original's (Limits.guard_seconds).

Each check takes the entry and values and returns what it found: a verdict (eqsat/plans/plan_life.py), the transitions
of the entry's life with the plan fields it found out (`findings`), which the calls' side (eqsat/dispatch/dispatcher.py)
applies. No check builds, saturates or extracts: where a plan is refused, naming the rules to blame, planning again or
extracting again without merges is planning's (eqsat/planning/refusals.py), which the dispatcher asks.
"""

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from eqsat.numerics import guard
from eqsat.numerics.tolerance import beyond_conditioning, comparable, differs, less_accurate, narrow_less_accurate
from eqsat.plans.plan_life import Entry, Event, Verdict
from eqsat.plans.sharding import added_collectives
from eqsat.support import processes, progress

log = logging.getLogger("eqsat")


@dataclass(frozen=True)
class Results:
    """What comparing a plan's results with the original's found: the original's results (comparable), and the
    first result that differs with what differs in it (None where none does)."""

    expected: list[Any]
    wrong: tuple[int, str] | None
    verdict: Verdict | None  # where nothing is left to planning: validated, or refused because of another process


def results(
    entry: Entry, flat: list[Any], got: list[Any] | None, narrow_source: Callable[..., Any] | None = None
) -> Results:
    """Compare the plan's results on flat (`got`, where the caller has them) with the original's. `narrow_source`:
    the program traced again on float32 inputs, for a plan that computes narrow chains in float32 (the captured
    one holds narrow constants)."""
    progress.begin("validate", "validate: compile and compare with the original")
    if entry.agreement is not None:  # several processes: each compares the whole values, the verdicts combined
        flat, got = processes.whole(flat), None if got is None else processes.whole(got)
    with jax.ensure_compile_time_eval():  # runs concretely even inside a caller's jit, scan or grad
        expected = comparable(_reference_results(entry, flat))
        got = comparable(entry.running(*flat) if got is None else got)
    if entry.agreement is not None:  # compiled for the whole values: the guard times the original as sharded
        entry.reference = None
    wrong = next(((k, p) for k, p in enumerate(map(differs, range(len(got)), expected, got)) if p), None)
    if wrong is not None:  # as accurate as the original, where the original itself leaves the digits undetermined
        with jax.ensure_compile_time_eval():
            wrong = beyond_conditioning(entry.original, flat, expected, got)
            if wrong is not None:
                wrong = less_accurate(entry.original, flat, expected, got, wrong)
    if wrong is None and narrow_source is not None and entry.plan.widened():  # judged against the float32 program
        with jax.ensure_compile_time_eval():
            wrong = narrow_less_accurate(jax.jit(narrow_source), flat, expected, got)
    if entry.agreement is not None and processes.any_of(f"{entry.agreement}/wrong", wrong is not None):
        if wrong is None:
            elsewhere = "optimized result differed from the original in another process"
            return Results(expected, None, Verdict((Event.MISMATCHED,), findings=(("fallback", elsewhere),)))
    elif wrong is None:
        return Results(expected, None, Verdict((Event.VALIDATED,)))
    return Results(expected, wrong, None)


def collectives(entry: Entry, flat: list[Any]) -> dict[str, int]:
    """The collectives the plan, compiled for these arguments' shardings, has beyond jax.jit's program's."""
    with jax.ensure_compile_time_eval():
        return added_collectives(entry.running, entry.original, flat)


def collectives_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def timed(
    entry: Entry,
    optimized: Callable[[], Any],
    original: Callable[[], Any],
    guard_seconds: float,
    name: str,
    warm: bool = False,
) -> Verdict:
    """Kept, slower or undecided, after timing the plan against the original within `guard_seconds` (once per
    plan; the verdict records what was measured, and where the plan is not kept, why the original runs). `warm`:
    both have run on these arguments already."""
    measured = entry.plan.measured
    if measured is None:
        progress.begin("measure", "measure the plan against the original")
        # outside any caller's trace, as the call that gave the results ran (compile-time evaluation would key
        # jax.jit's cache apart and compile the plan again: 2.8 s on NASNet-A)
        with jax.core.eval_context():
            across = None if entry.agreement is None else functools.partial(processes.slowest, entry.agreement)
            measured = guard.measure(
                original, optimized, guard_seconds, warm, entry.plan.predicted_speedup, across=across
            )
    return judged(measured, entry.key is not None, name)


def live_call(
    entry: Entry, plan: Callable[[], Any], original: Callable[[], Any], apply: Callable[[Verdict], Any], name: str
) -> tuple[bool, Any]:
    """A live call of an entry whose timing was undecided: one program, timed, the plan and the original taking
    turns (the order alternating between rounds), so that every two calls make one more round of the guard's test
    and no call runs both; each round's measurement, and the verdict once the rounds decide or settle, handed to
    `apply` (the dispatcher's) under the entry's lock. `plan`, `original`: the call's results from either program.
    Returns (whether it ran, its results): not where another thread's call holds the entry, or settled it
    meanwhile (then the call runs as any other)."""
    if not entry.lock.acquire(blocking=False):
        return False, None
    try:
        if not entry.undecided:  # settled by another thread's call meanwhile
            return False, None
        measured, first = entry.plan.measured, entry.live_half
        plan_now = guard.live_first(measured) is (first is None)
        with jax.core.eval_context():
            out, seconds = guard.live_timed(plan if plan_now else original, plan=plan_now)
        if first is None:
            entry.live_half = seconds
            return True, out
        entry.live_half = None
        measured = guard.with_round(measured, (first, seconds) if plan_now else (seconds, first))
        apply(judged(measured, entry.key is not None, name) if not measured["live"] else _measured(measured))
        return True, out
    finally:
        entry.lock.release()


def _measured(measured: dict[str, Any]) -> Verdict:
    return Verdict((), findings=(("measured", measured),))


def judged(measured: dict[str, Any], storable: bool, name: str) -> Verdict:
    """The verdict a measurement gives: kept, slower (to be stored where measured slower with confidence and the
    plan has a place in the store, `storable`) or undecided (the plan or the original running while live calls
    measure on)."""
    fallback = None if measured["kept"] else guard.describe(measured)
    findings = (("measured", measured), ("fallback", fallback))
    if measured.get("live"):
        log.info("eqsat: %s: %s", name, guard.describe(measured))
        return Verdict((Event.LEANING,) if measured["kept"] else (Event.UNDECIDED,), findings=findings)
    if measured["kept"]:
        return Verdict((Event.KEPT,), findings=findings)
    log.info("eqsat: %s: %s", name, fallback)
    # a later process runs the original at once
    return Verdict((Event.SLOWER,), findings=findings, store=storable and guard.refused_for_good(measured))


def _reference_results(entry: Entry, flat: list[Any]) -> list[Any]:
    """The original's results for flat: from the executable compiled in the background where it is ready to take
    these arguments, else from the original through jax.jit."""
    if entry.reference is not None:
        try:
            return list(entry.reference.result()(*flat))
        except Exception:  # it did not compile, or takes other arguments (a weak type, a committed device)
            log.debug("eqsat: the background reference did not run; compiling the original", exc_info=True)
            entry.reference = None
    return entry.original(*flat)


def compiled_original(entry: Entry) -> Callable[..., Any]:
    """The original as validation ran it: the executable compiled in the background where it took the arguments
    (timing it against the plan costs no second compile of the original), else the original through jax.jit."""
    return entry.reference.result() if entry.reference is not None else entry.original
