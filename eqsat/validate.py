"""Validation of one entry's plan before it is kept: its results against the original's (on a mismatch, the rules
to blame, and the original runs), its collectives against jax.jit's on sharded arguments, and its time against the
original's (Limits.guard_seconds).

Each check records what it found in the plan and returns a verdict (eqsat/plan_life.py): the transitions of the
entry's life, which the calls' side (eqsat/dispatcher.py) applies; it decides when to run them and rebuilds its dispatch
where what runs changed.
"""

import functools
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax

from eqsat import guard, plan_store, processes, progress, rule_sources
from eqsat.backends.lower import lower
from eqsat.egraph_check import check_egraph
from eqsat.errors import EqsatWarning
from eqsat.ops import CONCAT
from eqsat.plan_life import Entry, Event, Verdict
from eqsat.planning import Planner
from eqsat.sharding import added_collectives
from eqsat.signature import flat_function
from eqsat.tolerance import beyond_conditioning, comparable, differs, less_accurate, narrow_less_accurate

log = logging.getLogger("eqsat")


def compare(planner: Planner, entry: Entry, flat: list[Any], got: list[Any] | None) -> Verdict:
    """Compare the plan's results on flat (`got`, where the caller has them) with the original's; on a mismatch
    find the rules involved and warn: the original runs."""
    progress.begin("validate", "validate: compile and compare with the original")
    if entry.agreement is not None:  # several processes: each compares the whole values, the verdicts combined
        flat, got = processes.whole(flat), None if got is None else processes.whole(got)
    with jax.ensure_compile_time_eval():  # runs concretely even inside a caller's jit, scan or grad
        expected = comparable(_reference_results(entry, flat))
        got = comparable(entry.call(*flat) if got is None else got)
    if entry.agreement is not None:  # compiled for the whole values: the guard times the original as sharded
        entry.reference = None
    wrong = next(((k, p) for k, p in enumerate(map(differs, range(len(got)), expected, got)) if p), None)
    if wrong is not None:  # as accurate as the original, where the original itself leaves the digits undetermined
        with jax.ensure_compile_time_eval():
            wrong = beyond_conditioning(entry.original, flat, expected, got)
            if wrong is not None:
                wrong = less_accurate(entry.original, flat, expected, got, wrong)
    if wrong is None and entry.plan.widened():  # narrow chains computed in float32: judged against the program
        # traced again on float32 inputs (the captured one holds narrow constants)
        with jax.ensure_compile_time_eval():
            source = jax.jit(flat_function(planner.fun, entry.signature)[0])
            wrong = narrow_less_accurate(source, flat, expected, got)
    if entry.agreement is not None and processes.any_of(f"{entry.agreement}/wrong", wrong is not None):
        if wrong is None:
            entry.plan.fallback = "optimized result differed from the original in another process"
            return Verdict((Event.MISMATCHED,))
    elif wrong is None:
        return Verdict((Event.VALIDATED,))
    k, problem = wrong
    stored = [entry.key] if entry.key and entry.plan.stats.get("stored") else []
    stored += entry.plan.graph.stored_bodies if entry.plan.graph is not None else []
    if stored:  # a kept plan (or body plan) changed since it was validated, or wrong on these values: planned again
        for key in stored:
            plan_store.set_aside(key, f"gave results that differ from the original's ({problem})")
        if entry.agreement is None:  # (several processes plan again together, in their next run)
            return _plan_again(planner, entry, flat)
        entry.plan.fallback = f"the kept plan differed from the original ({problem}); set aside"
        return Verdict((Event.MISMATCHED,))
    progress.begin("validate", "validate: finding the rules the mismatch depends on")
    with jax.ensure_compile_time_eval():
        entry.plan.blamed, exact = blame(planner, entry, flat, k, expected[k])
    where = rule_sources.rule_locations(list(planner.options.rules))
    suspects = ", ".join(f"{name} ({where[name]})" if name in where else name for name in entry.plan.blamed)
    suspects = (suspects or "none found") + ("" if exact else " (narrowing stopped by its time budget)")
    entry.plan.fallback = f"optimized result differed from the original ({problem}); rules involved: {suspects}"
    events = (Event.MISMATCHED,)
    if entry.key:  # a later process runs the original at once
        plan_store.save(entry.key, entry.plan, planner.options.profile)
        events += (Event.STORED,)
    warnings.warn(
        f"eqsat: the optimized {planner.name} differed from the original ({problem}); running the original "
        f"instead. Rules involved: {suspects}.",
        EqsatWarning,
        stacklevel=5,
    )
    return Verdict(events)


