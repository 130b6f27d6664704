"""The public API: optimize() wraps a function like jax.jit; each input signature gets its own plan.

optimize(f) -> capture -> saturate -> extract -> lower -> validate, once per signature, then cached.
"""

import functools
import inspect
import logging
import operator
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
from jax._src import api_util  # jax.jit's own argnums resolution
from jax.core import ShapedArray
from jax.extend import core as jcore

from eqsat import guard, plan_store, progress, rule_sources
from eqsat.backends import memory
from eqsat.backends.lower import lower, weight_boundary
from eqsat.backends.memory import MEMORY_OPTIMIZED, BudgetReport, MemoryReport, figure_of, memory_report
from eqsat.buckets import Bucketed, Buckets
from eqsat.capture import capture, input_paths
from eqsat.egraph_check import check_egraph
from eqsat.errors import EqsatError, EqsatWarning
from eqsat.extract.cost import Cost, load_profile
from eqsat.extract.plan import Plan, build_plan
from eqsat.extract.timing import priced
from eqsat.ir import Graph, Opaque
from eqsat.measure import median_time
from eqsat.plan_cache import PerThread, shared_plans
from eqsat.sample import example_like
from eqsat.saturate import Limits, StopReason, saturate
from eqsat.sharding import added_collectives, body_tracing, explicit_sharding, partitioned
from eqsat.tolerance import beyond_conditioning, comparable, differs

log = logging.getLogger("eqsat")


_SUBPROGRAM_PARAMS = ("jaxpr", "cond_jaxpr", "body_jaxpr")  # sub-programs of scan, while, remat (cond: branches)


class _Dispatch:
    """jax.jit's fast path over a tracing body; reset() starts a fresh trace cache (after a fallback).

    The body carries fun's signature (functools.wraps), so jax.jit resolves static_argnames and donate_argnames
    against the user's function exactly as it would for jax.jit(fun)."""

    def __init__(self, body: Callable[..., Any], fun: Callable[..., Any], jit_options: dict[str, Any]) -> None:
        # the body (a method of the Optimized) held weakly: no cycle, so that dropping the Optimized frees what
        # the function closes over at once, as dropping a jax.jit object does
        self.body, self.fun, self.jit_options = weakref.WeakMethod(body), fun, jit_options
        self.donates = bool(jit_options.get("donate_argnums") or jit_options.get("donate_argnames"))
        self.reset()

    def reset(self) -> None:
        ref = self.body
        body = functools.wraps(self.fun, updated=())(lambda *args, **kwargs: ref()(*args, **kwargs))
        self.run = jax.jit(body, **self.jit_options)


class _Signature(NamedTuple):
    """What a plan is keyed by, as jax.jit keys its traces: the dynamic leaves' tree and abstract values, and the
    static arguments by position or name, type and value (so 1, True and 1.0 get plans of their own)."""

    n_args: int
    tree: Any  # of (dynamic positional arguments, dynamic keyword arguments)
    avals: tuple[Any, ...]
    statics: tuple[tuple[int | str, type, Any], ...]


@dataclass(eq=False)
class _Entry:
    signature: _Signature
    plan: Plan
    call: Callable[..., list[Any]]  # flat args -> flat results: the optimized program, or the original
    original: Callable[..., list[Any]]  # the original, jitted, as the reference and the fallback
    out_tree: Any
    validated: bool
    params: frozenset[str] = frozenset()  # the graph's weight inputs the plan was extracted for
    # the original compiled for validation in the background while the caller's jax.jit compiles the plan
    reference: Future | None = None
    key: str | None = None  # where the plan is kept across processes (eqsat/plan_store.py)
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while validating: once, by one thread
    mismatched: bool = False  # validation found the plan's results wrong: the original runs


def _per_thread(name: str, doc: str) -> property:
    """An attribute of the Optimized that is this thread's own (kept in its PerThread)."""
    return property(
        lambda self: getattr(self._pending, name), lambda self, value: setattr(self._pending, name, value), doc=doc
    )


