"""The calls' side of an optimized function (its jax.jit-compatible front is eqsat/api.py's Optimized): the jax.jit
dispatch whose traces inline each signature's entry, the entries' building and landing, and what a call owes after
it runs (validation, the guard, the memory budget), applied to each entry's life (eqsat/plans/plan_life.py).

A call goes to jax.jit; where jax.jit traces a signature not planned yet, the pipeline (eqsat/planning/planner.py:
capture -> saturate -> extract -> lower) builds its plan from the signature's abstract values under jax's eval context,
so planning never sees the trace (stopping the trace and calling again instead costs jax.jit's C++ fast path: a
signature whose first trace raised stays on the Python path, 60 us a call where 4 us is usual). A plan's first use
validates it (eqsat/checks/validate.py). A call that owes nothing (no plan to validate, switch to or budget,
nothing traced since its object last settled: the shared plans' epoch has not moved) is jax.jit's call
alone (benches/dispatch.py).

With background on (the default), a call's first trace of a signature runs the original, as jax.jit would, and the
signature's plan is built, validated, timed and compiled on the planning thread (eqsat/support/background.py); the calls
switch to it once it is ready. Under an outer transformation (jax.grad, an enclosing jax.jit, vmap) and for
`.lower`, `.plan` and `prepare`, the plan is waited for: what they trace is kept by the caller.
"""

import contextlib
import functools
import logging
import warnings
import weakref
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future
from typing import Any

import jax
from jax._src import config

from eqsat.checks import validate
from eqsat.dispatch.jit import JitDispatch, called_eagerly, inlined, runs_now, unexplained
from eqsat.dispatch.verdicts import Verdicts
from eqsat.planning.planner import Captured, Planner
from eqsat.plans.options import ResolvedOptions
from eqsat.plans.plan_cache import Handoff, PerThread, SharedPlans, per_thread, shared_plans
from eqsat.plans.plan_life import Entry, Event, NewEntry, State
from eqsat.plans.sharding import partitioned
from eqsat.plans.signature import Signature, concrete, examples, signature_of, threads_share
from eqsat.support import background, processes
from eqsat.support.errors import EqsatError, EqsatWarning

log = logging.getLogger("eqsat")