def _plan_again(planner: Planner, entry: Entry, flat: list[Any]) -> Verdict:
    """The entry planned afresh (its stored plans set aside) and compared on flat: replanned, or mismatched where
    the fresh plan runs the original; either way a call that ran the stored plan runs again."""
    planner.saturated.pop(entry.signature, None)  # its graph holds the stored body plans
    with jax.core.eval_context():
        fresh = planner.build(entry.signature, entry.prepared)
    if fresh.reference is not None:  # the entry's own reference compiles the same original
        fresh.reference.cancel()
    if fresh.call is fresh.original:
        return Verdict((Event.MISMATCHED,), fresh.plan)
    stored = (Event.STORED,) if Event.STORED in fresh.history else ()
    replanned = Verdict((Event.REPLANNED, *stored), fresh.plan, fresh.runs)
    return replanned.then(compare(planner, fresh, flat, None)) if not fresh.validated else replanned


def blame(planner: Planner, entry: Entry, flat: list[Any], k: int, want: Any) -> tuple[list[str], bool]:
    """The fired rules result k's mismatch depends on, and whether the search finished within its budget
    (Limits.blame_seconds; else a superset).

    First a 1-minimal set of rules that reproduces the mismatch, re-planning from the original graph with
    subsets of the fired rules: each rule alone, the user's first (one unsound rule is the usual case), then
    each rule dropped in turn where the mismatch stays without it. Some rules in that set may only make the
    wrong plan pay (a re-association that makes dropping an op worthwhile): of them, those whose e-graph,
    saturated with the rule alone, has an e-node disagreeing with its e-class on these arguments are the
    ones named, where there are any."""
    graph, fired = entry.plan.graph, list(entry.plan.rules_fired)
    rules = list(planner.options.rules)
    deadline = time.perf_counter() + planner.options.limits.blame_seconds
    builtin = set(rule_sources.builtin_groups())
    order = {name: src.name in builtin for src in rules for name in rule_sources.rule_names(src)}
    fired.sort(key=lambda name: (order.get(name, True), name))

    def saturated(names: list[str]) -> Any:
        keep = set(names)
        return planner.saturate(graph, rule_sources.keeping(rules, lambda rule: bool(keep & set(rule))))

    def reproduces(names: list[str]) -> bool:
        try:
            plan = planner.extract(graph, saturated(names), entry.prepared)
            have = comparable(jax.jit(lower(plan))(*flat))[k]
            return not planner.nothing_to_gain(plan) and differs(k, want, have) is not None
        except Exception:  # a subset may fail in its own way (a shape conflict): not this mismatch
            return False

    def unsound(name: str) -> bool:
        try:
            return bool(check_egraph(graph, saturated([name]), flat, real=True))
        except Exception:
            return False

    suspects = next(([name] for name in fired if time.perf_counter() < deadline and reproduces([name])), None)
    if suspects is None:
        suspects = list(fired)
        for name in fired:
            if time.perf_counter() >= deadline:
                return suspects, False
            rest = [r for r in suspects if r != name]
            if rest and reproduces(rest):
                suspects = rest
    wrong = [name for name in suspects if time.perf_counter() < deadline and unsound(name)]
    return wrong or suspects, time.perf_counter() < deadline