class Optimized:
    """The callable optimize() returns: call it like the original (or like jax.jit(original): `.lower`, `.trace`,
    `.clear_cache`, jax.export); `.plan(*args)` shows what runs."""

    def __init__(
        self,
        fun: Callable[..., Any],
        *,
        target: str,
        rules: Sequence[str | Path] | str | Path | None,
        disabled_rules: tuple[str, ...],
        static_argnums: tuple[int, ...],
        params_argnums: tuple[int, ...],
        validate: bool,
        limits: Limits | None,
        extractor: str,
        autotune: int,
        memory_budget: int | None,
        cache_size: int,
        donate_argnums: tuple[int, ...],
        jit_options: dict[str, Any],
    ) -> None:
        self.fun = fun
        self.memory_budget = memory_budget
        self.profile = load_profile(target)
        self.rules = rule_sources.collect(rules, (*disabled_rules, *self.profile.disabled_rules))
        # jax.jit's own resolution: names for numbers and numbers for names, checked against the signature
        donate_argnums, donate_argnames, static_argnums, static_argnames = api_util.resolve_argnums(
            fun,
            api_util.fun_signature(fun),
            donate_argnums,
            jit_options.pop("donate_argnames", None),
            static_argnums,
            jit_options.pop("static_argnames", None),
        )
        self.static_argnums, self.static_argnames = tuple(static_argnums), tuple(static_argnames)
        self.params_argnums = _checked_argnums(fun, tuple(params_argnums), "params_argnums")
        if set(self.params_argnums) & set(self.static_argnums):
            raise ValueError(f"an argument cannot be both static and a parameter: {self.params_argnums}")
        self.validate = validate
        self.limits = limits or Limits()
        self.extractor = extractor
        self.autotune = autotune
        # (signature, prepared) -> entry; signature -> flat function, output tree, graph, e-graph, times
        settings = (target, tuple((r.origin, r.text) for r in self.rules), self.static_argnums, self.static_argnames)
        settings += (self.params_argnums, validate, self.limits, extractor, autotune, memory_budget, cache_size)
        self._plans = shared_plans(fun, settings, cache_size)
        self._cache, self._saturated = self._plans.entries, self._plans.saturated
        # what decides a plan besides the program: part of the key plans are kept by across processes
        self._store_settings = (repr(self.profile), settings[1], self.limits, extractor, autotune, memory_budget)
        self._pending = PerThread()  # what this thread's calls built or ran and have not settled yet
        # a budget asks XLA:CPU for its memory-optimized schedule (an option the other backends do not take)
        if memory_budget is not None and jax.default_backend() == "cpu":
            jit_options["compiler_options"] = {**MEMORY_OPTIMIZED, **(jit_options.get("compiler_options") or {})}
        options = dict(jit_options, static_argnums=self.static_argnums, donate_argnums=tuple(donate_argnums))
        # names only where there are some: jax.jit refuses any, even (), for a function without a signature
        options.update(
            {k: v for k, v in [("static_argnames", static_argnames), ("donate_argnames", donate_argnames)] if v}
        )
        self._dispatch = _Dispatch(self._traced, fun, options)
        # fun's name, doc, __wrapped__ and attributes, as jax.jit copies them, but never over our own state (fun
        # may carry a wrapped Optimized's, as jax.grad(optimize(f)) does)
        functools.update_wrapper(self, fun, updated=())
        vars(self).update({k: v for k, v in getattr(fun, "__dict__", {}).items() if k not in vars(self)})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if jax.config.jax_disable_jit:  # as jax.jit does: the function runs op by op
            return self.fun(*args, **kwargs)
        # a plan not validated yet may run in this call, even one another thread builds while it runs (jax.jit's
        # trace cache is shared): then the call settles its signature's plan
        unsettled, builds = bool(self._plans.unchecked), self._plans.builds
        out = self._dispatch.run(*args, **kwargs)  # the fast path: nothing more once a signature is planned
        raced = unsettled or builds != self._plans.builds
        if raced or self._plans.unchecked or self._unvalidated or self._unbudgeted:
            return self._settle(lambda run: run(*args, **kwargs), args, kwargs, out, results=out, raced=raced)
        return out

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
        self._unvalidated.clear()
        self._unbudgeted.clear()
        self._dispatch.reset()

    def cache_info(self) -> dict[str, int]:
        """How many plans the signature cache holds now, and how many it keeps at most (cache_size)."""
        return {"plans": len(self._cache), "cache_size": self._cache.size}

    def prepare(self, *params: Any) -> Callable[..., Any]:
        """A function of the remaining arguments, the parameters (params_argnums, in order) bound.

        It computes the weight-only part of each plan once, as an inference engine does when it builds.
        """
        if len(params) != len(self.params_argnums):
            raise TypeError(
                f"prepare() takes the {len(self.params_argnums)} parameter argument(s) {self.params_argnums}"
            )
        params_flat = jax.tree_util.tree_leaves(params)
        ready: dict[Any, Callable[[tuple, list[Any]], Any]] = {}

        def prepared(*rest: Any) -> Any:
            leaves, tree = jax.tree_util.tree_flatten(rest)
            key = (tree, tuple(_aval_key(x) for x in leaves))
            if key not in ready:
                ready[key] = self._prepare_signature(params, rest, params_flat)
            return ready[key](rest, leaves)

        return prepared

    def _prepare_signature(self, params: tuple, rest: tuple, params_flat: list[Any]) -> Callable[[tuple, list], Any]:
        """Plan, validate and run the weight-only subgraph once, for one signature of the other arguments.

        Returns call(other arguments, their leaves). An unchanged plan calls the original through jax.jit, exactly
        as the caller would; otherwise the plan runs with the prepared weights, the leaves put in order at trace
        time."""
        args = _merge_params(self.params_argnums, params, rest)
        flat, signature = self._signature(args, {})
        entry = self._entry(signature, prepared=True)
        if entry in self._unvalidated:
            self._unvalidated.remove(entry)
        self._validate(entry, flat, measure=False)  # what runs is the plan with its weights prepared: timed below
        names = self._param_names(signature)
        is_param = [f"x{i}" in names for i in range(len(flat))]

        def ordered(params_flat: list[Any], rest_flat: list[Any]) -> list[Any]:
            p, r = iter(params_flat), iter(rest_flat)
            return [next(p) if param else next(r) for param in is_param]

        original = jax.jit(self.fun, static_argnums=self.static_argnums)

        def unchanged(rest_args: tuple, _leaves: list[Any]) -> Any:
            return original(*_merge_params(self.params_argnums, params, rest_args))

        if entry.call is entry.original:
            return unchanged
        body, weights = _with_weights(entry.plan, flat)
        run = jax.jit(lambda p, r, w: body(*ordered(p, r), *w))
        if self.limits.guard_seconds > 0:
            leaves = [x for x, param in zip(flat, is_param, strict=True) if not param]
            with entry.lock:
                kept = self._timed(entry, lambda: run(params_flat, leaves, weights), lambda: entry.original(*flat))
            if not kept:
                return unchanged
        return lambda _rest, leaves: jax.tree_util.tree_unflatten(entry.out_tree, run(params_flat, leaves, weights))

    def _traced(self, *args: Any, **kwargs: Any) -> Any:
        """The body jax.jit traces: look up (or build) the plan for these abstract values and inline it."""
        flat, signature = self._signature(args, kwargs)
        entry = self._entry(signature)
        if self._dispatch.donates and entry in self._unvalidated:  # the arguments are gone after the call
            self._unvalidated.remove(entry)
            self._validate(entry)
        return jax.tree_util.tree_unflatten(entry.out_tree, entry.call(*flat))

    def _checked(self, stage: Callable[[Any], Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """stage(jax.jit object): a call, trace or lowering, then settled."""
        unsettled, builds = bool(self._plans.unchecked), self._plans.builds
        out = stage(self._dispatch.run)
        return self._settle(stage, args, kwargs, out, raced=unsettled or builds != self._plans.builds)

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
        if self._unbudgeted:
            self._check_budget(args, kwargs)
        pending, self._unvalidated = self._unvalidated, []
        flat, signature = self._signature(args, kwargs)
        own = self._cache.get((signature, False))
        # traced by another thread, this call may have run it before it fell back (not where arguments are
        # donated: then every trace validates its plan before it runs it)
        maybe_ran = raced and own is not None and own.mismatched and not self._dispatch.donates
        if own is not None and own not in pending and (not own.validated or maybe_ran):
            pending.append(own)
        if not pending:
            return out
        concrete = all(isinstance(x, jax.Array | np.ndarray | np.generic | int | float | complex) for x in flat)
        concrete = concrete and not any(isinstance(x, jax.core.Tracer) for x in flat)
        got = jax.tree_util.tree_leaves(results) if results is not None else None
        if got is not None and any(isinstance(x, jax.core.Tracer) for x in got):  # concrete arguments, called
            got = None  # inside a trace (a scan body closing over them): the results are the trace's values
        mine = [concrete and e.signature == signature for e in pending]
        if any(
            [self._validate(e, flat if m else None, got if m else None) for e, m in zip(pending, mine, strict=True)]
        ):
            self._dispatch.reset()
            out = stage(self._dispatch.run)
        return out

    def _check_budget(self, args: tuple, kwargs: dict[str, Any]) -> None:
        """XLA's own figure for the program just compiled, recorded in its plan; a warning if over budget."""
        entries, self._unbudgeted = self._unbudgeted, []
        figure = figure_of(self._dispatch.run.lower(*args, **kwargs).compile())
        for entry in entries:
            entry.plan.memory = memory_report(entry.plan)
            entry.plan.memory.xla = figure
            if self.memory_budget is not None and "compiler_options" in self._dispatch.jit_options:
                entry.plan.memory.applied.append("XLA:CPU memory-optimized scheduler")
            if self._dispatch.donates:
                entry.plan.memory.applied.append(f"donated arguments {self._dispatch.jit_options['donate_argnums']}")
            if self.memory_budget is not None and figure["total"] > self.memory_budget:
                if not kwargs and self._rematerialize(entry, args):
                    continue
                warnings.warn(
                    f"eqsat: {getattr(self.fun, '__name__', 'the function')} needs {figure['total']} bytes by "
                    f"XLA's measure, over the budget of {self.memory_budget}; for a training step, "
                    "eqsat.fit_budget(grad_fn, args, budget, loss=loss) rematerializes segments of the loss",
                    EqsatWarning,
                    stacklevel=4,
                )

    def _rematerialize(self, entry: _Entry, call_args: tuple) -> bool:
        """For a gradient of a loss (jax.grad keeps the loss as __wrapped__): run the loss as rematerialized segments
        (backends.memory.fit_budget) and use that program if it fits and matches."""
        loss = getattr(self.fun, "__wrapped__", None)
        if loss is None or self.static_argnums:
            return False
        fitted, report = fit_budget(self.fun, call_args, self.memory_budget, loss=loss)  # eqsat.api.fit_budget
        if not report.fits:
            return False
        tree = jax.tree_util.tree_structure(list(call_args))
        entry.call = lambda *flat: jax.tree_util.tree_leaves(fitted(*jax.tree_util.tree_unflatten(tree, flat)))
        entry.plan.memory.xla = report.achieved
        entry.plan.memory.applied.append(report.mechanism)
        self._dispatch.reset()
        return True

    def plan(self, *args: Any, prepared: bool | None = None, **kwargs: Any) -> Plan:
        """The plan for arguments of these shapes and dtypes (built if needed).

        With parameters declared it is the plan `prepare` runs, unless prepared=False: then the plan a direct
        call runs, which prices weight-only work as the per-call work it is."""
        _, signature = self._signature(args, kwargs)
        return self._entry(signature, bool(self.params_argnums) if prepared is None else prepared).plan

    def memory(self, *args: Any, **kwargs: Any) -> MemoryReport:
        """Memory of the plan for these arguments: liveness, best-fit arena, lower bound, a memory-aware order
        (our model) and XLA's own figure of the compiled program; also kept in the plan's summary."""
        flat, signature = self._signature(args, kwargs)
        entry = self._entry(signature)
        entry.plan.memory = memory_report(entry.plan, entry.call, flat)
        return entry.plan.memory

    def _signature(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], _Signature]:
        """The dynamic leaves and the signature they and the static arguments make; static_argnums beyond the
        arguments passed are ignored, as jax.jit ignores them."""
        n = len(args)
        static = {i % n for i in self.static_argnums if -n <= i < n}
        statics = tuple((i, type(args[i]), args[i]) for i in sorted(static))
        statics += tuple((k, type(v), v) for k, v in sorted(kwargs.items()) if k in self.static_argnames)
        dynamic = (
            [a for i, a in enumerate(args) if i not in static],
            {k: v for k, v in kwargs.items() if k not in self.static_argnames},
        )
        flat, tree = jax.tree_util.tree_flatten(dynamic)
        return flat, _Signature(n, tree, tuple(_abstract(x) for x in flat), statics)

    _unvalidated = _per_thread("unvalidated", "The plans this thread's calls built or ran and have not validated yet.")
    _unbudgeted = _per_thread("unbudgeted", "The plans this thread built since its last budget check.")

    def _entry(self, signature: _Signature, prepared: bool = False) -> _Entry:
        """The entry of this signature and mode, built by one thread while the others that need it wait."""
        key = (signature, prepared)
        entry = self._cache.get(key)
        if entry is None:
            with self._plans.building(signature):
                entry = self._cache.get(key)
                if entry is None:
                    entry = self._build(signature, prepared)
                    if not entry.validated:
                        self._plans.unchecked.add(id(entry))
                        self._plans.builds += 1
                    self._cache[key] = entry
                    if self.memory_budget is not None:
                        self._unbudgeted.append(entry)
        if not entry.validated and entry not in self._unvalidated:  # this thread's call settles it, or another's
            self._unvalidated.append(entry)
        return entry

    def _build(self, signature: _Signature, prepared: bool) -> _Entry:
        """Capture and saturate once per signature; extract and lower once per signature and mode.

        Capture traces the function on abstract values (never the caller's tracers), so a plan can be built under
        any transformation. An error in the user's function reaches the caller as it is; a failure of eqsat's own
        machinery after that warns and runs the original."""
        name = getattr(self.fun, "__name__", repr(self.fun))
        t0 = time.perf_counter()
        if signature in self._saturated:
            flat_fun, out_tree, *_, closed = self._saturated[signature]
        else:
            flat_fun, out_tree_of = _flat_function(self.fun, signature)
            progress.begin("capture", f"capture {name}")
            try:
                closed = jax.make_jaxpr(flat_fun)(*signature.avals)
            except Exception as error:
                error.add_note(f"(raised while eqsat.optimize traced {name})")
                raise
            out_tree = out_tree_of()
            if any(isinstance(c, jax.core.Tracer) for c in closed.consts):  # the plan could not hold them
                why = f"{name} closes over values traced by an outer transformation"
                return self._original_entry(signature, flat_fun, out_tree, why)
        try:
            params = self._param_names(signature) if prepared else frozenset()
            key = self._store_key(closed, ("program", sorted(params)))
            stored = plan_store.load(key, self.profile) if key else None
            if stored is not None:
                graph = capture(closed)
                graph.input_paths, graph.params = self._input_names(signature), self._param_names(signature)
                self._optimize_bodies(graph)
                stored.graph = graph
                stored.stats.update(stored=1.0, load_s=time.perf_counter() - t0)
                return self._entry_of(signature, stored, flat_fun, out_tree, closed, params, key)
            if signature not in self._saturated:
                graph = capture(closed)
                graph.input_paths, graph.params = self._input_names(signature), self._param_names(signature)
                self._optimize_bodies(graph)
                t1 = time.perf_counter()
                progress.begin("saturate", f"saturate {len(graph.nodes)} nodes", total=self.limits.iterations)
                snapshot = saturate(graph, self.rules, self.limits)
                saturate_s = time.perf_counter() - t1
                self._saturated[signature] = (flat_fun, out_tree, graph, snapshot, t1 - t0, saturate_s, closed)
            return self._plan_entry(signature, params, key, *self._saturated[signature])
        except EqsatError:  # a bad rule or a shape conflict: the user's to fix
            raise
        except Exception as error:  # eqsat's own failure: the original runs
            why = _failure(name, error)
            warnings.warn(f"{why}; running the original instead", EqsatWarning, stacklevel=5)
            return self._original_entry(signature, jax.jit(flat_fun), out_tree, why)

    def _store_key(self, closed: jcore.ClosedJaxpr, what: tuple) -> str | None:
        """The key of this program's plan among those kept across processes; None where none are kept."""
        return plan_store.program_key(closed, (*self._store_settings, *what)) if plan_store.enabled() else None

    def _plan_entry(
        self,
        signature: _Signature,
        params: frozenset[str],
        key: str | None,
        flat_fun: Callable[..., list[Any]],
        out_tree: Any,
        graph: Graph,
        snapshot: Any,
        capture_s: float,
        saturate_s: float,
        closed: jcore.ClosedJaxpr,
    ) -> _Entry:
        t2 = time.perf_counter()
        progress.begin("extract", f"extract ({self.extractor}{', weights prepared' if params else ''})")
        plan = self._extract(graph, snapshot, params)
        extract_s = time.perf_counter() - t2 - plan.stats.get("measure_s", 0.0)  # measuring is reported apart
        plan.stats.update(capture_s=capture_s, saturate_s=saturate_s, extract_s=extract_s)
        log.info("eqsat: %s\n%s", getattr(self.fun, "__name__", "function"), plan.summary())
        original = jax.jit(flat_fun)
        if self.autotune and not self._nothing_to_gain(plan):
            with jax.ensure_compile_time_eval():  # measured on examples, even while a caller's trace is active
                examples = _examples(signature)
                plan = self._autotune(plan, graph, snapshot, params, examples, original)
        if key:
            plan_store.save(key, plan, self.profile, snapshot)
        return self._entry_of(signature, plan, flat_fun, out_tree, closed, params, key, original)

    def _entry_of(
        self,
        signature: _Signature,
        plan: Plan,
        flat_fun: Callable[..., list[Any]],
        out_tree: Any,
        closed: jcore.ClosedJaxpr,
        params: frozenset[str],
        key: str | None,
        original: Callable[..., list[Any]] | None = None,
    ) -> _Entry:
        """The entry that runs a plan (extracted now or kept from another process), validated on first use."""
        original = original or jax.jit(flat_fun)
        if self._nothing_to_gain(plan) or plan.fallback:  # run the original program exactly as jax.jit would
            return _Entry(signature, plan, original, original, out_tree, validated=True, key=key)
        optimized = jax.jit(_with_original_derivatives(lower(plan), flat_fun))
        # a kept plan that validation accepted in an earlier process is trusted as it is within one
        validated = not self.validate or bool(plan.stats.get("stored_validated"))
        reference = None if validated else _COMPILER.submit(_compiled_reference, closed)
        return _Entry(signature, plan, optimized, original, out_tree, validated, params, reference, key)

    def _original_entry(self, signature: _Signature, call: Callable[..., Any], out_tree: Any, why: str) -> _Entry:
        """An entry that runs the original, with a plan of no nodes that says why."""
        log.info("eqsat: %s; the original runs", why)
        plan = Plan(self.profile.name, [], [], [], Cost(), Cost(), StopReason.NOT_PLANNED, fallback=why)
        return _Entry(signature, plan, call, call, out_tree, validated=True)

    def _nothing_to_gain(self, plan: Plan) -> bool:
        """The original program, node for node, or one that differs only in what XLA does itself or nearly as
        well: duplicates shared, weight-only work hoisted, for a predicted gain below the profile's min_gain. The
        original's own weight-only work (x @ W.T's transpose) counts as a gain when prepared: XLA:CPU runs a
        matrix-vector product with a transposed weight several times slower than with the weight transposed once."""
        if plan.unchanged and not any(node.weight for node in plan.nodes):
            return True
        rewritten = plan.rewritten_ops() or plan.stats.get("bodies_rewritten")
        return not rewritten and plan.predicted.seconds > plan.original.seconds * (1 - self.profile.min_gain)

    def _extract(
        self, graph: Graph, snapshot: Any, params: frozenset[str], forbid: frozenset[str] = frozenset()
    ) -> Plan:
        """build_plan with this optimizer's target, extractor and budgets (a memory budget makes memory a cost)."""
        memory_weight = 1.0 if self.memory_budget is not None else 0.0
        profile, timing = priced(self.profile, snapshot, self.limits.measure_seconds)
        plan = build_plan(
            graph, snapshot, profile, params, self.extractor, self.limits.extract_seconds, forbid, memory_weight
        )
        plan.stats.update(timing)
        return plan

    def _autotune(
        self, best: Plan, graph: Graph, snapshot: Any, params: frozenset[str], flat: list[Any], original: Any
    ) -> Plan:
        """Measure the `autotune` best distinct candidates (by predicted time) and the original; keep the fastest.

        Candidates: the plan, and plans extracted with each kind of rewritten op forbidden, and with all of them."""
        rewritten = frozenset(best.rewritten_ops())
        bans = [frozenset({op}) for op in sorted(rewritten)] + ([rewritten] if len(rewritten) > 1 else [])
        candidates = {_shape_of(best): ("extracted plan", best)}
        for ban in bans:
            plan = self._extract(graph, snapshot, params, forbid=ban)
            candidates.setdefault(_shape_of(plan), (f"without new {'/'.join(sorted(ban))}", plan))
        ranked = sorted(candidates.values(), key=lambda c: c[1].predicted.seconds)[: self.autotune]
        concrete = flat
        rows = [("original (jax.jit)", None, best.original.seconds, median_time(original, concrete, 0.3))]
        for label, plan in ranked:
            body, weights = _with_weights(plan, concrete)
            rows.append((label, plan, plan.predicted.seconds, median_time(jax.jit(body), (*concrete, *weights), 0.3)))
        label, chosen, _, _ = min(rows, key=lambda r: r[3])
        chosen = chosen or best
        chosen.autotune = [
            {"label": lab, "predicted_s": pred, "measured_s": meas, "chosen": lab == label}
            for lab, _, pred, meas in rows
        ]
        if label.startswith("original"):
            chosen.fallback = "auto-tuning measured the original program fastest"
        return chosen

    def _optimize_bodies(self, graph: Graph) -> None:
        """Optimize the bodies of scan, while, cond, remat and shard_map calls as programs of their own, in place."""
        for k, call in enumerate(graph.opaque):
            changed = {}
            for name, value in call.params.items():
                if name in _SUBPROGRAM_PARAMS and isinstance(value, jcore.Jaxpr | jcore.ClosedJaxpr):
                    changed[name] = self._optimize_body(value, call)
                elif name == "branches" and isinstance(value, tuple):
                    branches = tuple(self._optimize_body(b, call) for b in value)
                    # a new tuple of the same branches is no change (it made every cond look rewritten)
                    changed[name] = value if all(map(operator.is_, branches, value)) else branches
            changed = {name: v for name, v in changed.items() if v is not call.params[name]}
            if changed:
                graph.opaque[k] = Opaque(call.primitive, {**call.params, **changed}, call.multiple_results)
                graph.bodies_rewritten += 1

    def _optimize_body(self, body: Any, call: Opaque) -> Any:
        """The body re-planned, or the body itself when nothing changed or the result would not fit in its place.

        It is traced as its call traces it: a shard_map body within the mesh's manual axes (its collectives and
        pvary name them), on its own input types (a value varying over an axis stays varying)."""
        with body_tracing(call):
            graph = capture(body)
            self._optimize_bodies(graph)
            key = self._store_key(body, ("body",)) if isinstance(body, jcore.ClosedJaxpr) else None
            plan = plan_store.load(key, self.profile) if key else None
            if plan is None:
                snapshot = saturate(graph, self.rules, self.limits)
                plan = self._extract(graph, snapshot, frozenset())
                if key:
                    plan_store.save(key, plan, self.profile, snapshot)
            plan.graph = graph
            if self._nothing_to_gain(plan):
                return body
            inner = body.jaxpr
            new = jax.make_jaxpr(lower(plan))(*[v.aval for v in inner.invars])
        same_type = [_type(v) for v in new.jaxpr.outvars] == [_type(v) for v in inner.outvars]
        if not same_type or new.consts or inner.constvars:
            return body
        return new if isinstance(body, jcore.ClosedJaxpr) else new.jaxpr

    def _input_names(self, signature: _Signature) -> dict[str, str]:
        """The graph's Var name of each flat leaf -> its pytree path in the call (params.layers[0].wq)."""
        paths = input_paths(self.fun, signature.tree, _dynamic_positions(signature))
        return {f"x{j}": path for j, path in enumerate(paths)}

    def _param_names(self, signature: _Signature) -> frozenset[str]:
        """The graph's Var names of the flat leaves that belong to parameter arguments."""
        indexed, _ = jax.tree_util.tree_unflatten(signature.tree, range(len(signature.avals)))
        positions = _dynamic_positions(signature)
        params = {i % signature.n_args for i in self.params_argnums} if signature.n_args else set()
        leaves = (jax.tree_util.tree_leaves(sub) for pos, sub in zip(positions, indexed, strict=True) if pos in params)
        return frozenset(f"x{j}" for sub in leaves for j in sub)

    def _validate(
        self, entry: _Entry, flat: list[Any] | None = None, got: list[Any] | None = None, measure: bool = True
    ) -> bool:
        """Compare with the original on these arguments (without them: examples of the signature's shapes, as
        while tracing or before donation); fall back on mismatch. `got`: the optimized results for `flat`, where
        the caller has them already. Then (`measure`) time the plan against the original and keep the original
        where the plan is not faster (Limits.guard_seconds).

        Returns whether the plan's results were wrong (here, or in the thread that validated it): a call that
        ran it runs again."""
        with entry.lock:
            if not entry.validated:
                with jax.ensure_compile_time_eval():  # runs concretely even inside a caller's jit, scan or grad
                    flat = _examples(entry.signature) if flat is None else flat
                self._compare(entry, flat, got)
                if not entry.mismatched and partitioned(flat, entry.plan.graph):
                    self._keep_collectives(entry, flat)
                if measure and self.limits.guard_seconds > 0 and entry.call is not entry.original:
                    original, optimized = entry.original, entry.call
                    if not self._timed(entry, lambda: optimized(*flat), lambda: original(*flat)):
                        entry.call = entry.original
                if entry.call is entry.original:  # before the plan counts as validated: no call finds its trace
                    self._dispatch.reset()
                entry.validated = True
                self._plans.unchecked.discard(id(entry))
        return entry.mismatched

    def _keep_collectives(self, entry: _Entry, flat: list[Any]) -> None:
        """Where the plan, compiled for these arguments' shardings, has a collective more than jax.jit's program
        (a merge along a sharded axis), it is extracted again without new concatenations (no merge is made, the
        other rewrites stay); if that one adds collectives too, the original runs: sharded programs keep their
        communication."""
        with jax.ensure_compile_time_eval():
            added = added_collectives(entry.call, entry.original, flat)
            saturated = self._saturated.get(entry.signature)
            if added and saturated is not None and "Concat" in entry.plan.rewritten_ops():
                _, _, graph, snapshot, *_ = saturated
                unmerged = self._extract(graph, snapshot, entry.params, forbid=frozenset({"Concat"}))
                if not self._nothing_to_gain(unmerged):
                    call = jax.jit(_with_original_derivatives(lower(unmerged), entry.original))
                    if not added_collectives(call, entry.original, flat):
                        unmerged.stats.update({k: v for k, v in entry.plan.stats.items() if k not in unmerged.stats})
                        unmerged.extraction["refused"] = _collectives_text(added) + " (merges not made)"
                        entry.plan, entry.call = unmerged, call
                        self._dispatch.reset()
                        return
        if added:
            entry.call = entry.original
            more = _collectives_text(added)
            entry.plan.fallback = f"the plan adds collectives that jax.jit's program lacks ({more}): the original runs"
            log.info("eqsat: %s: %s", getattr(self.fun, "__name__", "function"), entry.plan.fallback)

    def _timed(self, entry: _Entry, optimized: Callable[[], Any], original: Callable[[], Any]) -> bool:
        """Whether the plan is kept after timing it against the original within Limits.guard_seconds (once per
        plan; the plan records what was measured, and where it is not kept, why the original runs)."""
        if entry.plan.measured is None:
            progress.begin("measure", "measure the plan against the original")
            with jax.ensure_compile_time_eval():
                entry.plan.measured = guard.measure(original, optimized, self.limits.guard_seconds)
            if not entry.plan.measured["kept"]:
                entry.plan.fallback = guard.describe(entry.plan.measured)
                log.info("eqsat: %s: %s", getattr(self.fun, "__name__", "function"), entry.plan.fallback)
        return entry.plan.measured["kept"]

    def _compare(self, entry: _Entry, flat: list[Any], got: list[Any] | None) -> None:
        """_validate's work: compare, and on a mismatch find the rules involved and fall back."""
        progress.begin("validate", "validate: compile and compare with the original")
        with jax.ensure_compile_time_eval():  # runs concretely even inside a caller's jit, scan or grad
            expected = comparable(_reference_results(entry, flat))
            entry.reference = None  # an executable of its own: not kept once compared
            got = comparable(entry.call(*flat) if got is None else got)
        wrong = next(((k, p) for k, p in enumerate(map(differs, range(len(got)), expected, got)) if p), None)
        if wrong is not None:
            with jax.ensure_compile_time_eval():
                wrong = beyond_conditioning(entry.original, flat, expected, got)
        if wrong is None:
            if entry.key:
                plan_store.mark_validated(entry.key)
            return
        k, problem = wrong
        progress.begin("validate", "validate: finding the rules the mismatch depends on")
        with jax.ensure_compile_time_eval():
            entry.plan.blamed, exact = self._blame(entry, flat, k, expected[k])
        where = rule_sources.rule_locations(self.rules)
        suspects = ", ".join(f"{name} ({where[name]})" if name in where else name for name in entry.plan.blamed)
        suspects = (suspects or "none found") + ("" if exact else " (narrowing stopped by its time budget)")
        entry.plan.fallback = f"optimized result differed from the original ({problem}); rules involved: {suspects}"
        if entry.key:  # a later process runs the original at once
            plan_store.save(entry.key, entry.plan, self.profile, None)
        warnings.warn(
            f"eqsat: the optimized {getattr(self.fun, '__name__', 'function')} differed from the original "
            f"({problem}); running the original instead. Rules involved: {suspects}.",
            EqsatWarning,
            stacklevel=4,
        )
        entry.call, entry.mismatched = entry.original, True

    def _blame(self, entry: _Entry, flat: list[Any], k: int, want: Any) -> tuple[list[str], bool]:
        """The fired rules result k's mismatch depends on, and whether the search finished within its budget
        (Limits.blame_seconds; else a superset).

        First a 1-minimal set of rules that reproduces the mismatch, re-planning from the original graph with
        subsets of the fired rules: each rule alone, the user's first (one unsound rule is the usual case), then
        each rule dropped in turn where the mismatch stays without it. Some rules in that set may only make the
        wrong plan pay (a re-association that makes dropping an op worthwhile): of them, those whose e-graph,
        saturated with the rule alone, has an e-node disagreeing with its e-class on these arguments are the
        ones named, where there are any."""
        graph, fired = entry.plan.graph, list(entry.plan.rules_fired)
        deadline = time.perf_counter() + self.limits.blame_seconds
        builtin = set(rule_sources.builtin_groups())
        order = {name: src.name in builtin for src in self.rules for name in rule_sources.rule_names(src)}
        fired.sort(key=lambda name: (order.get(name, True), name))

        def saturated(names: list[str]) -> Any:
            keep = set(names)
            return saturate(graph, rule_sources.keeping(self.rules, lambda rule: bool(keep & set(rule))), self.limits)

        def reproduces(names: list[str]) -> bool:
            try:
                plan = self._extract(graph, saturated(names), entry.params)
                have = comparable(jax.jit(lower(plan))(*flat))[k]
                return not self._nothing_to_gain(plan) and differs(k, want, have) is not None
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
    """
    settings = dict(
        target=target,
        rules=_checked_rules(rules),
        disabled_rules=_names(disabled_rules, "disabled_rules", "rule group names such as ('algebra', 'fold')"),
        static_argnums=static_argnums,
        static_argnames=static_argnames,
        params_argnums=_as_tuple(params_argnums, "params_argnums"),
        validate=validate,
        limits=_checked_option(limits, Limits, "limits", "eqsat.Limits(iterations=..., nodes=..., seconds=...)"),
        extractor=extractor,
        autotune=autotune,
        memory_budget=memory_budget,
        cache_size=cache_size,
        buckets=_checked_option(buckets, Buckets, "buckets", "eqsat.Buckets(sizes=(8, 16, 32), argnums=(1,))"),
        donate_argnums=donate_argnums,
        donate_argnames=donate_argnames,
        **jit_options,
    )
    if extractor not in ("greedy", "ilp", "auto"):
        raise ValueError(f"extractor must be 'greedy', 'ilp' or 'auto', got {extractor!r}")
    if not isinstance(autotune, int) or isinstance(autotune, bool) or autotune < 0:
        raise ValueError(f"autotune takes a number of candidate plans to measure (an int >= 0), got {autotune!r}")
    if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 1:
        raise ValueError(f"cache_size takes how many signatures' plans to keep (an int >= 1), got {cache_size!r}")
    if fun is None:
        return functools.partial(optimize, **settings)
    if isinstance(fun, staticmethod):
        raise TypeError(f"staticmethod arguments are not supported by eqsat.optimize (nor by jax.jit): {fun!r:.80}")
    if not callable(fun):
        raise TypeError(
            f"Expected a callable value, got {fun!r:.80}: eqsat.optimize expects a callable (a function of JAX arrays)"
        )
    if inspect.isgeneratorfunction(fun):
        raise TypeError(f"Expected a function, got a generator function: {fun!r:.80}")
    jit = {k: settings.pop(k) for k in ("static_argnames", "donate_argnames", *jit_options)}
    buckets = settings.pop("buckets")
    optimized = Optimized(fun, **settings, jit_options=jit)
    return optimized if buckets is None else Bucketed(optimized, buckets)


def _checked_rules(rules: Any) -> Any:
    """rules= as given, once it is of a kind collect() reads: a path, egglog text, or a sequence of them."""
    items = [rules] if isinstance(rules, str | Path) else rules
    if rules is not None and not (isinstance(items, Sequence) and all(isinstance(r, str | Path) for r in items)):
        raise TypeError(
            f"rules takes rule file paths or egglog text (a str, a Path, or a list of them), got {rules!r:.80}"
        )
    if any(isinstance(r, str) and not r.strip() for r in items or ()):
        raise ValueError(
            "rules has an empty string; it takes rule file paths or egglog text such as '(rewrite (Add a b) (Add b a))'"
        )
    return rules


def _names(value: Any, option: str, expected: str) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{option} takes a sequence of {expected}, got {value!r:.80}")
    return tuple(value)


def _checked_option(value: Any, kind: type, option: str, expected: str) -> Any:
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{option} takes {expected}, got {type(value).__name__}: {value!r:.80}")
    return value


def _checked_argnums(fun: Callable[..., Any], argnums: tuple[int, ...], option: str) -> tuple[int, ...]:
    """Argument numbers checked against fun's positional parameters, as jax.jit checks static_argnums."""
    signature = api_util.fun_signature(fun)
    if signature is None or any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
        return argnums
    n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in signature.parameters.values())
    bad = [i for i in argnums if not -n <= i < n]
    if bad:
        raise ValueError(f"{option}={argnums} names argument(s) {bad}, but the function takes {n} positional")
    return argnums


