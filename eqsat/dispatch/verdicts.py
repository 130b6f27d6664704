"""The dispatcher's half that settles plans: it asks the checks (eqsat/checks/validate.py, eqsat/checks/budget.py) for
their verdicts, asks planning (eqsat/planning/refusals.py) what to do where one refuses a plan, and applies what they
return to the entry's life (eqsat/plans/plan_life.py). A mixin of Dispatcher (eqsat/dispatch/dispatcher.py), which
decides when a call settles and gives new entries their first state: the two are the only code that moves an entry.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from eqsat.checks import validate
from eqsat.checks.budget import check_budget, warn_over_budget
from eqsat.dispatch.jit import unexplained
from eqsat.planning import refusals
from eqsat.plans import plan_store
from eqsat.plans.plan_life import Entry, Event, State, Verdict
from eqsat.plans.sharding import partitioned
from eqsat.plans.signature import examples

if TYPE_CHECKING:
    from eqsat.dispatch.jit import JitDispatch
    from eqsat.planning.planner import Planner
    from eqsat.plans.options import ResolvedOptions
    from eqsat.plans.plan_cache import SharedPlans


class Verdicts:
    """Settling plans: validation, the guard and the budget asked, their verdicts applied."""

    options: "ResolvedOptions"
    planner: "Planner"
    plans: "SharedPlans"
    dispatch: "JitDispatch"
    _unvalidated: list[Entry]

    def compared(self, entry: Entry, flat: list[Any]) -> None:
        """An entry `prepare` runs (eqsat/dispatch/prepare.py), compared on flat now; it times the plan itself, as it
        runs it (with its parameters prepared)."""
        if entry in self._unvalidated:
            self._unvalidated.remove(entry)
        self._validate(entry, flat, measure=False)

    @unexplained
    def _validate(
        self,
        entry: Entry,
        flat: list[Any] | None = None,
        got: list[Any] | None = None,
        measure: bool = True,
        ran: Callable[[], Any] | None = None,
    ) -> bool:
        """Compare with the original on these arguments (without them: examples of the signature's shapes, as
        while tracing or before donation); fall back on mismatch. `got`: the optimized results for `flat`, where
        the caller has them already. Then (`measure`) time the plan against the original and keep the original
        where the plan is not faster (Limits.guard_seconds); `ran`: the call that gave `got` again, the plan as
        the dispatch runs it (else the plan is timed through entry.running, which compiles it apart).

        Returns whether the plan's results were wrong (here, or in the thread that validated it): a call that
        ran it runs again."""
        with entry.lock:
            before = entry.state
            if entry.state is State.BUILT:
                with jax.ensure_compile_time_eval():  # runs concretely even inside a caller's jit, scan or grad
                    flat = examples(entry.signature) if flat is None else flat
                self._apply(entry, self._compared(entry, flat, got))
                if entry.state is State.BUILT:  # replanned (a stored plan differed): the fresh plan compared
                    self._apply(entry, self._compared(entry, flat, None))
                ran = None if entry.mismatched else ran  # what the call ran does not run any more
                if entry.state is State.VALIDATED and partitioned(flat, entry.plan.graph):
                    added = validate.collectives(entry, flat)
                    if added:  # extracted again without merges, or the original
                        self._apply(entry, refusals.unmerged(self.planner, entry, flat, added))
                        self.dispatch.reset()
            if measure and entry.state is State.VALIDATED:
                self._apply(entry, self._timed(entry, flat, got, ran))
            if entry.state is not before:
                if entry.running is entry.original and entry.traced:  # before the plan counts as validated: no
                    self.dispatch.reset()  # call finds its trace
                if not entry.undecided:  # an executable of its own, kept only while live calls time it
                    entry.reference = None
        return entry.mismatched

    def _compared(self, entry: Entry, flat: list[Any], got: list[Any] | None) -> Verdict:
        """Validation's verdict on the plan's results; where they are wrong, planning's answer (the rules to blame,
        or a plan from the store set aside and planned again)."""
        narrow = self.planner.narrow_source(entry.signature) if entry.plan.widened() else None
        found = validate.results(entry, flat, got, narrow)
        return found.verdict or refusals.mismatched(self.planner, entry, flat, found)

    def _timed(
        self, entry: Entry, flat: list[Any] | None, got: list[Any] | None, ran: Callable[[], Any] | None
    ) -> Verdict:
        """The guard's verdict on a validated plan: kept where it is not timed (Limits.guard_seconds 0)."""
        if self.options.limits.guard_seconds <= 0:
            return Verdict((Event.KEPT,))
        with jax.ensure_compile_time_eval():
            flat = examples(entry.signature) if flat is None else flat
        original, optimized = validate.compiled_original(entry), entry.running
        plan_call = ran or (lambda: optimized(*flat))
        warm = ran is not None or got is None  # both ran on flat: the original in the comparison, the plan there
        return self._guarded(entry, plan_call, lambda: original(*flat), warm)  # or in the call

    def _guarded(self, entry: Entry, optimized: Callable[[], Any], original: Callable[[], Any], warm: bool) -> Verdict:
        limits = self.options.limits
        return validate.timed(entry, optimized, original, limits.guard_seconds, self.planner.name, warm)

    def timed_prepared(self, entry: Entry, optimized: Callable[[], Any], original: Callable[[], Any]) -> None:
        """A validated entry `prepare` runs (eqsat/dispatch/prepare.py), timed as it runs it, with its parameters
        prepared: once, by the first prepare of its signature."""
        with entry.lock:
            if entry.state is State.VALIDATED:
                kept = self.options.limits.guard_seconds <= 0
                self._apply(entry, Verdict((Event.KEPT,)) if kept else self._guarded(entry, optimized, original, False))

    def live_settled(self, entry: Entry) -> Callable[[Verdict], None]:
        """What a live round's measurement (validate.live_call) is applied by: the verdict, and once decided, the
        original's own executable let go (kept only while live calls time it)."""

        def settle(verdict: Verdict) -> None:
            self._apply(entry, verdict)
            if not entry.undecided:
                entry.reference = None

        return settle

    def _apply(self, entry: Entry, verdict: Verdict) -> None:
        """The one place an entry's life moves once it is built: the verdict applied, and a plan (or refusal) it
        asks to store written to the plan store, then recorded."""
        entry.apply(verdict)
        if verdict.store and entry.key:
            plan_store.save(entry.key, entry.plan, self.options.target_profile)
            entry.move(Event.STORED)

    def _budgeted(self, entries: list[Entry], args: tuple, kwargs: dict[str, Any]) -> None:
        """The memory budget's verdict on the program this call compiled, for each plan this thread built; over it,
        a gradient's loss rematerialized where it fits (planning's answer), else a warning."""
        compiled = self.dispatch.run.lower(*args, **kwargs).compile()
        found, over = check_budget(entries, compiled, self.options.memory_budget, self.options.donate_argnums)
        refitted = False
        for entry, verdict in found:
            self._apply(entry, verdict)
            if over is not None:
                refit = None if kwargs else refusals.rematerialized(self.planner, entry, args)
                if refit is None:
                    warn_over_budget(self.planner.name, over, self.options.memory_budget)
                else:
                    self._apply(entry, refit)
                    refitted = True
        if refitted:
            self.dispatch.reset()