class Dispatcher(Verdicts):
    """One optimized function's jax.jit dispatch and the entries its traces run. The plans (entries, captures and
    saturations) are shared by every optimize() of the function with the same options, and by every thread."""

    def __init__(self, fun: Callable[..., Any], options: ResolvedOptions) -> None:
        self.fun, self.options = fun, options
        self.plans = shared_plans(fun, options.settings, options.cache_size)
        self.cache = self.plans.entries  # (signature, prepared) -> entry
        self.planner = Planner(fun, options, self.plans.saturated)
        self._pending = PerThread()  # what this thread's calls built or ran and have not settled yet
        self.dispatch = JitDispatch(self._traced, fun, options.dispatch_options(), self.plans)
        self._warm: JitDispatch | None = None  # a dispatch with a plan built in the background compiled in it
        self.quiet: int | None = None  # the plans' epoch at which these calls last owed nothing

    def clear(self) -> None:
        """Forget every plan (of this function and settings, however often wrapped) and trace."""
        for entry in list(self.cache.values()):
            # one being compared (its lock held) or not compared yet stays as it is: a call holding it settles it
            if not entry.unvalidated and entry.lock.acquire(blocking=False):
                try:
                    entry.move(Event.CLEARED)
                finally:
                    entry.lock.release()
        self.plans.clear()
        self._warm = None
        self._unvalidated.clear()
        self._unbudgeted.clear()
        self.dispatch.reset()

    def info(self) -> dict[str, int]:
        planning = sum(1 for e in self.cache.values() if e.state is State.BUILDING and not e.job.done())
        return {"plans": len(self.cache), "cache_size": self.cache.size, "planning": planning}

    def call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A call that may owe work: switch to a plan that landed, run, then settle what the run traced or ran."""
        if jax.config.jax_disable_jit:  # as jax.jit does: the function runs op by op
            return self.fun(*args, **kwargs)
        if self.dispatch.landings != self.plans.landings:  # a plan built in the background is ready to run
            self._switch_dispatch()
        if self.plans.measuring and (live := self._live_call(args, kwargs)) is not None:
            return live[0]
        # a plan not validated yet may run in this call, even one another thread builds while it runs (jax.jit's
        # trace cache is shared): then the call settles its signature's plan
        unsettled, builds, out = bool(self.plans.unchecked), self.plans.builds, None
        try:
            out = self.dispatch.run(*args, **kwargs)
        finally:
            self.hand_over(args, kwargs, out)
        out = self.finish(args, kwargs, out, raced=unsettled or builds != self.plans.builds)
        if processes.CHECK_LOCKSTEP:
            processes.check_lockstep(self.planner.name, self.dispatch.ran.get(self.signature(args, kwargs)[1], "?"))
        return out

    def hand_over(self, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        """Where this call's trace left its plan to the background: its arguments handed over, and planning
        resumed once the call has run (jax runs it asynchronously: NASNet-A, 0.6 s)."""
        handoff, self._pending.handoff = self._pending.handoff, None
        if handoff is None:
            return
        handoff.call = None if self.dispatch.donates else (args, kwargs)
        try:
            jax.block_until_ready(out)
        finally:
            background.resume()

    def finish(self, args: tuple, kwargs: dict[str, Any], out: Any, raced: bool) -> Any:
        """After a call that may owe work: settle it; where nothing is left owed, the next calls take the fast
        path until the epoch moves again."""
        if raced or self.owed():
            out = self._settle(lambda run: run(*args, **kwargs), args, kwargs, out, results=out, raced=raced)
        epoch = self.plans.epoch  # read before the checks: a move after it leaves the fast path off
        if not self.owed() and self.dispatch.landings == self.plans.landings and not processes.CHECK_LOCKSTEP:
            self.quiet = epoch
        return out

    def owed(self) -> bool:
        """Whether a call owes work: a plan unvalidated (by any thread), or this thread's budget to check."""
        return bool(self.plans.unchecked or self.plans.measuring or self._unvalidated or self._unbudgeted)

    @unexplained
    def _live_call(self, args: tuple, kwargs: dict[str, Any]) -> tuple[Any] | None:
        """Where the guard was undecided on this call's signature, the call runs one of the two programs, timed
        (validate.live_call: the one the dispatch runs, as it runs it, or the other alone); once the rounds decide,
        the entry settles, and every dispatch of these plans traces again where what runs changed. (results,), or
        None where the call runs as any other."""
        flat, signature = self.signature(args, kwargs)
        entry = self.cache.get((signature, False))
        if entry is None or id(entry) not in self.plans.measuring or self.dispatch.donates or not runs_now(flat):
            return None
        runs = entry.running
        dispatched = functools.partial(self.dispatch.run, *args, **kwargs)
        alone = entry.plan_program if runs is entry.original else validate.compiled_original(entry)

        def other() -> Any:
            return jax.tree_util.tree_unflatten(entry.out_tree, alone(*flat))

        plan, original = (other, dispatched) if runs is entry.original else (dispatched, other)
        ran, out = validate.live_call(entry, plan, original, self.live_settled(entry), self.planner.name)
        if not ran:
            return None
        if not entry.undecided and entry.running is not runs:
            self.plans.land()  # every dispatch of these plans traces it again
        return (out,)

    def _switch_dispatch(self) -> None:
        """To the dispatch the planning thread compiled a plan in, where it did; else a fresh trace cache."""
        warm, self._warm = self._warm, None
        if warm is None:
            self.dispatch.reset()
        else:
            warm.landings, self.dispatch = self.plans.landings, warm

    def _traced(self, dispatch: JitDispatch, *args: Any, **kwargs: Any) -> Any:
        """The body `dispatch` traces: look up (or build) the plan for these abstract values and inline it."""
        if jax.config.jax_disable_jit:  # jax.jit calls its body on the values: the function runs op by op
            return self.fun(*args, **kwargs)
        self.plans.epoch += 1  # the call that traced settles what its trace built
        flat, signature = self.signature(args, kwargs)
        # with background on, a call's own trace on concrete arguments (not one an outer transformation or `.lower`
        # keeps), under no context of this thread's own, may leave its plan to the planning thread
        # (not with several processes: each would switch to its plan at its own call, eqsat/support/processes.py)
        tiered = self.options.background and not self._pending.staged and called_eagerly()
        tiered = tiered and threads_share(signature) and processes.count() == 1
        with jax.core.eval_context():  # planning runs on plain values, outside this trace
            entry = self.entry(signature, tiered=tiered)
        entry.traced = True
        if dispatch.donates and entry in self._unvalidated:  # the arguments are gone after the call
            self._unvalidated.remove(entry)
            self._validate(entry)
        with config.explain_cache_misses(False):  # the plan's own jax.jit objects, traced inline
            out = inlined(entry.running)(*flat)
        if processes.CHECK_LOCKSTEP:
            dispatch.ran[signature] = _program(entry, flat)
        return jax.tree_util.tree_unflatten(entry.out_tree, out)

    def checked(self, stage: Callable[[Any], Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """stage(jax.jit object): a call, trace or lowering, then settled; of the plan, where one is being built."""
        _, signature = self.signature(args, kwargs)
        pending = self.cache.get((signature, False))
        if pending is not None and pending.state is State.BUILDING:
            self.entry(signature)
        unsettled, builds = bool(self.plans.unchecked), self.plans.builds
        with self._staged():
            out = stage(self.dispatch.run)
        return self._settle(stage, args, kwargs, out, raced=unsettled or builds != self.plans.builds)

    @contextlib.contextmanager
    def _staged(self) -> Iterator[None]:
        """Traces in here are not a call's own (a lowering, a settling rerun): they never leave a plan to the
        background."""
        self._pending.staged += 1
        try:
            yield
        finally:
            self._pending.staged -= 1

    @unexplained
    def _settle(
        self,
        stage: Callable[[Any], Any],
        args: tuple,
        kwargs: dict[str, Any],
        out: Any,
        results: Any = None,
        raced: bool = False,
    ) -> Any:
        """Plans built by the stage that gave `out` are validated (on these arguments where they are concrete and
        of the plan's signature, else on examples of its shapes) and, on a mismatch, the dispatch is rebuilt so
        that the stage runs again on the original program. `results`: what a call returned, the optimized
        program's results for these arguments, compared as they are instead of compiling the plan again.
        `raced`: a plan was unvalidated at some point during the stage, so the stage may have run this
        signature's plan before another thread's validation of it fell back."""
        with self._staged():
            return self._settle_staged(stage, args, kwargs, out, results, raced)

    def _settle_staged(
        self, stage: Callable[[Any], Any], args: tuple, kwargs: dict[str, Any], out: Any, results: Any, raced: bool
    ) -> Any:
        if self._unbudgeted:
            entries, self._unbudgeted = self._unbudgeted, []
            self._budgeted(entries, args, kwargs)
        pending, self._unvalidated = self._unvalidated, []
        flat, signature = self.signature(args, kwargs)
        own = self.cache.get((signature, False))
        # traced by another thread, this call may have run it before it fell back (not where arguments are
        # donated: then every trace validates its plan before it runs it)
        maybe_ran = raced and own is not None and own.mismatched and not self.dispatch.donates
        # not validated yet, and traced, so that a call may have run it (one built in the background may not be yet)
        unvalidated = own is not None and own.unvalidated and own.traced
        if own is not None and own not in pending and (unvalidated or maybe_ran):
            pending.append(own)
        if not pending:
            return out
        got = jax.tree_util.tree_leaves(results) if results is not None else None
        if got is not None and any(isinstance(x, jax.core.Tracer) for x in got):  # concrete arguments, called
            got = None  # inside a trace (a scan body closing over them): the results are the trace's values
        mine = [concrete(flat) and e.signature == signature for e in pending]
        # a call's own plan is timed as the dispatch runs it: compiled already, where entry.running alone is not
        rerun = None if results is None or self.dispatch.donates else lambda: stage(self.dispatch.run)
        if any(
            [
                self._validate(e, flat if m else None, got if m else None, ran=rerun if m and not e.prepared else None)
                for e, m in zip(pending, mine, strict=True)
            ]
        ):
            self.dispatch.reset()
            out = stage(self.dispatch.run)
        return out

    def signature(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], Signature]:
        return signature_of(args, kwargs, self.options.static_argnums, self.options.static_argnames)

    def programs(self, args: tuple) -> tuple[Callable[[], list[Any]], Callable[[], list[Any]]]:
        """The captured program as jax.jit runs it (the one validation compiles) and the plan's program (the
        original where no plan runs), bound to these arguments: what a census times, apart from a call's
        validation and the guard's live calls (which would run the other program on half the calls)."""
        flat, signature = self.signature(args, {})
        entry = self.entry(signature)
        return functools.partial(entry.original, *flat), functools.partial(entry.plan_program or entry.original, *flat)

    _unvalidated = per_thread("unvalidated", "The plans this thread's calls built or ran and have not validated yet.")

    _unbudgeted = per_thread("unbudgeted", "The plans this thread built since its last budget check.")

    @unexplained
    def entry(self, signature: Signature, prepared: bool = False, tiered: bool = False) -> Entry:
        """The entry of this signature and mode, built by one thread while the others that need it wait.

        `tiered`: for a concrete call's trace, which may run the original while the plan is built in the
        background. Otherwise a plan being built is waited for (its job puts a plan that runs in the cache
        itself; what is left to take here is an original, or a failure)."""
        key = (signature, prepared)
        ready = self._pending.ready  # on the planning thread, compiling a plan before it is installed
        if ready is not None and ready[0] == key:
            return ready[1]
        entry = self.cache.get(key)
        if entry is None or _takes_job(entry, tiered):
            if entry is not None:  # waited for outside the lock, which the job takes to install its plan
                futures.wait([entry.job])
            with self.plans.building(signature):
                entry = self.cache.get(key)
                if entry is None:
                    entry = self._install(key, self._build(signature, prepared, tiered))
                elif _takes_job(entry, tiered):
                    entry = self._install(key, self._landed(entry, tiered))
        self._owe(entry)
        return entry

    def _build(self, signature: Signature, prepared: bool, tiered: bool) -> Entry:
        """The plan; or where a call's trace may leave it to the background (`tiered`), an entry that
        runs the original while the plan is built, validated, timed and compiled on the planning thread
        (validating and timing a model's plan is seconds: NASNet-A's, 5; compiling it, 2-3 more)."""
        if not tiered or prepared or self.options.memory_budget is not None:
            return _first_state(self.planner.build(signature, prepared))
        captured = self.planner.capture(signature)  # on this thread: the user's function traced as jax.jit would
        if isinstance(captured, NewEntry):
            return _first_state(captured)
        handoff = Handoff()  # the call's own arguments, once it has run, unless donating them deletes them
        background.pause()  # planning starts once this call has compiled and run the original
        self._pending.handoff = handoff
        # the job holds the function and its program weakly (the pending entry holds the program): one dropped
        # while its plan waits is freed at once, closure and all, as jax.jit frees it
        job = background.submit(
            functools.partial(_plan_weakly, weakref.ref(self), signature, prepared, weakref.ref(captured), handoff)
        )
        job.add_done_callback(functools.partial(_failed, weakref.ref(self.plans)))  # keeps no plan alive
        return _first_state(self.planner.pending_entry(signature, captured, job))

    @unexplained
    def _background_plan(self, signature: Signature, prepared: bool, captured: Captured, call: tuple | None) -> Entry:
        """On the planning thread: the plan built, validated and timed on the first call's arguments (`call`; on
        examples where they were donated), compiled as the dispatch runs it in a fresh dispatch the calls switch
        to (the call that switches only dispatches), and put in the cache; then the calls are told. A sharded
        plan is validated by that call, which also checks its collectives against jax.jit's."""
        entry = _first_state(self.planner.build(signature, prepared, captured))
        if entry.unvalidated:
            with jax.ensure_compile_time_eval():
                flat = examples(signature) if call is None else self.signature(*call)[0]
            if not partitioned(flat, entry.plan.graph):
                run = functools.partial(entry.running, *flat)
                with jax.core.eval_context():  # as the guard times it: one compile (compile-time eval keys apart)
                    got = jax.block_until_ready(run())
                self._validate(entry, flat, got, ran=run)
        if entry.running is entry.original and not entry.undecided:  # nothing to switch to: the calls' traces run
            return entry  # the original already (undecided, its calls time it: they find it in the cache)
        key = (signature, prepared)
        warm = self._compiled(key, entry, call) if not entry.unvalidated and call is not None else None
        with self.plans.building(signature):
            pending = self.cache.get(key)
            if (
                pending is None or pending.state is not State.BUILDING
            ):  # forgotten meanwhile (clear_cache, the LRU bound)
                return entry
            self._install(key, entry)
            self._warm = warm or self._warm
        self.plans.land()
        return entry

    def _compiled(self, key: tuple, entry: Entry, call: tuple) -> JitDispatch | None:
        """A fresh dispatch with the entry's plan traced and compiled in it, by a call on `call`'s arguments
        (the trace takes this entry, not the cache's: it is installed once compiled)."""
        warm = self.dispatch.fresh()
        self._pending.ready = (key, entry)
        try:
            with jax.core.eval_context():
                jax.block_until_ready(warm.run(*call[0], **call[1]))
            return warm
        except Exception:  # the call that switches compiles it instead
            log.debug("eqsat: compiling the plan in the background failed", exc_info=True)
            return None
        finally:
            self._pending.ready = None

    def _landed(self, pending: Entry, tiered: bool) -> Entry:
        """The entry a background job built, waited for. A bad rule or shape conflict it found is raised, or
        where a call's trace met it, warned of: the original keeps running."""
        try:
            return pending.job.result()
        except background.Stopped:
            return _unplanned(pending)
        except EqsatError as error:
            if not tiered:
                raise
            warnings.warn(f"{error}; running the original instead", EqsatWarning, stacklevel=2)
            return _unplanned(pending)

    def _install(self, key: tuple, entry: Entry) -> Entry:
        """A new entry in the cache; one not validated yet is settled by the calls that may run it."""
        replaced = self.cache.get(key)
        if replaced is not None and replaced is not entry and replaced.state is State.BUILDING:
            replaced.move(Event.LANDED)
        self.plans.track(entry)
        if entry.unvalidated:
            self.plans.builds += 1
            self.plans.epoch += 1  # after the entry counts as unchecked: a call that reads it sees the entry
        self.cache[key] = entry
        if self.options.memory_budget is not None:
            self._unbudgeted.append(entry)
        return entry

    def _owe(self, entry: Entry) -> None:
        """An unvalidated entry this thread built or traced: this thread's call settles it (or another's does)."""
        if entry.unvalidated and entry not in self._unvalidated:
            self._unvalidated.append(entry)


def _plan_weakly(
    optimized: "weakref.ref[Dispatcher]",
    signature: Signature,
    prepared: bool,
    captured: "weakref.ref[Captured]",
    handoff: Handoff,
) -> Entry:
    """A background job: the plan, unless the function or its pending entry was dropped while the job waited."""
    found, program = optimized(), captured()
    if found is None or program is None:
        raise background.Stopped
    return found._background_plan(signature, prepared, program, handoff.call)


def _failed(plans: "weakref.ref[SharedPlans]", job: Future) -> None:
    """A background job failed (a plan that ran lands from the job itself): the dispatches trace again, and the
    trace that meets the failure warns of it."""
    failed = job.exception() is not None and not isinstance(job.exception(), background.Stopped)
    if failed and (found := plans()) is not None:
        found.land()


def _program(entry: Entry, flat: list[Any]) -> str:
    """What a trace inlines, as EQSAT_CHECK_LOCKSTEP compares it between processes: the original, or a digest of
    the plan's program."""
    if entry.running is entry.original:
        return "the original"
    program = jax.make_jaxpr(inlined(entry.running))(*[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in flat])
    return f"plan {processes.fingerprint(str(program))}"


def _unplanned(pending: Entry) -> Entry:
    """In a pending entry's place, where its background job failed or stopped: the original, from its program."""
    return Entry(pending.signature, pending.plan, pending.original, pending.out_tree).move(Event.UNPLANNED)


def _first_state(new: NewEntry) -> Entry:
    """An entry planning made, moved by its first events (planning moves no entry)."""
    return new.entry.move(*new.events)


def _takes_job(entry: Entry, tiered: bool) -> bool:
    """Whether a lookup takes the plan the entry's background job builds: a finished one, or any where the
    caller cannot run the original meanwhile."""
    return entry.state is State.BUILDING and (entry.job.done() or not tiered)