def keep_collectives(planner: Planner, entry: Entry, flat: list[Any]) -> Verdict | None:
    """Where the plan, compiled for these arguments' shardings, has a collective more than jax.jit's program
    (a merge along a sharded axis), it is extracted again without new concatenations (no merge is made, the
    other rewrites stay); if that one adds collectives too, the original runs: sharded programs keep their
    communication. None where nothing changes."""
    with jax.ensure_compile_time_eval():
        added = added_collectives(entry.call, entry.original, flat)
        done = planner.saturated.get(entry.signature)
        # (several processes: an extraction of one process's own would be its plan alone)
        if added and done is not None and CONCAT in entry.plan.rewritten_ops() and entry.agreement is None:
            unmerged = planner.extract(done.graph, done.snapshot, entry.prepared, forbid=frozenset({CONCAT}))
            if not planner.nothing_to_gain(unmerged):
                call = planner.runner(unmerged, done.flat_fun, done.closed)
                if not added_collectives(call, entry.original, flat):
                    unmerged.stats.update({k: v for k, v in entry.plan.stats.items() if k not in unmerged.stats})
                    unmerged.extraction.refused = _collectives_text(added) + " (merges not made)"
                    return Verdict((Event.UNMERGED,), unmerged, call)
    if not added:
        return None
    more = _collectives_text(added)
    entry.plan.fallback = f"the plan adds collectives that jax.jit's program lacks ({more}): the original runs"
    log.info("eqsat: %s: %s", planner.name, entry.plan.fallback)
    return Verdict((Event.FELL_BACK,))


def timed(
    planner: Planner, entry: Entry, optimized: Callable[[], Any], original: Callable[[], Any], warm: bool = False
) -> Verdict:
    """Kept, slower or undecided, after timing the plan against the original within Limits.guard_seconds (once
    per plan; the plan records what was measured, and where it is not kept, why the original runs). `warm`: both
    have run on these arguments already."""
    if entry.plan.measured is None:
        progress.begin("measure", "measure the plan against the original")
        # outside any caller's trace, as the call that gave the results ran (compile-time evaluation would key
        # jax.jit's cache apart and compile the plan again: 2.8 s on NASNet-A)
        with jax.core.eval_context():
            across = None if entry.agreement is None else functools.partial(processes.slowest, entry.agreement)
            entry.plan.measured = guard.measure(
                original,
                optimized,
                planner.options.limits.guard_seconds,
                warm,
                entry.plan.predicted_speedup,
                across=across,
            )
    return _judged(planner, entry)


def live_call(planner: Planner, entry: Entry, plan: Callable[[], Any], original: Callable[[], Any]) -> tuple[bool, Any]:
    """A live call of an entry whose timing was undecided: one program, timed, the plan and the original taking
    turns (the order alternating between rounds), so that every two calls make one more round of the guard's test
    and no call runs both; the verdict applied once the rounds decide or settle. `plan`, `original`: the call's
    results from either program. Returns (whether it ran, its results): not where another thread's call holds the
    entry, or settled it meanwhile (then the call runs as any other)."""
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
        entry.plan.measured = guard.with_round(measured, (first, seconds) if plan_now else (seconds, first))
        if not entry.plan.measured["live"]:
            entry.apply(_judged(planner, entry))
            entry.reference = None  # an executable of its own, kept only while live calls time it
        return True, out
    finally:
        entry.lock.release()


def _judged(planner: Planner, entry: Entry) -> Verdict:
    """The verdict the plan's measurement gives: kept, slower (stored where measured slower with confidence) or
    undecided (the plan or the original running while live calls measure on)."""
    measured = entry.plan.measured
    entry.plan.fallback = None if measured["kept"] else guard.describe(measured)
    if measured.get("live"):
        log.info("eqsat: %s: %s", planner.name, guard.describe(measured))
        return Verdict((Event.LEANING,) if measured["kept"] else (Event.UNDECIDED,))
    if measured["kept"]:
        return Verdict((Event.KEPT,))
    log.info("eqsat: %s: %s", planner.name, entry.plan.fallback)
    if entry.key and guard.refused_for_good(measured):  # a later process runs the original at once
        plan_store.save(entry.key, entry.plan, planner.options.profile)
        return Verdict((Event.SLOWER, Event.STORED))
    return Verdict((Event.SLOWER,))


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


def _collectives_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
