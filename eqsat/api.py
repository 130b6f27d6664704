"""The public API: optimize() wraps a function like jax.jit; each input signature gets its own plan.

optimize(f) -> capture -> saturate -> extract -> lower -> validate, once per signature, then cached.
"""

import functools
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from backends.lower import lower, weight_boundary
from backends.memory import MEMORY_OPTIMIZED, MemoryReport, figure_of, fit_budget, memory_report
from eqsat import progress
from eqsat import rules as rule_sources
from eqsat.capture import capture
from eqsat.egraph_check import check_egraph
from eqsat.errors import CaptureError
from eqsat.ir import Graph, Opaque
from eqsat.measure import median_time
from eqsat.saturate import Limits, saturate
from extract.cost import load_profile
from extract.plan import Plan, build_plan
from extract.timing import priced

log = logging.getLogger("eqsat")


_SUBPROGRAM_PARAMS = ("jaxpr", "cond_jaxpr", "body_jaxpr")  # sub-programs of scan, while, remat (cond: branches)


class EqsatWarning(UserWarning):
    """The optimized program disagreed with the original, or could not be built; the original runs."""


# relative tolerance per dtype kind: float32 re-association changes rounding by about this much
_RTOL = {"float64": 1e-7, "float32": 2e-3, "float16": 5e-2, "bfloat16": 5e-2}
# the share of a result's largest magnitude added to each element's own (see _differs): 1e-5 of the scale for
# float32, about 10x what re-associating sums of 4,096 to 16,384 terms measured, 200x below the old bound
_SCALE_SHARE = 5e-3


class _Dispatch:
    """jax.jit's fast path over a tracing body; reset() starts a fresh trace cache (after a fallback)."""

    def __init__(
        self,
        body: Callable[..., Any],
        static_argnums: tuple[int, ...] = (),
        donate_argnums: tuple[int, ...] = (),
        compiler_options: dict[str, Any] | None = None,
    ) -> None:
        self.body, self.static_argnums, self.donate_argnums = body, static_argnums, donate_argnums
        self.compiler_options = compiler_options
        self.reset()

    def reset(self) -> None:
        self.run = jax.jit(
            lambda *args: self.body(*args),
            static_argnums=self.static_argnums,
            donate_argnums=self.donate_argnums,
            compiler_options=self.compiler_options,
        )


@dataclass
class _Entry:
    plan: Plan
    call: Callable[..., list[Any]]  # flat args -> flat results: the optimized program, or the original
    original: Callable[..., list[Any]]  # the original, jitted, as the reference and the fallback
    out_tree: Any
    validated: bool
    params: frozenset[str] = frozenset()  # the graph's weight inputs the plan was extracted for