def _with_weights(plan: Plan, flat: list[Any]) -> tuple[Callable[..., list[Any]], list[Any]]:
    """The plan as fn(*flat, *weights) and its weight-only values computed once on these arguments (none when no
    parameters were declared: then no node is weight-only)."""
    boundary = weight_boundary(plan)
    weights = jax.jit(lower(plan, outputs=boundary))(*flat) if boundary else []
    return lower(plan, given=boundary), weights


def _shape_of(plan: Plan) -> tuple:
    """What tells two candidate plans apart: their nodes, without costs."""
    return tuple((n.op, n.inputs, n.attrs) for n in plan.nodes)


def _type(var: Any) -> Any:
    """The type without its weak type (shape, dtype, the mesh axes a value varies over): what a loop, branch or
    shard_map body must keep."""
    return var.aval.strip_weak_type() if hasattr(var.aval, "strip_weak_type") else var.aval


def _as_tuple(argnums: int | Sequence[int], option: str = "argnums") -> tuple[int, ...]:
    argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not all(isinstance(i, int) for i in argnums):
        raise TypeError(f"{option} takes an int or a sequence of ints, got {argnums!r:.80}")
    return argnums


def _aval_key(x: Any) -> tuple:
    """Shape and dtype of an argument leaf, cheaply for arrays (this runs on every prepared call)."""
    if isinstance(x, jax.Array | np.ndarray):
        return x.shape, x.dtype
    return np.shape(x), jax.numpy.result_type(x)


