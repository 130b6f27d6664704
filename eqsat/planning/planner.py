"""Planning, one signature at a time: capture -> optimize sub-program bodies -> saturate -> extract (-> auto-tune)
-> an entry that runs the plan, or the original where nothing pays.

Plain values in and out: a function, its frozen ResolvedOptions and a Signature give a NewEntry (an entry with the
first events of its life, which the dispatcher applies: planning moves no entry). The wrapper
(eqsat/dispatch/dispatcher.py) calls this outside the trace of the jax.jit that runs the plans; capture traces the
function on abstract values, so a plan can be built under any transformation of the caller.
"""

import functools
import logging
import operator
import time
import warnings
from collections.abc import Callable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

from eqsat.backends.lower import lower, with_original_derivatives, with_overflow_watch
from eqsat.capture.ir import Graph, Opaque
from eqsat.capture.jaxpr import capture
from eqsat.egraph.rule_sources import REAL_MARK, RuleSource, keeping, real_rules
from eqsat.egraph.saturate import Snapshot, StopReason, saturate
from eqsat.extract.cost import Cost
from eqsat.extract.plan import Plan, build_plan
from eqsat.extract.timing import attached, priced
from eqsat.ops.table import GET, OPAQUE
from eqsat.planning import agreement, repeats
from eqsat.planning.autotune import autotune
from eqsat.plans import plan_store
from eqsat.plans.options import ResolvedOptions
from eqsat.plans.plan_life import Entry, Event, NewEntry
from eqsat.plans.sharding import body_tracing
from eqsat.plans.signature import Signature, examples, flat_function, inputs_of, signature_of
from eqsat.support import background, processes, progress
from eqsat.support.errors import EqsatError, EqsatWarning

log = logging.getLogger("eqsat")

_SUBPROGRAM_PARAMS = ("jaxpr", "cond_jaxpr", "body_jaxpr")  # sub-programs of scan, while, remat (cond: branches)


@dataclass(frozen=True)
class Captured:
    """A signature's program as traced: the flat function, its output tree and jaxpr, and the trace's seconds."""

    flat_fun: Callable[..., list[Any]]
    out_tree: Any
    closed: jcore.ClosedJaxpr
    seconds: float


@dataclass(eq=False)
class Saturated:
    """A signature's capture and saturation, shared by both modes (direct calls and prepare)."""

    flat_fun: Callable[..., list[Any]]
    out_tree: Any
    graph: Graph
    snapshot: Any
    capture_s: float
    saturate_s: float
    closed: jcore.ClosedJaxpr