class Optimized:
    """The callable optimize() returns: call it like the original; `.plan(*args)` shows what runs."""

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
        donate_argnums: tuple[int, ...],
    ) -> None:
        self.fun = fun
        self.memory_budget = memory_budget
        self.profile = load_profile(target)
        self.rules = rule_sources.collect(rules, (*disabled_rules, *self.profile.disabled_rules))
        self.static_argnums = tuple(static_argnums)
        self.params_argnums = tuple(params_argnums)
        if set(self.params_argnums) & set(self.static_argnums):
            raise ValueError(f"an argument cannot be both static and a parameter: {self.params_argnums}")
        self.validate = validate
        self.limits = limits or Limits()
        if extractor not in ("greedy", "ilp", "auto"):
            raise ValueError(f"extractor must be 'greedy', 'ilp' or 'auto', got {extractor!r}")
        self.extractor = extractor
        self.autotune = autotune
        self._cache: dict[Any, _Entry] = {}
        self._unvalidated: list[_Entry] = []  # plans built since the last validation
        self._saturated: dict[Any, tuple] = {}  # signature -> flat function, output tree, graph, e-graph, times
        # a budget asks XLA:CPU for its memory-optimized schedule (an option the other backends do not take)
        options = MEMORY_OPTIMIZED if memory_budget is not None and jax.default_backend() == "cpu" else None
        self._dispatch = _Dispatch(self._traced, self.static_argnums, tuple(donate_argnums), options)
        self._unbudgeted: list[_Entry] = []  # plans built since the last budget check
        functools.update_wrapper(self, fun)

    def __call__(self, *args: Any) -> Any:
        return self._checked(self._dispatch, args, args)

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
        flat, key = self._flatten(args)
        entry = self._entry(args, flat, key, prepared=True)
        if entry in self._unvalidated:
            self._unvalidated.remove(entry)
            self._validate(entry, flat)
        names = self._param_names(args)
        is_param = [f"x{i}" in names for i in range(len(flat))]

        def ordered(params_flat: list[Any], rest_flat: list[Any]) -> list[Any]:
            p, r = iter(params_flat), iter(rest_flat)
            return [next(p) if param else next(r) for param in is_param]

        if entry.call is entry.original:
            original = jax.jit(self.fun, static_argnums=self.static_argnums)
            return lambda rest_args, _leaves: original(*_merge_params(self.params_argnums, params, rest_args))
        body, weights = _with_weights(entry.plan, flat)
        run = jax.jit(lambda p, r, w: body(*ordered(p, r), *w))
        return lambda _rest, leaves: jax.tree_util.tree_unflatten(entry.out_tree, run(params_flat, leaves, weights))

    def _traced(self, *args: Any) -> Any:
        """The body jax.jit traces: look up (or build) the plan for these shapes and inline it."""
        flat, key = self._flatten(args)
        entry = self._entry(args, flat, key)
        return jax.tree_util.tree_unflatten(entry.out_tree, entry.call(*flat))

    def _checked(self, dispatch: "_Dispatch", call_args: tuple, full_args: tuple) -> Any:
        """Run through jax.jit's fast dispatch; plans built during that call are validated on these arguments
        and, on a mismatch, the dispatch is rebuilt so that it traces the original program."""
        try:
            out = dispatch.run(*call_args)
        except TypeError:
            self._flatten(full_args)  # names a non-array argument clearly, if that is what failed
            raise
        if self._unbudgeted and dispatch is self._dispatch:
            self._check_budget(call_args)
        if not self._unvalidated:
            return out
        flat, _ = self._flatten(full_args)
        pending, self._unvalidated = self._unvalidated, []
        if any([self._validate(entry, flat) for entry in pending]):
            dispatch.reset()
            out = dispatch.run(*call_args)
        return out

    def _check_budget(self, call_args: tuple) -> None:
        """XLA's own figure for the program just compiled, recorded in its plan; a warning if over budget."""
        entries, self._unbudgeted = self._unbudgeted, []
        figure = figure_of(self._dispatch.run.lower(*call_args).compile())
        for entry in entries:
            entry.plan.memory = memory_report(entry.plan)
            entry.plan.memory.xla = figure
            if self._dispatch.compiler_options:
                entry.plan.memory.applied.append("XLA:CPU memory-optimized scheduler")
            if self._dispatch.donate_argnums:
                entry.plan.memory.applied.append(f"donated arguments {self._dispatch.donate_argnums}")
            if self.memory_budget is not None and figure["total"] > self.memory_budget:
                if self._rematerialize(entry, call_args):
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
        fitted, report = fit_budget(self.fun, call_args, self.memory_budget, loss=loss)
        if not report.fits:
            return False
        tree = jax.tree_util.tree_structure(list(call_args))
        entry.call = lambda *flat: jax.tree_util.tree_leaves(fitted(*jax.tree_util.tree_unflatten(tree, flat)))
        entry.plan.memory.xla = report.achieved
        entry.plan.memory.applied.append(report.mechanism)
        self._dispatch.reset()
        return True

    def plan(self, *args: Any, prepared: bool | None = None) -> Plan:
        """The plan for arguments of these shapes and dtypes (built if needed).

        With parameters declared it is the plan `prepare` runs, unless prepared=False: then the plan a direct
        call runs, which prices weight-only work as the per-call work it is."""
        flat, key = self._flatten(args)
        return self._entry(args, flat, key, bool(self.params_argnums) if prepared is None else prepared).plan

    def memory(self, *args: Any) -> MemoryReport:
        """Memory of the plan for these arguments: liveness, best-fit arena, lower bound, a memory-aware order
        (our model) and XLA's own figure of the compiled program; also kept in the plan's summary."""
        flat, key = self._flatten(args)
        entry = self._entry(args, flat, key)
        entry.plan.memory = memory_report(entry.plan, entry.call, flat)
        return entry.plan.memory

    def _flatten(self, args: tuple) -> tuple[list[Any], Any]:
        for i in self.static_argnums:
            if not -len(args) <= i < len(args):
                raise CaptureError(
                    f"static_argnums={self.static_argnums} names argument {i}, but "
                    f"{getattr(self.fun, '__name__', 'the function')} got {len(args)} arguments"
                )
        static = {i % len(args) for i in self.static_argnums}
        dynamic = [a for i, a in enumerate(args) if i not in static]
        flat, tree = jax.tree_util.tree_flatten(dynamic)
        try:
            avals = tuple((tuple(np.shape(x)), str(jax.numpy.result_type(x)), _weak(x)) for x in flat)
        except TypeError as error:
            raise CaptureError(f"eqsat.optimize: an argument is not an array or number: {error}") from None
        key = (tree, avals, tuple((i, args[i]) for i in sorted(static)))
        return flat, key

    def _entry(self, args: tuple, flat: list[Any], key: Any, prepared: bool = False) -> _Entry:
        entry = self._cache.get((key, prepared))
        if entry is None:
            entry = self._cache[key, prepared] = self._build(args, flat, key, prepared)
            if not entry.validated:
                self._unvalidated.append(entry)
            if self.memory_budget is not None:
                self._unbudgeted.append(entry)
        return entry

    def _build(self, args: tuple, flat: list[Any], key: Any, prepared: bool) -> _Entry:
        """Capture and saturate once per signature; extract and lower once per signature and mode."""
        name = getattr(self.fun, "__name__", repr(self.fun))
        t0 = time.perf_counter()
        if key not in self._saturated:
            flat_fun, out_tree = _flat_function(self.fun, args, self.static_argnums)
            progress.begin("capture", f"capture {name}")
            try:
                closed = jax.make_jaxpr(flat_fun)(*flat)
            except Exception as error:
                raise CaptureError(
                    f"eqsat.optimize could not trace {name}: {type(error).__name__}: {str(error).splitlines()[0]} "
                    "eqsat accepts what jax.jit accepts: mark Python-valued arguments with static_argnums."
                ) from error
            graph = capture(closed)
            self._optimize_bodies(graph)
            t1 = time.perf_counter()
            progress.begin("saturate", f"saturate {len(graph.nodes)} nodes", total=self.limits.iterations)
            snapshot = saturate(graph, self.rules, self.limits)
            self._saturated[key] = (flat_fun, out_tree(), graph, snapshot, t1 - t0, time.perf_counter() - t1)
        flat_fun, out_tree, graph, snapshot, capture_s, saturate_s = self._saturated[key]
        t2 = time.perf_counter()
        params = self._param_names(args) if prepared else frozenset()
        progress.begin("extract", f"extract ({self.extractor}{', weights prepared' if prepared else ''})")
        plan = self._extract(graph, snapshot, params)
        extract_s = time.perf_counter() - t2 - plan.stats.get("measure_s", 0.0)  # measuring is reported apart
        plan.stats.update(capture_s=capture_s, saturate_s=saturate_s, extract_s=extract_s)
        log.info("eqsat: %s\n%s", name, plan.summary())
        original = jax.jit(flat_fun)
        if self.autotune and not self._nothing_to_gain(plan):
            plan = self._autotune(plan, graph, snapshot, params, flat, original)
        if self._nothing_to_gain(plan) or plan.fallback:  # run the original program exactly as jax.jit would
            return _Entry(plan, original, original, out_tree, validated=True)
        optimized = jax.jit(_with_original_derivatives(lower(plan), flat_fun))
        return _Entry(plan, optimized, original, out_tree, validated=not self.validate, params=params)

    def _nothing_to_gain(self, plan: Plan) -> bool:
        """The original program, node for node, or one that differs only in what XLA does itself or nearly as
        well: duplicates shared, weight-only work hoisted, for a predicted gain below the profile's min_gain."""
        if plan.unchanged:
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
        concrete = [_example_like(x, i) if isinstance(x, jax.core.Tracer) else x for i, x in enumerate(flat)]
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
        """Optimize the bodies of scan, while, cond and remat calls as programs of their own, in place."""
        for k, call in enumerate(graph.opaque):
            changed = {}
            for name, value in call.params.items():
                if name in _SUBPROGRAM_PARAMS and isinstance(value, jcore.Jaxpr):
                    changed[name] = self._optimize_body(value)
                elif name == "branches" and isinstance(value, tuple):
                    changed[name] = tuple(self._optimize_body(b) for b in value)
            changed = {name: v for name, v in changed.items() if v is not call.params[name]}
            if changed:
                graph.opaque[k] = Opaque(call.primitive, {**call.params, **changed}, call.multiple_results)
                graph.bodies_rewritten += 1

    def _optimize_body(self, body: jcore.Jaxpr) -> jcore.Jaxpr:
        """The body re-planned, or the body itself when nothing changed or the result would not fit in its place."""
        graph = capture(body)
        self._optimize_bodies(graph)
        plan = self._extract(graph, saturate(graph, self.rules, self.limits), frozenset())
        if self._nothing_to_gain(plan):
            return body
        inner = body.jaxpr
        avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in inner.invars]
        new = jax.make_jaxpr(lower(plan))(*avals)
        same_type = [_type(v) for v in new.jaxpr.outvars] == [_type(v) for v in inner.outvars]
        return new if same_type and not new.consts and not inner.constvars else body

    def _param_names(self, args: tuple) -> frozenset[str]:
        """The graph's Var names of the flat leaves that belong to parameter arguments."""
        static = {i % len(args) for i in self.static_argnums}
        params = {i % len(args) for i in self.params_argnums}
        names, k = set(), 0
        for i, arg in enumerate(args):
            if i in static:
                continue
            n = len(jax.tree_util.tree_leaves(arg))
            if i in params:
                names.update(f"x{j}" for j in range(k, k + n))
            k += n
        return frozenset(names)

    def _validate(self, entry: _Entry, flat: list[Any]) -> bool:
        """Compare with the original on these arguments (or random ones while tracing); fall back on mismatch.

        Returns whether it fell back."""
        if any(isinstance(x, jax.core.Tracer) for x in flat):
            flat = [_example_like(x, i) for i, x in enumerate(flat)]
        progress.begin("validate", "validate: compile and compare with the original")
        expected, got = entry.original(*flat), entry.call(*flat)
        entry.validated = True
        wrong = next(((k, p) for k, p in enumerate(map(_differs, range(len(got)), expected, got)) if p), None)
        if wrong is None:
            return False
        k, problem = wrong
        progress.begin("validate", "validate: finding the rules the mismatch depends on")
        entry.plan.blamed, exact = self._blame(entry, flat, k, expected[k])
        where = rule_sources.rule_locations(self.rules)
        suspects = ", ".join(f"{name} ({where[name]})" if name in where else name for name in entry.plan.blamed)
        suspects = (suspects or "none found") + ("" if exact else " (narrowing stopped by its time budget)")
        entry.plan.fallback = f"optimized result differed from the original ({problem}); rules involved: {suspects}"
        warnings.warn(
            f"eqsat: the optimized {getattr(self.fun, '__name__', 'function')} differed from the original "
            f"({problem}); running the original instead. Rules involved: {suspects}.",
            EqsatWarning,
            stacklevel=3,
        )
        entry.call = entry.original
        return True

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
                return not self._nothing_to_gain(plan) and _differs(k, want, jax.jit(lower(plan))(*flat)[k]) is not None
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
    static_argnums: int | Sequence[int] = (),
    params_argnums: int | Sequence[int] = (),
    validate: bool = True,
    limits: Limits | None = None,
    extractor: str = "auto",
    autotune: int = 0,
    memory_budget: int | None = None,
    donate_argnums: int | Sequence[int] = (),
) -> Any:
    """Optimize a JAX function by equality saturation; use as `optimize(f, ...)` or `@optimize(...)`.

    target: a device profile ("cpu", "a100", "h100", "h200", "tpu-v5e"); the plan runs wherever JAX runs.
    rules: extra rule files (paths) or egglog text; disabled_rules: built-in groups to switch off by name.
    static_argnums: as in jax.jit. params_argnums: arguments that are weights, fixed across calls; work on
    them alone (concatenating, folding) is then priced as free, and `fast.prepare(params)` does it once.
    validate: compare with the original on the first call of each signature and fall back to it, with a
    warning, on a mismatch. limits: bounds on saturation (eqsat.Limits). extractor: "greedy" (greedy DAG),
    "ilp" (exact, HiGHS) or "auto" (both within a time budget, the cheaper kept). autotune: compile and measure
    this many of the best distinct candidate plans (and the original) on this device and keep the fastest.
    memory_budget: bytes; memory becomes a term of the extraction cost, XLA:CPU's memory-optimized scheduler is
    used, XLA's figure goes into plan.memory; a gradient still over budget runs its loss as rematerialized
    segments, anything else warns. donate_argnums: as in jax.jit.
    """
    settings = dict(
        target=target,
        rules=rules,
        disabled_rules=tuple(disabled_rules),
        static_argnums=_as_tuple(static_argnums),
        params_argnums=_as_tuple(params_argnums),
        validate=validate,
        limits=limits,
        extractor=extractor,
        autotune=autotune,
        memory_budget=memory_budget,
        donate_argnums=_as_tuple(donate_argnums),
    )
    if fun is None:
        return functools.partial(optimize, **settings)
    if not callable(fun):
        raise TypeError(
            f"eqsat.optimize expects a callable (a function of JAX arrays), got {type(fun).__name__}: {fun!r:.80}"
        )
    return Optimized(fun, **settings)


