"""What planning does when a check refused a plan (eqsat/checks/validate.py, eqsat/checks/budget.py): names the rules a
mismatch depends on (blame), plans again where a plan from the store differed, extracts again without merges where the
plan added collectives, and runs a gradient's loss as rematerialized segments where it is over the memory budget. Each
returns a verdict (eqsat/plans/plan_life.py) for the dispatcher to apply; the checks themselves never plan.
"""

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax

from eqsat.backends.lower import lower
from eqsat.backends.memory import fit_budget
from eqsat.checks import validate
from eqsat.egraph import rule_sources
from eqsat.egraph.check import check_egraph
from eqsat.numerics.tolerance import comparable, differs
from eqsat.ops.table import CONCAT
from eqsat.planning.planner import Planner
from eqsat.plans import plan_store
from eqsat.plans.plan_life import Entry, Event, Verdict
from eqsat.plans.sharding import added_collectives
from eqsat.support.errors import EqsatWarning

log = logging.getLogger("eqsat")


def mismatched(planner: Planner, entry: Entry, flat: list[Any], found: validate.Results) -> Verdict:
    """After validation found the plan's results wrong (`found`): a plan from the store is set aside and the entry
    planned again; any other is refused, the rules involved named (and warned about), the refusal to be stored."""
    k, problem = found.wrong
    stored = [entry.key] if entry.key and entry.plan.stats.get("stored") else []
    stored += entry.plan.graph.stored_bodies if entry.plan.graph is not None else []
    if stored:  # a kept plan (or body plan) changed since it was validated, or wrong on these values: planned again
        for key in stored:
            plan_store.set_aside(key, f"gave results that differ from the original's ({problem})")
        if entry.agreement is None:  # (several processes plan again together, in their next run)
            return _planned_again(planner, entry, flat)
        fallback = f"the kept plan differed from the original ({problem}); set aside"
        return Verdict((Event.MISMATCHED,), findings=(("fallback", fallback),))
    with jax.ensure_compile_time_eval():
        blamed, exact = blame(planner, entry, flat, k, found.expected[k])
    where = rule_sources.rule_locations(list(planner.options.rule_sources))
    suspects = ", ".join(f"{name} ({where[name]})" if name in where else name for name in blamed)
    suspects = (suspects or "none found") + ("" if exact else " (narrowing stopped by its time budget)")
    fallback = f"optimized result differed from the original ({problem}); rules involved: {suspects}"
    warnings.warn(
        f"eqsat: the optimized {planner.name} differed from the original ({problem}); running the original "
        f"instead. Rules involved: {suspects}.",
        EqsatWarning,
        stacklevel=6,
    )
    # stored: a later process runs the original at once
    return Verdict((Event.MISMATCHED,), findings=(("blamed", blamed), ("fallback", fallback)), store=bool(entry.key))


def _planned_again(planner: Planner, entry: Entry, flat: list[Any]) -> Verdict:
    """The entry planned afresh (its stored plans set aside): replanned, with the fresh plan, which the dispatcher
    compares again on flat; or mismatched where the fresh plan runs the original. Either way a call that ran the
    stored plan runs again."""
    planner.saturated.pop(entry.signature, None)  # its graph holds the stored body plans
    with jax.core.eval_context():
        fresh = planner.build(entry.signature, entry.prepared)
    if fresh.entry.reference is not None:  # the entry's own reference compiles the same original
        fresh.entry.reference.cancel()
    if not fresh.runs_plan:
        return Verdict((Event.MISMATCHED,), fresh.entry.plan)
    stored = (Event.STORED,) if Event.STORED in fresh.events else ()
    return Verdict((Event.REPLANNED, *stored), fresh.entry.plan, fresh.entry.plan_program)


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
    rules = list(planner.options.rule_sources)
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


def unmerged(planner: Planner, entry: Entry, flat: list[Any], added: dict[str, int]) -> Verdict:
    """Where the plan added collectives (validate.collectives, a merge along a sharded axis), the plan extracted
    again without new concatenations (no merge is made, the other rewrites stay); if that one adds collectives too,
    the original runs: sharded programs keep their communication."""
    done = planner.saturated.get(entry.signature)
    # (several processes: an extraction of one process's own would be its plan alone)
    if done is not None and CONCAT in entry.plan.rewritten_ops() and entry.agreement is None:
        with jax.ensure_compile_time_eval():
            plan = planner.extract(done.graph, done.snapshot, entry.prepared, forbid=frozenset({CONCAT}))
            if not planner.nothing_to_gain(plan):
                call = planner.runner(plan, done.flat_fun, done.closed)
                if not added_collectives(call, entry.original, flat):
                    plan.stats.update({k: v for k, v in entry.plan.stats.items() if k not in plan.stats})
                    plan.extraction.refused = validate.collectives_text(added) + " (merges not made)"
                    return Verdict((Event.UNMERGED,), plan, call)
    more = validate.collectives_text(added)
    fallback = f"the plan adds collectives that jax.jit's program lacks ({more}): the original runs"
    log.info("eqsat: %s: %s", planner.name, fallback)
    return Verdict((Event.FELL_BACK,), findings=(("fallback", fallback),))


def rematerialized(planner: Planner, entry: Entry, call_args: tuple) -> Verdict | None:
    """For a gradient of a loss over the memory budget (jax.grad keeps the loss as __wrapped__): the program that
    runs the loss as rematerialized segments, where it fits, as a refit. The loss is planned with the gradient's
    options. None where it does not fit (or is no such gradient)."""
    fun, options = planner.fun, planner.options
    loss: Callable[..., Any] | None = getattr(fun, "__wrapped__", None)
    if loss is None or options.static_argnums:
        return None
    loss_plan = Planner(loss, options, {}).plan(call_args)
    fitted, report = fit_budget(fun, call_args, options.memory_budget, loss=loss, loss_plan=loss_plan)
    if not report.fits:
        return None
    tree = jax.tree_util.tree_structure(list(call_args))
    memory = dataclasses.replace(
        entry.plan.memory, xla=report.achieved, applied=[*entry.plan.memory.applied, report.mechanism]
    )
    runs = jax.jit(lambda *flat: jax.tree_util.tree_leaves(fitted(*jax.tree_util.tree_unflatten(tree, flat))))
    return Verdict((Event.REFITTED,), plan_program=runs, findings=(("memory", memory),))