def _merge_params(positions: tuple[int, ...], params: tuple, rest: tuple) -> tuple:
    """The full argument tuple with the parameters at their positions and the rest in order around them."""
    n = len(params) + len(rest)
    given = {p % n: v for p, v in zip(positions, params, strict=True)}
    others = iter(rest)
    return tuple(given[i] if i in given else next(others) for i in range(n))


def _dynamic_positions(signature: _Signature) -> list[int]:
    """The call's positions of the positional arguments in the signature's tree (static ones are not)."""
    static = {k for k, _, _ in signature.statics if isinstance(k, int)}
    return [i for i in range(signature.n_args) if i not in static]


def _flat_function(
    fun: Callable[..., Any], signature: _Signature
) -> tuple[Callable[..., list[Any]], Callable[[], Any]]:
    """fun as a function of the flat dynamic leaves, and its output tree. Only the static values are closed over
    (never an argument, which would keep it alive and, under a trace, leak it)."""
    static = {k: v for k, _, v in signature.statics}
    out_tree: dict[str, Any] = {}
    try:  # the plans, shared and weakly keyed by fun, must not keep it alive
        ref = weakref.ref(fun)
    except TypeError:
        ref = lambda: fun  # noqa: E731

    def flat_fun(*leaves: Any) -> list[Any]:
        args, kwargs = jax.tree_util.tree_unflatten(signature.tree, leaves)
        dynamic = iter(args)
        full = [static[i] if i in static else next(dynamic) for i in range(signature.n_args)]
        named = {k: v for k, v in static.items() if isinstance(k, str)}
        results, out_tree["tree"] = jax.tree_util.tree_flatten(ref()(*full, **kwargs, **named))
        return results

    return flat_fun, lambda: out_tree["tree"]


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