def _with_weights(plan: Plan, flat: list[Any]) -> tuple[Callable[..., list[Any]], list[Any]]:
    """The plan as fn(*flat, *weights) and its weight-only values computed once on these arguments (none when no
    parameters were declared: then no node is weight-only)."""
    boundary = weight_boundary(plan)
    weights = jax.jit(lower(plan, outputs=boundary))(*flat) if boundary else []
    return lower(plan, given=boundary), weights


def _shape_of(plan: Plan) -> tuple:
    """What tells two candidate plans apart: their nodes, without costs."""
    return tuple((n.op, n.inputs, n.attrs) for n in plan.nodes)


def _type(var: Any) -> tuple:
    """Shape and dtype, not weak type: what a loop or branch body must keep."""
    return (getattr(var.aval, "shape", None), getattr(var.aval, "dtype", None))


def _as_tuple(argnums: int | Sequence[int]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


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


def _flat_function(
    fun: Callable[..., Any], args: tuple, static_argnums: tuple[int, ...]
) -> tuple[Callable[..., list[Any]], Callable[[], Any]]:
    """fun as a function of the flat dynamic leaves (static arguments closed over), and its output tree."""
    static = {i % len(args) for i in static_argnums} if args else set()
    dynamic_tree = jax.tree_util.tree_structure([a for i, a in enumerate(args) if i not in static])
    out_tree: dict[str, Any] = {}

    def flat_fun(*leaves: Any) -> list[Any]:
        dynamic = iter(jax.tree_util.tree_unflatten(dynamic_tree, leaves))
        full = [args[i] if i in static else next(dynamic) for i in range(len(args))]
        results, out_tree["tree"] = jax.tree_util.tree_flatten(fun(*full))
        return results

    return flat_fun, lambda: out_tree["tree"]


def _with_original_derivatives(
    optimized: Callable[..., list[Any]], original: Callable[..., list[Any]]
) -> Callable[..., list[Any]]:
    """The optimized forward pass, differentiated as the original is (custom_jvp keeps grad and vmap exact)."""
    wrapped = jax.custom_jvp(optimized)
    wrapped.defjvp(lambda primals, tangents: jax.jvp(original, primals, tangents))
    return wrapped


def _weak(x: Any) -> bool:
    return bool(getattr(getattr(x, "aval", x), "weak_type", False)) or isinstance(x, int | float | complex)


def _example_like(x: Any, seed: int) -> np.ndarray:
    dtype = np.dtype(x.dtype)
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
        return np.random.default_rng(seed).standard_normal(x.shape).astype(dtype)
    return np.zeros(x.shape, dtype)


def _mismatch(expected: list[Any], got: list[Any]) -> str | None:
    """None if every result agrees within the dtype's tolerance, else what differed (the first that did)."""
    return next(filter(None, map(_differs, range(len(expected)), expected, got)), None)


def _differs(k: int, want: Any, have: Any) -> str | None:
    """What is wrong with result k, or None. Each element must be within rtol of its own magnitude plus a small
    share of the result's scale: re-association changes an element by a few roundings of the largest terms it sums
    (about 1e-6 of the scale for float32 sums of 4,096 terms), which an element near zero cannot absorb itself."""
    want, have = np.asarray(want), np.asarray(have)
    if want.shape != have.shape or want.dtype != have.dtype:
        return f"result {k}: {have.shape} {have.dtype} instead of {want.shape} {want.dtype}"
    rtol = _RTOL.get(want.dtype.name)
    if rtol is None:
        return None if np.array_equal(want, have) else f"result {k}: {np.sum(want != have)} elements differ"
    w, h = want.astype(np.float64), have.astype(np.float64)
    # Where the original overflowed (inf or NaN) a finite result is accepted: the stable forms do this on
    # purpose. The reverse, an inf or NaN the original did not produce, is a mismatch.
    if np.any(~np.isfinite(h) & ~((h == w) | (np.isnan(h) & np.isnan(w)))):
        return f"result {k}: inf or NaN where the original has a different value"
    finite = np.isfinite(w) & np.isfinite(h)
    w, h = w[finite], h[finite]  # only finite values are subtracted: no numpy warnings leak
    scale = float(np.max(np.abs(w), initial=0.0))
    allowed = rtol * (np.abs(w) + _SCALE_SHARE * scale)
    bad = np.abs(w - h) > allowed
    if not np.any(bad):
        return None
    i = int(np.argmax(np.abs(w - h) - allowed))
    return (
        f"result {k}: {int(bad.sum())} of {w.size} elements differ, e.g. {h[i]:.6g} instead of {w[i]:.6g} "
        f"(allowed {rtol:g} x (|value| + {_SCALE_SHARE:g} x max |value| {scale:.3g}))"
    )
