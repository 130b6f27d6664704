"""The public API: optimize() wraps a function like jax.jit; each input signature gets its own plan.

The wrapper is jax.jit's dispatch, a signature cache, validation and fallback. A call goes to jax.jit; where
jax.jit traces a signature not planned yet, the pipeline (eqsat/planning.py: capture -> saturate -> extract ->
lower) builds its plan from the signature's abstract values under jax's eval context, so planning never sees the
trace (stopping the trace and calling again instead costs jax.jit's C++ fast path: a signature whose first trace
raised stays on the Python path, 60 us a call where 4 us is usual). A plan's first use validates it
(eqsat/validate.py). A call that owes nothing (no plan to validate, switch to or budget, nothing traced since its
object last settled: the shared plans' epoch has not moved) is jax.jit's call alone (benches/dispatch.py).

With background=True (the default), a call's first trace of a signature runs the original, as jax.jit would,
and the signature's plan is built, validated, timed and compiled on the planning thread (eqsat/background.py);
the calls switch to it once it is ready. Under an outer transformation (jax.grad, an enclosing jax.jit, vmap) and
for `.lower`, `.plan` and `prepare`, the plan is waited for: what they trace is kept by the caller.
"""

import contextlib
import copy
import functools
import inspect
import logging
import os
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import jax
from jax._src import (
    config,
    source_info_util,  # register_exclusion: jax names the user's line, not eqsat's
)
from jax._src import core as jax_core  # the trace a body runs under, to tell a call on values from an outer trace

import eqsat.backends
import eqsat.extract
from eqsat import background, validate
from eqsat.backends import memory
from eqsat.backends.lower import overflow_guarded, with_weights
from eqsat.backends.memory import BudgetReport, MemoryReport, memory_report
from eqsat.buckets import Bucketed, Buckets
from eqsat.budget import check_budget
from eqsat.errors import EqsatError, EqsatWarning
from eqsat.extract.plan import Plan
from eqsat.ir import Role
from eqsat.options import Options, checked, checked_option, resolve
from eqsat.plan_cache import Handoff, PerThread, SharedPlans, shared_plans
from eqsat.plan_life import Entry, Event, State, Verdict
from eqsat.planning import Captured, Planner
from eqsat.saturate import Limits
from eqsat.sharding import partitioned
from eqsat.signature import Signature, aval_key, concrete, examples, merge_params, signature_of, threads_share

log = logging.getLogger("eqsat")


class _Dispatch:
    """jax.jit's fast path over a tracing body; reset() starts a fresh trace cache (after a fallback), fresh() a
    new dispatch beside it (one the planning thread compiles a plan in, before the calls switch to it).

    The body carries fun's signature (functools.wraps), so jax.jit resolves static_argnames and donate_argnames
    against the user's function exactly as it would for jax.jit(fun)."""

    def __init__(
        self, body: Callable[..., Any], fun: Callable[..., Any], jit_options: dict[str, Any], plans: SharedPlans
    ) -> None:
        # the body (a method of the Optimized) held weakly: no cycle, so that dropping the Optimized frees what
        # the function closes over at once, as dropping a jax.jit object does
        self.body, self.fun, self.jit_options, self.plans = weakref.WeakMethod(body), fun, jit_options, plans
        self.donates = bool(jit_options.get("donate_argnums") or jit_options.get("donate_argnames"))
        self.reset()

    def reset(self) -> None:
        self.landings = self.plans.landings  # the plans built in the background that this trace cache can run
        ref, dispatch = self.body, weakref.ref(self)  # weakly, as the body: no cycle through the jax.jit
        body = functools.wraps(self.fun, updated=())(lambda *args, **kwargs: ref()(dispatch(), *args, **kwargs))
        self.run = jax.jit(body, **self.jit_options)

    def fresh(self) -> "_Dispatch":
        new = copy.copy(self)
        new.reset()
        return new


def _per_thread(name: str, doc: str) -> property:
    """An attribute of the Optimized that is this thread's own (kept in its PerThread)."""
    return property(
        lambda self: getattr(self._pending, name), lambda self, value: setattr(self._pending, name, value), doc=doc
    )


# a cache miss's explanation (jax_explain_cache_misses) and a traced equation's source name the user's line
for _package in (eqsat, eqsat.backends, eqsat.extract):
    source_info_util.register_exclusion(os.path.join(os.path.dirname(_package.__file__), ""))