def _with_original_derivatives(
    optimized: Callable[..., list[Any]], original: Callable[..., list[Any]]
) -> Callable[..., list[Any]]:
    """The optimized forward pass, differentiated as the original is (custom_jvp keeps grad and vmap exact)."""
    wrapped = jax.custom_jvp(optimized)
    wrapped.defjvp(lambda primals, tangents: jax.jvp(original, primals, tangents))
    return wrapped


# one thread compiles the originals that validation compares with, beside the caller's compile of the plan: XLA
# releases the GIL while it compiles, so on two cores the two compiles overlap
_COMPILER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eqsat-reference")


def _compiled_reference(closed: jcore.ClosedJaxpr) -> Any:
    """The captured program compiled on its own: from the jaxpr, so no user code runs on this thread."""
    avals = [v.aval for v in closed.jaxpr.invars]
    return jax.jit(jcore.jaxpr_as_fun(closed)).lower(*avals).compile()


def _reference_results(entry: _Entry, flat: list[Any]) -> list[Any]:
    """The original's results for flat: from the executable compiled in the background where it is ready to take
    these arguments, else from the original through jax.jit."""
    if entry.reference is not None:
        try:
            return list(entry.reference.result()(*flat))
        except Exception:  # it did not compile, or takes other arguments (a weak type, a committed device)
            log.debug("eqsat: the background reference did not run; compiling the original", exc_info=True)
    return entry.original(*flat)


def _abstract(x: Any) -> Any:
    """The abstract value jax.jit keys a leaf by (shape, dtype, weak type; a token's own type; the sharding over a
    mesh of explicit axes, which is part of the type there), without the varying-axes annotations a trace adds."""
    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    if not hasattr(aval, "shape") or not hasattr(aval, "dtype"):
        return aval
    weak_type = bool(getattr(aval, "weak_type", False))
    sharding = explicit_sharding(aval)
    if sharding is not None:
        return ShapedArray(tuple(aval.shape), aval.dtype, weak_type=weak_type, sharding=sharding)
    return ShapedArray(tuple(aval.shape), aval.dtype, weak_type=weak_type)


def _examples(signature: _Signature) -> list[Any]:
    """Examples of the signature's leaves, placed as their type says where it names an explicit sharding."""
    examples = [example_like(aval, i) for i, aval in enumerate(signature.avals)]
    return [
        x if explicit_sharding(aval) is None else jax.device_put(x, explicit_sharding(aval).spec)
        for x, aval in zip(examples, signature.avals, strict=True)
    ]


def _collectives_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def _failure(name: str, error: Exception) -> str:
    return f"eqsat could not plan {name} ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