class Planner:
    """Plans one function's signatures under one ResolvedOptions; `saturated` (signature -> Saturated) may be shared."""

    def __init__(self, fun: Callable[..., Any], options: ResolvedOptions, saturated: MutableMapping) -> None:
        self.fun, self.options, self.saturated = fun, options, saturated

    def narrow_source(self, signature: Signature) -> Callable[..., Any]:
        """The function as a flat function of this signature's leaves, traced afresh (validation judges a plan
        that computes narrow chains in float32 against it on float32 inputs)."""
        return flat_function(self.fun, signature)[0]

    @functools.cached_property
    def name(self) -> str:
        """fun's name in messages, found when one is first needed: a callable's repr may be costly, or raise."""
        name = getattr(self.fun, "__name__", None)
        if isinstance(name, str):
            return name
        try:
            return repr(self.fun)
        except Exception:
            return f"a {type(self.fun).__name__} object"

    def capture(self, signature: Signature) -> Captured | NewEntry:
        """The signature's program, traced once (its saturation keeps it); an entry that runs the original where
        no plan could hold the program. An error in the user's function reaches the caller as it is."""
        if signature in self.saturated:
            done = self.saturated[signature]
            return Captured(done.flat_fun, done.out_tree, done.closed, 0.0)
        t0 = time.perf_counter()
        flat_fun, out_tree_of = flat_function(self.fun, signature)
        progress.begin("capture", f"capture {self.name}")
        try:
            closed = jax.make_jaxpr(flat_fun)(*signature.avals)
        except Exception as error:
            error.add_note(f"(raised while eqsat.optimize traced {self.name})")
            raise
        if any(isinstance(c, jax.core.Tracer) for c in closed.consts):  # the plan could not hold them
            why = f"{self.name} closes over values traced by an outer transformation"
            return self.original_entry(signature, flat_fun, out_tree_of(), why)
        return Captured(flat_fun, out_tree_of(), closed, time.perf_counter() - t0)

    def build(self, signature: Signature, prepared: bool, captured: Captured | None = None) -> NewEntry:
        """Capture (unless given) and saturate once per signature; extract and lower once per signature and mode.

        A failure of eqsat's own machinery after capture warns and runs the original."""
        captured = captured or self.capture(signature)
        if isinstance(captured, NewEntry):
            return captured
        if processes.count() > 1:
            return agreement.agreed(self, signature, prepared, captured)
        return self.build_here(signature, prepared, captured)

    def build_here(self, signature: Signature, prepared: bool, captured: Captured) -> NewEntry:
        """This process's plan of the captured program: stored, or saturated and extracted here."""
        t0 = time.perf_counter() - captured.seconds
        flat_fun, out_tree, closed = captured.flat_fun, captured.out_tree, captured.closed
        try:
            key = self._store_key(closed, ("program", prepared))
            stored = self._stored(key, closed, signature, flat_fun) if key else None
            if stored is not None:
                plan, call = stored
                plan.stats.update(stored=1.0, load_s=time.perf_counter() - t0)
                return self._entry_of(signature, plan, flat_fun, out_tree, closed, prepared, key, Event.LOADED, call)
            if signature not in self.saturated:
                graph = self._graph(closed, signature)
                t1 = time.perf_counter()
                iterations = self.options.limits.iterations
                progress.begin("saturate", f"saturate {len(graph.nodes)} nodes", total=iterations)
                snapshot = self.saturate(graph, list(self.options.rule_sources))
                saturate_s = time.perf_counter() - t1
                self.saturated[signature] = Saturated(flat_fun, out_tree, graph, snapshot, t1 - t0, saturate_s, closed)
            return self._plan_entry(signature, prepared, key, self.saturated[signature])
        except EqsatError:  # a bad rule or a shape conflict: the user's to fix
            raise
        except Exception as error:  # eqsat's own failure: the original runs
            if background.exiting():
                raise background.Stopped from error
            why = _failure(self.name, error)
            warnings.warn(f"{why}; running the original instead", EqsatWarning, stacklevel=6)
            return self.original_entry(signature, jax.jit(flat_fun), out_tree, why)

    def adopted_entry(
        self,
        signature: Signature,
        prepared: bool,
        captured: Captured,
        plan: Plan,
        call: Callable[..., list[Any]] | None,
    ) -> NewEntry:
        """The entry of a plan made by another process (eqsat/planning/agreement.py) and lowered here (`lowered`)."""
        flat_fun, out_tree, closed = captured.flat_fun, captured.out_tree, captured.closed
        return self._entry_of(signature, plan, flat_fun, out_tree, closed, prepared, None, Event.LOADED, call)

    def fallback_entry(self, signature: Signature, captured: Captured, why: str) -> NewEntry:
        """An entry that runs the captured program as jax.jit would, saying why."""
        return self.original_entry(signature, _original(captured.closed), captured.out_tree, why)

    def plan(self, args: tuple, kwargs: dict[str, Any] | None = None, prepared: bool = False) -> Plan:
        """The plan for arguments of these shapes and dtypes, built afresh (not kept)."""
        _, signature = signature_of(args, kwargs or {}, self.options.static_argnums, self.options.static_argnames)
        return self.build(signature, prepared).entry.plan

    def extract(
        self,
        graph: Graph,
        snapshot: Snapshot | repeats.Repeated,
        prepared: bool,
        forbid: frozenset[str] = frozenset(),
        extract_seconds: float | None = None,
    ) -> Plan:
        """build_plan with this optimizer's target, extractor and budgets (a memory budget makes memory a cost).
        extract_seconds: the extractors' time, by default the limits'."""
        options = self.options
        extract_seconds = options.limits.extract_seconds if extract_seconds is None else extract_seconds
        if isinstance(snapshot, repeats.Repeated):  # each part alone, in a share of the time by its size; composed
            parts, pieces = snapshot.parts, repeats.snapshots(snapshot)
            total = sum(len(piece.nodes) for piece in pieces)
            glue, *blocks = (
                self.extract(part, piece, prepared, forbid, extract_seconds * len(piece.nodes) / total)
                for part, piece in zip([parts.glue, *parts.blocks], pieces, strict=True)
            )
            # the original priced as the parts were: by the timing cache their measurements filled
            return repeats.compose(graph, parts, glue, blocks, attached(options.target_profile))
        # not the budget itself: under a memory_budget each value's bytes are priced once more (extract/plan.py)
        memory_weight = 1.0 if options.memory_budget is not None else 0.0
        limits = options.limits
        shared = agreement.measured_everywhere if processes.led() else None  # several processes measure
        profile, timing = priced(
            options.target_profile, snapshot, limits.measure_seconds, limits.timing_transfer, shared
        )
        plan = build_plan(graph, snapshot, profile, prepared, options.extractor, extract_seconds, forbid, memory_weight)
        plan.stats.update(timing)
        return plan

    def saturate(self, graph: Graph, rules: list[RuleSource]) -> Snapshot | repeats.Repeated:
        """The graph's e-graph; a graph of repeated layers in parts: its glue and one block per repeat."""
        found = repeats.find(graph)
        if not found:
            return saturate(graph, rules, self.options.limits.saturation)
        parts = repeats.split(graph, found)
        blocks = [saturate(block, rules, self.options.limits.saturation) for block in parts.blocks]
        return repeats.Repeated(parts, saturate(parts.glue, rules, self.options.limits.saturation), blocks)

    def nothing_to_gain(self, plan: Plan) -> bool:
        """The original program, node for node, or one that differs only in what XLA does itself or nearly as
        well: duplicates shared, parameter-only work hoisted, for a predicted gain below the profile's min_gain. The
        original's own parameter-only work (x @ W.T's transpose) counts as a gain when prepared: XLA:CPU runs a
        matrix-vector product with a transposed weight several times slower than with the weight transposed once."""
        if plan.unchanged and not any(node.parameter_only for node in plan.nodes):
            return True
        rewritten = plan.rewritten_ops() or plan.stats.get("bodies_rewritten")
        return not rewritten and plan.predicted.seconds > plan.original.seconds * (
            1 - self.options.target_profile.min_gain
        )

    def runner(
        self, plan: Plan, flat_fun: Callable[..., list[Any]], closed: jcore.ClosedJaxpr
    ) -> Callable[..., list[Any]]:
        """The plan as a jitted function of the flat leaves, differentiated as the original is, watched for
        overflow where it relies on rules marked `; @real` (`watched_nodes`; closed: the captured program, which
        runs where the plan's watched values are not finite)."""
        watch = self.watched_nodes(plan)
        run = lower(plan, watch=watch)
        if watch:
            run = with_overflow_watch(run, jcore.jaxpr_as_fun(closed), len(watch))
        return jax.jit(with_original_derivatives(run, flat_fun))

    def watched_nodes(self, plan: Plan) -> list[int]:
        """The plan nodes an overflow watch checks (backends/lower.py with_overflow_watch), what put each there recorded
        as plan.overflow_watch: where rules marked `; @real` fired, the rewritten values the rest of the program
        reads (Plan.rewritten_frontier: a re-association may overflow where the original does not; a `; @rounding`
        rule's partial sums overflow only where its terms do); convs over zeros (Plan.convs_over_zeros); the results of
        opaque calls whose bodies were re-planned with either (checked outside the body: a check inside a
        shard_map body would differ between shards). Every fired rule counts (which ones the extracted program
        used is not recorded). Values of integer types cannot overflow: not watched."""
        real = sorted(set(plan.rules_fired) & self._real_rules)
        frontier = _overflowing_frontier(plan) if real else []
        zeros = {why: [i for i in convs if i not in frontier] for why, convs in plan.convs_over_zeros().items()}
        graph = plan.graph
        bodies = graph.real_bodies if graph is not None else {}
        calls = {}  # node holding one array that a call with such bodies returned -> that call's opaque index
        for i, node in enumerate(plan.nodes):
            call = plan.nodes[node.inputs[0]] if node.op == GET else node  # a multi-result call's: its Gets
            index = call.attrs[0] if call.op == OPAQUE else None
            if index in bodies and (node.op == GET) == graph.opaque[index].multiple_results:
                calls[i] = index
        watched = [i for i in calls if _may_overflow(plan.nodes[i].dtype)]
        conv_reasons = [why for why, nodes in zeros.items() if nodes]
        rules = (real if frontier else []) + conv_reasons + [r for i in watched for r in bodies[calls[i]]]
        plan.overflow_watch = sorted(set(rules))
        return frontier + [i for nodes in zeros.values() for i in nodes] + watched

    def _unwatched_if_as_cheap(self, graph: Graph, plan: Plan, prepared: bool) -> Plan:
        """The plan, or where rules marked `; @real` fired and would put it under the overflow watch, the plan
        extracted without them where it is predicted as fast: which fired rules an extracted program used is not
        recorded, and a watch on every call for nothing costs ConvNeXtTiny's plan 13-15 %."""
        real = set(plan.rules_fired) & self._real_rules
        if not real or not _overflowing_frontier(plan):
            return plan
        rules = keeping(list(self.options.rule_sources), lambda names: not real & set(names))
        plain = self.extract(graph, self.saturate(graph, rules), prepared)
        if plain.predicted.seconds > plan.predicted.seconds:
            return plan
        plain.stats["unwatched"] = 1.0  # the @real rules that fired were left out: nothing to watch
        return plain

    @functools.cached_property
    def _real_rules(self) -> frozenset[str]:
        return real_rules(list(self.options.rule_sources), (REAL_MARK,))

    def original_entry(
        self, signature: Signature, call: Callable[..., Any], out_tree: Any, why: str, job: Future | None = None
    ) -> NewEntry:
        """An entry that runs the original, with a plan of no nodes that says why; `job`: the plan being built
        in the background meanwhile."""
        log.info("eqsat: %s; the original runs", why)
        profile = self.options.target_profile.name
        plan = Plan(profile, [], [], [], Cost(), Cost(), StopReason.NOT_PLANNED, fallback=why)
        return NewEntry(Entry(signature, plan, call, out_tree, job=job), (Event.PENDING if job else Event.UNPLANNED,))

    def pending_entry(self, signature: Signature, captured: Captured, job: Future) -> NewEntry:
        """The entry of a signature whose plan `job` builds: the original, from the captured jaxpr."""
        why = f"{self.name}'s plan is being built in the background"
        new = self.original_entry(signature, _original(captured.closed), captured.out_tree, why, job)
        new.entry.captured = captured
        return new

    def _graph(self, closed: jcore.ClosedJaxpr, signature: Signature) -> Graph:
        """The captured graph, each input with its role and path, its sub-program bodies optimized."""
        graph = capture(closed, inputs_of(self.fun, signature, self.options.params_argnums))
        self._optimize_bodies(graph)
        return graph

    def _stored(
        self, key: str, closed: jcore.ClosedJaxpr, signature: Signature, flat_fun: Callable[..., list[Any]]
    ) -> tuple[Plan, Callable[..., list[Any]] | None] | None:
        """The plan kept under this key with the captured program attached, and its program (where it runs),
        where that gives the program's result types (its first call validates its values; the trace that tells
        is the one its calls find); one that does not is set aside."""
        plan = plan_store.load(key, self.options.target_profile)
        if plan is None:
            return None
        call, problem = self.lowered(plan, closed, signature, flat_fun)
        if problem is None:
            return plan, call
        plan_store.set_aside(key, problem)
        return None

    def lowered(
        self, plan: Plan, closed: jcore.ClosedJaxpr, signature: Signature, flat_fun: Callable[..., list[Any]]
    ) -> tuple[Callable[..., list[Any]] | None, str | None]:
        """A plan made elsewhere (kept by another process, or shared by process 0) with the captured program
        attached: its program (None where the original runs), or why it cannot run here (it does not lower, or
        gives other result types)."""
        plan.graph = self._graph(closed, signature)
        if plan.fallback or self.nothing_to_gain(plan):  # the original runs
            return None, None
        want = [(a.shape, a.dtype) for a in closed.out_avals]
        try:
            call = self.runner(plan, flat_fun, closed)
            got = [(a.shape, a.dtype) for a in jax.tree.leaves(call.trace(*signature.avals).out_info)]
            return (call, None) if got == want else (None, f"gives results of types {got}, the program's are {want}")
        except Exception as error:
            return None, f"does not lower ({type(error).__name__}: {error})"

    def _store_key(self, closed: jcore.ClosedJaxpr, what: tuple) -> str | None:
        """The key of this program's plan among those kept across processes; None where none are kept."""
        if not plan_store.enabled():
            return None
        return plan_store.program_key(closed, (*self.options.store_settings, *what))

    def _plan_entry(self, signature: Signature, prepared: bool, key: str | None, done: Saturated) -> NewEntry:
        t2 = time.perf_counter()
        options = self.options
        progress.begin("extract", f"extract ({options.extractor}{', parameters prepared' if prepared else ''})")
        plan = self._unwatched_if_as_cheap(done.graph, self.extract(done.graph, done.snapshot, prepared), prepared)
        extract_s = time.perf_counter() - t2 - plan.stats.get("measure_s", 0.0)  # measuring is reported apart
        plan.stats.update(capture_s=done.capture_s, saturate_s=done.saturate_s, extract_s=extract_s)
        if log.isEnabledFor(logging.INFO):  # a summary walks the plan and the original (0.45 s for a 32-layer grad)
            log.info("eqsat: %s\n%s", self.name, plan.summary())
        original = _original(done.closed)
        if options.autotune and not self.nothing_to_gain(plan):
            with jax.ensure_compile_time_eval():  # measured on examples, even while a caller's trace is active
                flat = examples(signature)
                plan = autotune(
                    plan, lambda ban: self.extract(done.graph, done.snapshot, prepared, ban), flat, original,
                    options.autotune,
                )  # fmt: skip
        if key:
            plan_store.save(key, plan, options.target_profile, repeats.snapshots(done.snapshot))
        flat_fun, out_tree, closed = done.flat_fun, done.out_tree, done.closed
        return self._entry_of(
            signature, plan, flat_fun, out_tree, closed, prepared, key, Event.PLANNED, original=original
        )

    def _entry_of(
        self,
        signature: Signature,
        plan: Plan,
        flat_fun: Callable[..., list[Any]],
        out_tree: Any,
        closed: jcore.ClosedJaxpr,
        prepared: bool,
        key: str | None,
        origin: Event,
        call: Callable[..., list[Any]] | None = None,
        original: Callable[..., list[Any]] | None = None,
    ) -> NewEntry:
        """The entry that runs a plan (`origin`: planned now, and then stored where a key is given; or loaded:
        kept from another process, with its program `call`), validated on first use."""
        original = original or _original(closed)
        stored = [Event.STORED] if key and origin is Event.PLANNED else []
        if self.nothing_to_gain(plan) or plan.fallback:  # run the original program exactly as jax.jit would
            return NewEntry(Entry(signature, plan, original, out_tree, key=key), (Event.UNPLANNED, *stored))
        checked = self.options.validate  # a plan kept from another process too: each process validates
        reference = _COMPILER.submit(_compiled_reference, original, closed) if checked else None
        call = call or self.runner(plan, flat_fun, closed)
        entry = Entry(signature, plan, original, out_tree, call, prepared, reference, key)
        return NewEntry(entry, (origin, *stored, *([] if checked else [Event.TRUSTED])))

    def _optimize_bodies(self, graph: Graph) -> None:
        """Optimize the bodies of scan, while, cond, remat and shard_map calls as programs of their own, in place;
        the keys of body plans kept from other processes are listed in graph.stored_bodies."""
        if processes.count() > 1:  # a body's plan is its process's own: process 0's plan keeps bodies as they are
            return
        for k, call in enumerate(graph.opaque):
            changed, real = {}, set()
            for name, value in call.params.items():
                if name in _SUBPROGRAM_PARAMS and isinstance(value, jcore.Jaxpr | jcore.ClosedJaxpr):
                    changed[name] = self._optimize_body(value, call, graph.stored_bodies, real)
                elif name == "branches" and isinstance(value, tuple):
                    branches = tuple(self._optimize_body(b, call, graph.stored_bodies, real) for b in value)
                    # a new tuple of the same branches is no change (it made every cond look rewritten)
                    changed[name] = value if all(map(operator.is_, branches, value)) else branches
            changed = {name: v for name, v in changed.items() if v is not call.params[name]}
            if changed:
                graph.opaque[k] = Opaque(call.primitive, {**call.params, **changed}, call.multiple_results)
                graph.bodies_rewritten += 1
                if real:
                    graph.real_bodies[k] = sorted(real)

    def _optimize_body(self, body: Any, call: Opaque, stored: list[str], real: set[str]) -> Any:
        """The body re-planned, or the body itself when nothing changed or the result would not fit in its place;
        the keys of kept plans it (and bodies within it) took from other processes are added to `stored`, the
        @real rules a re-planned body relies on to `real` (the call's results are then watched).

        It is traced as its call traces it: a shard_map body within the mesh's manual axes (its collectives and
        pvary name them), on its own input types (a value varying over an axis stays varying)."""
        with body_tracing(call):
            graph = capture(body)
            self._optimize_bodies(graph)
            key = self._store_key(body, ("body",)) if isinstance(body, jcore.ClosedJaxpr) else None
            plan = plan_store.load(key, self.options.target_profile) if key else None
            kept = plan is not None
            if plan is None:
                snapshot = self.saturate(graph, list(self.options.rule_sources))
                plan = self.extract(graph, snapshot, prepared=False)
                if key:
                    plan_store.save(key, plan, self.options.target_profile, repeats.snapshots(snapshot))
            plan.graph = graph
            if self.nothing_to_gain(plan):
                return body
            inner = body.jaxpr
            try:
                new = jax.make_jaxpr(lower(plan))(*[v.aval for v in inner.invars])
            except Exception as error:
                if not kept:
                    raise
                plan_store.set_aside(key, f"does not lower ({type(error).__name__}: {error})")
                return self._optimize_body(body, call, stored, real)
        same_type = [_type(v) for v in new.jaxpr.outvars] == [_type(v) for v in inner.outvars]
        if not same_type or new.consts or inner.constvars:
            return body
        stored.extend([*graph.stored_bodies, key] if kept else graph.stored_bodies)
        self.watched_nodes(plan)
        real.update(plan.overflow_watch)
        return new if isinstance(body, jcore.ClosedJaxpr) else new.jaxpr