def _unexplained(method: Callable[..., Any]) -> Callable[..., Any]:
    """eqsat's own traces (capturing, planning, validating, timing, compiling a plan) explain no cache miss: with
    jax_explain_cache_misses on, a call explains its own trace, once, as jax.jit's call does."""

    @functools.wraps(method)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with config.explain_cache_misses(False):
            return method(*args, **kwargs)

    return quiet


class Optimized:
    """The callable optimize() returns: call it like the original (or like jax.jit(original): `.lower`, `.trace`,
    `.clear_cache`, jax.export); `.plan(*args)` shows what runs."""

    def __init__(self, fun: Callable[..., Any], options: Options) -> None:
        self.fun, self.options = fun, options
        # (signature, prepared) -> entry; signature -> capture and saturation: shared by every optimize() of fun
        # with these options, and by every thread
        self._plans = shared_plans(fun, options.settings, options.cache_size)
        self._cache = self._plans.entries
        self._planner = Planner(fun, options, self._plans.saturated)
        self._pending = PerThread()  # what this thread's calls built or ran and have not settled yet
        self._dispatch = _Dispatch(self._traced, fun, options.dispatch_options(), self._plans)
        self._warm: _Dispatch | None = None  # a dispatch with a plan built in the background compiled in it
        self._quiet: int | None = None  # the plans' epoch at which this object's calls last owed nothing
        # fun's name, doc, __wrapped__ and attributes, as jax.jit copies them, but never over our own state (fun
        # may carry a wrapped Optimized's, as jax.grad(optimize(f)) does)
        functools.update_wrapper(self, fun, updated=())
        vars(self).update({k: v for k, v in getattr(fun, "__dict__", {}).items() if k not in vars(self)})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        epoch = self._plans.epoch
        if self._quiet != epoch:  # something may be owed: a plan to validate, a landing, a trace
            return self._call(args, kwargs)
        try:
            out = self._dispatch.run(*args, **kwargs)  # jax.jit's call, and nothing else while nothing moved
        except BaseException:
            self._hand_over(args, kwargs, None)
            raise
        if self._plans.epoch == epoch:
            return out
        self._hand_over(args, kwargs, out)
        return self._finish(args, kwargs, out, raced=True)  # it may have run a plan another thread just built

    def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A call that may owe work: switch to a plan that landed, run, then settle what the run traced or ran."""
        if jax.config.jax_disable_jit:  # as jax.jit does: the function runs op by op
            return self.fun(*args, **kwargs)
        if self._dispatch.landings != self._plans.landings:  # a plan built in the background is ready to run
            self._switch_dispatch()
        # a plan not validated yet may run in this call, even one another thread builds while it runs (jax.jit's
        # trace cache is shared): then the call settles its signature's plan
        unsettled, builds, out = bool(self._plans.unchecked), self._plans.builds, None
        try:
            out = self._dispatch.run(*args, **kwargs)
        finally:
            self._hand_over(args, kwargs, out)
        return self._finish(args, kwargs, out, raced=unsettled or builds != self._plans.builds)

    def _hand_over(self, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        """Where this call's trace left its plan to the background: its arguments handed over, and planning
        resumed once the call has run (jax runs it asynchronously: NASNet-A, 0.6 s)."""
        handoff, self._pending.handoff = self._pending.handoff, None
        if handoff is None:
            return
        handoff.call = None if self._dispatch.donates else (args, kwargs)
        try:
            jax.block_until_ready(out)
        finally:
            background.resume()

    def _finish(self, args: tuple, kwargs: dict[str, Any], out: Any, raced: bool) -> Any:
        """After a call that may owe work: settle it; where nothing is left owed, the next calls take the fast
        path until the epoch moves again."""
        if raced or self._owed():
            out = self._settle(lambda run: run(*args, **kwargs), args, kwargs, out, results=out, raced=raced)
        epoch = self._plans.epoch  # read before the checks: a move after it leaves the fast path off
        if not self._owed() and self._dispatch.landings == self._plans.landings:
            self._quiet = epoch
        return out

    def _owed(self) -> bool:
        """Whether a call owes work: a plan unvalidated (by any thread), or this thread's budget to check."""
        return bool(self._plans.unchecked or self._unvalidated or self._unbudgeted)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """A method decorator, as jax.jit is: the instance becomes the first argument."""
        return self if obj is None else types.MethodType(self, obj)

    def trace(self, *args: Any, **kwargs: Any) -> jax.stages.Traced:
        """jax.jit's ahead-of-time trace of the optimized program (arguments may be jax.ShapeDtypeStructs)."""
        return self._checked(lambda run: run.trace(*args, **kwargs), args, kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """jax.jit's lowering of the optimized program: `.as_text()`, `.compile()`, `.cost_analysis()`."""
        return self._checked(lambda run: run.lower(*args, **kwargs), args, kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """jax.jit's eval_shape: the results' shapes and dtypes, as jax.ShapeDtypeStructs."""
        return self._checked(lambda run: run.eval_shape(*args, **kwargs), args, kwargs)

    def clear_cache(self) -> None:
        """Forget every plan (of this function and settings, however often wrapped) and trace, as jax.jit's
        clear_cache does."""
        self._plans.clear()
        self._warm = None
        self._unvalidated.clear()
        self._unbudgeted.clear()
        self._dispatch.reset()

    def cache_info(self) -> dict[str, int]:
        """How many plans the signature cache holds now, how many it keeps at most (cache_size), and how many of
        them are being built in the background (running the original meanwhile)."""
        planning = sum(1 for e in self._cache.values() if e.job is not None and not e.job.done())
        return {"plans": len(self._cache), "cache_size": self._cache.size, "planning": planning}

    def prepare(self, *params: Any) -> Callable[..., Any]:
        """A function of the remaining arguments, the parameters (params_argnums, in order) bound.

        It computes the weight-only part of each plan once, as an inference engine does when it builds.
        """
        params_argnums = self.options.params_argnums
        if len(params) != len(params_argnums):
            raise TypeError(f"prepare() takes the {len(params_argnums)} parameter argument(s) {params_argnums}")
        params_flat = jax.tree_util.tree_leaves(params)
        ready: dict[Any, Callable[[tuple, list[Any]], Any]] = {}

        def prepared(*rest: Any) -> Any:
            leaves, tree = jax.tree_util.tree_flatten(rest)
            key = (tree, tuple(aval_key(x) for x in leaves), config.trace_context())  # as a Signature is keyed
            if key not in ready:
                ready[key] = self._prepare_signature(params, rest, params_flat)
            return ready[key](rest, leaves)

        return prepared

    def _prepare_signature(self, params: tuple, rest: tuple, params_flat: list[Any]) -> Callable[[tuple, list], Any]:
        """Plan, validate and run the weight-only subgraph once, for one signature of the other arguments.

        Returns call(other arguments, their leaves). An unchanged plan calls the original through jax.jit, exactly
        as the caller would; otherwise the plan runs with the prepared weights, the leaves put in order at trace
        time."""
        params_argnums = self.options.params_argnums
        args = merge_params(params_argnums, params, rest)
        flat, signature = self._signature(args, {})
        entry = self._entry(signature, prepared=True)
        if entry in self._unvalidated:
            self._unvalidated.remove(entry)
        self._validate(entry, flat, measure=False)  # what runs is the plan with its weights prepared: timed below
        with entry.lock:
            if entry.state is State.VALIDATED and self.options.limits.guard_seconds <= 0:
                entry.move(Event.KEPT)
        original = jax.jit(self.fun, static_argnums=self.options.static_argnums)

        def unchanged(rest_args: tuple, _leaves: list[Any]) -> Any:
            return original(*merge_params(params_argnums, params, rest_args))

        if entry.call is entry.original:
            return unchanged
        is_param = [v.role is Role.PARAMETER for v in entry.plan.graph.input_variables()]

        def ordered(params_flat: list[Any], rest_flat: list[Any]) -> list[Any]:
            p, r = iter(params_flat), iter(rest_flat)
            return [next(p) if param else next(r) for param in is_param]

        watch = self._planner.overflow_watch(entry.plan)
        body, weights = with_weights(entry.plan, flat, watch)
        if watch:  # the original, the guard's fallback, takes no prepared weights
            original_flat, n = _inlined(entry.original), len(flat)
            body = overflow_guarded(body, lambda *args: original_flat(*args[:n]), len(watch))
        run = jax.jit(lambda p, r, w: body(*ordered(p, r), *w))
        leaves = [x for x, param in zip(flat, is_param, strict=True) if not param]
        with entry.lock:
            if entry.state is State.VALIDATED:
                optimized, plain = lambda: run(params_flat, leaves, weights), lambda: entry.original(*flat)
                entry.apply(validate.timed(self._planner, entry, optimized, plain))
        if entry.call is entry.original:
            return unchanged
        return lambda _rest, leaves: jax.tree_util.tree_unflatten(entry.out_tree, run(params_flat, leaves, weights))

    def _switch_dispatch(self) -> None:
        """To the dispatch the planning thread compiled a plan in, where it did; else a fresh trace cache."""
        warm, self._warm = self._warm, None
        if warm is None:
            self._dispatch.reset()
        else:
            warm.landings, self._dispatch = self._plans.landings, warm

    def _traced(self, dispatch: _Dispatch, *args: Any, **kwargs: Any) -> Any:
        """The body `dispatch` traces: look up (or build) the plan for these abstract values and inline it."""
        if jax.config.jax_disable_jit:  # jax.jit calls its body on the values: the function runs op by op
            return self.fun(*args, **kwargs)
        self._plans.epoch += 1  # the call that traced settles what its trace built
        flat, signature = self._signature(args, kwargs)
        # with background on, a call's own trace on concrete arguments (not one an outer transformation or `.lower`
        # keeps), under no context of this thread's own, may leave its plan to the planning thread
        tiered = self.options.background and not self._pending.staged and _called_eagerly()
        tiered = tiered and threads_share(signature)
        with jax.core.eval_context():  # planning runs on plain values, outside this trace
            entry = self._entry(signature, tiered=tiered)
        entry.traced = True
        if dispatch.donates and entry in self._unvalidated:  # the arguments are gone after the call
            self._unvalidated.remove(entry)
            self._validate(entry)
        with config.explain_cache_misses(False):  # the plan's own jax.jit objects, traced inline
            out = _inlined(entry.call)(*flat)
        return jax.tree_util.tree_unflatten(entry.out_tree, out)

    def _checked(self, stage: Callable[[Any], Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """stage(jax.jit object): a call, trace or lowering, then settled; of the plan, where one is being built."""
        _, signature = self._signature(args, kwargs)
        pending = self._cache.get((signature, False))
        if pending is not None and pending.job is not None:
            self._entry(signature)
        unsettled, builds = bool(self._plans.unchecked), self._plans.builds
        with self._staged():
            out = stage(self._dispatch.run)
        return self._settle(stage, args, kwargs, out, raced=unsettled or builds != self._plans.builds)

    @contextlib.contextmanager
    def _staged(self) -> Iterator[None]:
        """Traces in here are not a call's own (a lowering, a settling rerun): they never leave a plan to the
        background."""
        self._pending.staged += 1
        try:
            yield
        finally:
            self._pending.staged -= 1

    @_unexplained
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
            compiled = self._dispatch.run.lower(*args, **kwargs).compile()
            refitted = check_budget(self._planner, entries, compiled, args, kwargs)
            for entry, verdict in refitted:
                entry.apply(verdict)
            if refitted:
                self._dispatch.reset()
        pending, self._unvalidated = self._unvalidated, []
        flat, signature = self._signature(args, kwargs)
        own = self._cache.get((signature, False))
        # traced by another thread, this call may have run it before it fell back (not where arguments are
        # donated: then every trace validates its plan before it runs it)
        maybe_ran = raced and own is not None and own.mismatched and not self._dispatch.donates
        # not validated yet, and traced, so that a call may have run it (one built in the background may not be yet)
        unvalidated = own is not None and not own.validated and own.traced
        if own is not None and own not in pending and (unvalidated or maybe_ran):
            pending.append(own)
        if not pending:
            return out
        got = jax.tree_util.tree_leaves(results) if results is not None else None
        if got is not None and any(isinstance(x, jax.core.Tracer) for x in got):  # concrete arguments, called
            got = None  # inside a trace (a scan body closing over them): the results are the trace's values
        mine = [concrete(flat) and e.signature == signature for e in pending]
        # a call's own plan is timed as the dispatch runs it: compiled already, where entry.call alone is not
        rerun = None if results is None or self._dispatch.donates else lambda: stage(self._dispatch.run)
        if any(
            [
                self._validate(e, flat if m else None, got if m else None, ran=rerun if m and not e.prepared else None)
                for e, m in zip(pending, mine, strict=True)
            ]
        ):
            self._dispatch.reset()
            out = stage(self._dispatch.run)
        return out

    def plan(self, *args: Any, prepared: bool | None = None, **kwargs: Any) -> Plan:
        """The plan for arguments of these shapes and dtypes (built if needed).

        With parameters declared it is the plan `prepare` runs, unless prepared=False: then the plan a direct
        call runs, which prices weight-only work as the per-call work it is."""
        _, signature = self._signature(args, kwargs)
        return self._entry(signature, bool(self.options.params_argnums) if prepared is None else prepared).plan

    def profile(self, *args: Any) -> Any:
        """The kernel census at these arguments (eqsat/census.py): every kernel of the program timed alone against
        its roofline, the alternatives the plan chose, the program end to end; prints as a table, saves as JSON."""
        from eqsat import census  # a tool: the runtime never loads it

        return census.profile(self, args)

    def memory(self, *args: Any, **kwargs: Any) -> MemoryReport:
        """Memory of the plan for these arguments: liveness, best-fit arena, lower bound, a memory-aware order
        (our model) and XLA's own figure of the compiled program; also kept in the plan's summary."""
        flat, signature = self._signature(args, kwargs)
        entry = self._entry(signature)
        entry.plan.memory = memory_report(entry.plan, entry.call, flat)
        return entry.plan.memory

    def _signature(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], Signature]:
        return signature_of(args, kwargs, self.options.static_argnums, self.options.static_argnames)

    _unvalidated = _per_thread("unvalidated", "The plans this thread's calls built or ran and have not validated yet.")
    _unbudgeted = _per_thread("unbudgeted", "The plans this thread built since its last budget check.")

    @_unexplained
    def _entry(self, signature: Signature, prepared: bool = False, tiered: bool = False) -> Entry:
        """The entry of this signature and mode, built by one thread while the others that need it wait.

        `tiered`: for a concrete call's trace, which may run the original while the plan is built in the
        background. Otherwise a plan being built is waited for (its job puts a plan that runs in the cache
        itself; what is left to take here is an original, or a failure)."""
        key = (signature, prepared)
        ready = self._pending.ready  # on the planning thread, compiling a plan before it is installed
        if ready is not None and ready[0] == key:
            return ready[1]
        entry = self._cache.get(key)
        if entry is None or _takes_job(entry, tiered):
            if entry is not None:  # waited for outside the lock, which the job takes to install its plan
                futures.wait([entry.job])
            with self._plans.building(signature):
                entry = self._cache.get(key)
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
            return self._planner.build(signature, prepared)
        captured = self._planner.capture(signature)  # on this thread: the user's function traced as jax.jit would
        if isinstance(captured, Entry):
            return captured
        handoff = Handoff()  # the call's own arguments, once it has run, unless donating them deletes them
        background.pause()  # planning starts once this call has compiled and run the original
        self._pending.handoff = handoff
        # the job holds the function and its program weakly (the pending entry holds the program): one dropped
        # while its plan waits is freed at once, closure and all, as jax.jit frees it
        job = background.submit(
            functools.partial(_plan_weakly, weakref.ref(self), signature, prepared, weakref.ref(captured), handoff)
        )
        job.add_done_callback(functools.partial(_failed, weakref.ref(self._plans)))  # keeps no plan alive
        return self._planner.pending_entry(signature, captured, job)

    @_unexplained
    def _background_plan(self, signature: Signature, prepared: bool, captured: Captured, call: tuple | None) -> Entry:
        """On the planning thread: the plan built, validated and timed on the first call's arguments (`call`; on
        examples where they were donated), compiled as the dispatch runs it in a fresh dispatch the calls switch
        to (the call that switches only dispatches), and put in the cache; then the calls are told. A sharded
        plan is validated by that call, which also checks its collectives against jax.jit's."""
        entry = self._planner.build(signature, prepared, captured)
        if not entry.validated:
            with jax.ensure_compile_time_eval():
                flat = examples(signature) if call is None else self._signature(*call)[0]
            if not partitioned(flat, entry.plan.graph):
                run = functools.partial(entry.call, *flat)
                with jax.core.eval_context():  # as the guard times it: one compile (compile-time eval keys apart)
                    got = jax.block_until_ready(run())
                self._validate(entry, flat, got, ran=run)
        if entry.call is entry.original:  # nothing to switch to: the calls' traces run the original already
            return entry
        key = (signature, prepared)
        warm = self._compiled(key, entry, call) if entry.validated and call is not None else None
        with self._plans.building(signature):
            pending = self._cache.get(key)
            if pending is None or pending.job is None:  # forgotten meanwhile (clear_cache, the LRU bound)
                return entry
            self._install(key, entry)
            self._warm = warm or self._warm
        self._plans.land()
        return entry

    def _compiled(self, key: tuple, entry: Entry, call: tuple) -> _Dispatch | None:
        """A fresh dispatch with the entry's plan traced and compiled in it, by a call on `call`'s arguments
        (the trace takes this entry, not the cache's: it is installed once compiled)."""
        warm = self._dispatch.fresh()
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
        replaced = self._cache.get(key)
        if replaced is not None and replaced is not entry and replaced.state is State.BUILDING:
            replaced.move(Event.LANDED)
        if not entry.validated:
            self._plans.unchecked.add(id(entry))
            self._plans.builds += 1
            self._plans.epoch += 1  # after the entry counts as unchecked: a call that reads it sees the entry
        self._cache[key] = entry
        if self.options.memory_budget is not None:
            self._unbudgeted.append(entry)
        return entry

    def _owe(self, entry: Entry) -> None:
        """An unvalidated entry this thread built or traced: this thread's call settles it (or another's does)."""
        if not entry.validated and entry not in self._unvalidated:
            self._unvalidated.append(entry)

    @_unexplained
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
        the dispatch runs it (else the plan is timed through entry.call, which compiles it apart).

        Returns whether the plan's results were wrong (here, or in the thread that validated it): a call that
        ran it runs again."""
        with entry.lock:
            before = entry.state
            if entry.state is State.BUILT:
                with jax.ensure_compile_time_eval():  # runs concretely even inside a caller's jit, scan or grad
                    flat = examples(entry.signature) if flat is None else flat
                entry.apply(validate.compare(self._planner, entry, flat, got))
                ran = None if entry.mismatched else ran  # what the call ran does not run any more
                if entry.state is State.VALIDATED and partitioned(flat, entry.plan.graph):
                    verdict = validate.keep_collectives(self._planner, entry, flat)
                    if verdict is not None:
                        entry.apply(verdict)
                        self._dispatch.reset()
            if measure and entry.state is State.VALIDATED:
                entry.apply(self._timed(entry, flat, got, ran))
            if entry.state is not before:
                if entry.call is entry.original and entry.traced:  # before the plan counts as validated: no
                    self._dispatch.reset()  # call finds its trace
                entry.reference = None  # an executable of its own, not kept
                self._plans.unchecked.discard(id(entry))
        return entry.mismatched

    def _timed(
        self, entry: Entry, flat: list[Any] | None, got: list[Any] | None, ran: Callable[[], Any] | None
    ) -> Verdict:
        """The guard's verdict on a validated plan: kept where it is not timed (Limits.guard_seconds 0)."""
        if self.options.limits.guard_seconds <= 0:
            return Verdict((Event.KEPT,))
        with jax.ensure_compile_time_eval():
            flat = examples(entry.signature) if flat is None else flat
        original, optimized = validate.compiled_original(entry), entry.call
        plan_call = ran or (lambda: optimized(*flat))
        warm = ran is not None or got is None  # both ran on flat: the original in the comparison, the plan there
        return validate.timed(self._planner, entry, plan_call, lambda: original(*flat), warm)  # or in the call


_JITTED = type(jax.jit(lambda: None))


def _inlined(call: Callable[..., Any]) -> Callable[..., Any]:
    """What a jax.jit of ours wraps, for the dispatch's trace to hold the program itself: a jax.jit nested in it
    kept a trace and a lowering of its own per signature (a 6-layer MLP at 180 batch sizes: +7 MB)."""
    return call.__wrapped__ if isinstance(call, _JITTED) else call


def _called_eagerly() -> bool:
    """Whether the trace running now is jax.jit's of a call on values (not under an outer transformation)."""
    return isinstance(getattr(jax_core.trace_ctx.trace, "parent_trace", None), jax_core.EvalTrace)


def _plan_weakly(
    optimized: "weakref.ref[Optimized]",
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


def _unplanned(pending: Entry) -> Entry:
    """In a pending entry's place, where its background job failed or stopped: the original, from its program."""
    return Entry(pending.signature, pending.plan, pending.original, pending.out_tree).move(Event.UNPLANNED)


def _takes_job(entry: Entry, tiered: bool) -> bool:
    """Whether a lookup takes the plan the entry's background job builds: a finished one, or any where the
    caller cannot run the original meanwhile."""
    return entry.job is not None and (entry.job.done() or not tiered)


def optimize(
    fun: Callable[..., Any] | None = None,
    *,
    target: str = "cpu",
    rules: Sequence[str | Path] | str | Path | None = None,
    disabled_rules: Sequence[str] = (),
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    params_argnums: int | Sequence[int] = (),
    validate: bool = True,
    limits: Limits | None = None,
    extractor: str = "auto",
    autotune: int = 0,
    memory_budget: int | None = None,
    cache_size: int = 64,
    buckets: Buckets | None = None,
    background: bool | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
    **jit_options: Any,
) -> Any:
    """Optimize a JAX function by equality saturation; use as `optimize(f, ...)` or `@optimize(...)`.

    target: a device profile ("cpu", "a100", "h100", "h200", "tpu-v5e"); the plan runs wherever JAX runs.
    rules: extra rule files (paths) or egglog text; disabled_rules: built-in groups to switch off by name.
    static_argnums, static_argnames, donate_argnums, donate_argnames: as in jax.jit, and so are the other
    jax.jit options (in_shardings, out_shardings, keep_unused, compiler_options, ...), passed through.
    params_argnums: arguments that are weights, fixed across calls; work on them alone (concatenating,
    folding) is then priced as free, and `fast.prepare(params)` does it once.
    validate: compare with the original on the first call of each signature and fall back to it, with a
    warning, on a mismatch. limits: bounds on saturation (eqsat.Limits). extractor: "greedy" (greedy DAG),
    "ilp" (exact, HiGHS) or "auto" (both within a time budget, the cheaper kept). autotune: compile and measure
    this many of the best distinct candidate plans (and the original) on this device and keep the fastest.
    memory_budget: bytes; memory becomes a term of the extraction cost, XLA:CPU's memory-optimized scheduler is
    used, XLA's figure goes into plan.memory; a gradient still over budget runs its loss as rematerialized
    segments, anything else warns.
    cache_size: how many signatures' plans are kept in memory (the least recently used go first; jax.jit's own
    cache of what it compiled stays as jax.jit keeps it).
    buckets: eqsat.Buckets(sizes, argnums, axis): pad that axis of those arguments up to the smallest bucket size
    that holds it and slice the results back, so sizes between buckets share one plan and one executable.
    background: a signature's first call runs jax.jit's program while its plan is built, validated, timed and
    compiled on a planning thread, and the calls switch to the plan when it is ready; False plans in the first
    call (default True; environment EQSAT_BACKGROUND=0 switches it off).
    """
    buckets = checked_option(buckets, Buckets, "buckets", "eqsat.Buckets(sizes=(8, 16, 32), argnums=(1,))")
    settings = checked(
        target=target,
        rules=rules,
        disabled_rules=disabled_rules,
        static_argnums=static_argnums,
        static_argnames=static_argnames,
        params_argnums=params_argnums,
        validate=validate,
        limits=limits,
        extractor=extractor,
        autotune=autotune,
        memory_budget=memory_budget,
        cache_size=cache_size,
        background=background,
        donate_argnums=donate_argnums,
        donate_argnames=donate_argnames,
    )
    if fun is None:
        return functools.partial(optimize, **settings, buckets=buckets, **jit_options)
    if isinstance(fun, staticmethod):
        raise TypeError(f"staticmethod arguments are not supported by eqsat.optimize (nor by jax.jit): {fun!r:.80}")
    if not callable(fun):
        raise TypeError(
            f"Expected a callable value, got {fun!r:.80}: eqsat.optimize expects a callable (a function of JAX arrays)"
        )
    if inspect.isgeneratorfunction(fun):
        raise TypeError(f"Expected a function, got a generator function: {fun!r:.80}")
    optimized = Optimized(fun, resolve(fun, **settings, jit_options=jit_options))
    return optimized if buckets is None else Bucketed(optimized, buckets)


def fit_budget(
    fn: Callable[..., Any],
    args: Sequence[Any],
    budget_bytes: int,
    *,
    loss: Callable[..., Any] | None = None,
    **options: Any,
) -> tuple[Callable[..., Any], BudgetReport]:
    """A jitted function computing fn that fits budget_bytes by XLA's measure where one was found, and the report:
    backends.memory.fit_budget, with the segments of a given loss taken from eqsat's plan of it."""
    if loss is not None and options.get("loss_plan") is None:
        options["loss_plan"] = optimize(loss).plan(*args)
    return memory.fit_budget(fn, args, budget_bytes, loss=loss, **options)