def _original(closed: jcore.ClosedJaxpr) -> Callable[..., list[Any]]:
    """The captured program, run as jax.jit runs it, from its jaxpr: evaluating the jaxpr in the dispatch's trace
    costs a tenth of tracing the user's function a second time (0.02-0.03 s against 0.1-0.2 s on a real model)."""
    return jax.jit(jcore.jaxpr_as_fun(closed))


def _overflowing_frontier(plan: Plan) -> list[int]:
    """The rewritten values the rest of the program reads (Plan.rewritten_frontier) that may be inf or NaN."""
    return [i for i in plan.rewritten_frontier() if _may_overflow(plan.nodes[i].dtype)]


def _may_overflow(dtype: str | None) -> bool:
    """A value of this dtype may be inf or NaN."""
    try:
        return bool(jnp.issubdtype(jnp.dtype(dtype), jnp.inexact))
    except TypeError:  # a PRNG key's type ("key<fry>") is no numpy dtype
        return False


def _type(var: Any) -> Any:
    """The type without its weak type (shape, dtype, the mesh axes a value varies over): what a loop, branch or
    shard_map body must keep."""
    return var.aval.strip_weak_type() if hasattr(var.aval, "strip_weak_type") else var.aval


def _failure(name: str, error: Exception) -> str:
    return f"eqsat could not plan {name} ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"


# one thread compiles the originals that validation compares with, beside the caller's compile of the plan: XLA
# releases the GIL while it compiles, so on two cores the two compiles overlap
_COMPILER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eqsat-reference")


def compiling_done() -> None:
    """Wait until the originals compiled in the background for validation are compiled: on a machine of two cores a
    compile beside a kernel's timing doubles it."""
    _COMPILER.submit(lambda: None).result()


def after_compiling(work: Callable[[], Any]) -> Future:
    """work, run on the thread that compiles the originals, once those queued are compiled (a call of an original
    then finds it compiled), while this thread goes on."""
    return _COMPILER.submit(work)


def _compiled_reference(original: Any, closed: jcore.ClosedJaxpr) -> Any:
    """The original (`_original(closed)`) compiled for the program's types: the jit object a fallback and a census
    call, whose first call then finds it traced and compiled; from the jaxpr, so no user code runs on this thread."""
    return original.lower(*[v.aval for v in closed.jaxpr.invars]).compile()
