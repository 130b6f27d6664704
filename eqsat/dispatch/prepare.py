"""`fast.prepare(*params)`: the parameters bound, and the parameter-only part of each signature's plan computed once,
as an inference engine does when it builds (optimize(..., params_argnums=...))."""

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax._src import config

from eqsat.backends.lower import with_overflow_watch, with_parameter_only_values
from eqsat.capture.ir import Role
from eqsat.checks import validate
from eqsat.dispatch.dispatcher import Dispatcher
from eqsat.dispatch.jit import inlined, runs_now
from eqsat.plans.plan_life import Entry
from eqsat.plans.signature import aval_key, merge_params


def prepare(calls: Dispatcher, params: tuple) -> Callable[..., Any]:
    """A function of the remaining arguments, the parameters (params_argnums, in order) bound."""
    params_argnums = calls.options.params_argnums
    if len(params) != len(params_argnums):
        raise TypeError(f"prepare() takes the {len(params_argnums)} parameter argument(s) {params_argnums}")
    params_flat = jax.tree_util.tree_leaves(params)
    ready: dict[Any, Callable[[tuple, list[Any]], Any]] = {}

    def prepared(*rest: Any) -> Any:
        leaves, tree = jax.tree_util.tree_flatten(rest)
        key = (tree, tuple(aval_key(x) for x in leaves), config.trace_context())  # as a Signature is keyed
        if key not in ready:
            ready[key] = _signature_call(calls, params, rest, params_flat, functools.partial(ready.__setitem__, key))
        return ready[key](rest, leaves)

    return prepared


def _signature_call(
    calls: Dispatcher, params: tuple, rest: tuple, params_flat: list[Any], settle: Callable[[Callable], None]
) -> Callable[..., Any]:
    """Plan, validate and run the parameter-only subgraph once, for one signature of the other arguments.

    Returns call(other arguments, their leaves). An unchanged plan calls the original through jax.jit, exactly as
    the caller would; otherwise the plan runs with the parameter-only values computed once, the leaves put in
    order at trace time.
    Where the guard was undecided, the call times both on live calls until it decides, then hands `settle` the
    call to make from then on."""
    params_argnums, options = calls.options.params_argnums, calls.options
    flat, signature = calls.signature(merge_params(params_argnums, params, rest), {})
    entry = calls.entry(signature, prepared=True)
    calls.compared(entry, flat)
    original = jax.jit(calls.fun, static_argnums=options.static_argnums)

    def unchanged(rest_args: tuple, _leaves: list[Any]) -> Any:
        return original(*merge_params(params_argnums, params, rest_args))

    if entry.running is entry.original:
        return unchanged
    is_parameter = [v.role is Role.PARAMETER for v in entry.plan.graph.input_variables()]

    def ordered(params_flat: list[Any], rest_flat: list[Any]) -> list[Any]:
        p, r = iter(params_flat), iter(rest_flat)
        return [next(p) if parameter else next(r) for parameter in is_parameter]

    watch = calls.planner.watched_nodes(entry.plan)
    body, once = with_parameter_only_values(entry.plan, flat, watch)  # once: the parameter-only values
    if watch:  # the original, the watch's fallback, takes no parameter-only values
        original_flat, n = inlined(entry.original), len(flat)
        body = with_overflow_watch(body, lambda *args: original_flat(*args[:n]), len(watch))
    run = jax.jit(lambda p, r, o: body(*ordered(p, r), *o))
    leaves = [x for x, parameter in zip(flat, is_parameter, strict=True) if not parameter]
    calls.timed_prepared(entry, lambda: run(params_flat, leaves, once), lambda: entry.original(*flat))

    def planned(_rest: tuple, leaves: list[Any]) -> Any:
        return jax.tree_util.tree_unflatten(entry.out_tree, run(params_flat, leaves, once))

    if not entry.undecided:
        return unchanged if entry.running is entry.original else planned
    return _measured_live(calls, entry, planned, unchanged, settle)


def _measured_live(
    calls: Dispatcher,
    entry: Entry,
    planned: Callable[[tuple, list[Any]], Any],
    unchanged: Callable[[tuple, list[Any]], Any],
    settle: Callable[[Callable], None],
) -> Callable[[tuple, list[Any]], Any]:
    """The call of a signature whose guard was undecided: the prepared plan (`planned`) and the original
    (`unchanged`) taking turns, timed (validate.live_call), where the call runs now (jit.runs_now); else what the
    entry's state says. Once the entry is settled (here, or by another prepare of the same signature) it hands
    `settle` the call it runs from then on, which measures nothing."""

    def measuring(rest: tuple, leaves: list[Any]) -> Any:
        settled = not entry.undecided  # read first: a settled entry's call changes no more
        running = unchanged if entry.running is entry.original else planned
        if settled:
            settle(running)
            return running(rest, leaves)
        if runs_now(leaves):  # not while a trace (an outer transformation, a scan body) stages it
            plan, original = functools.partial(planned, rest, leaves), functools.partial(unchanged, rest, leaves)
            ran, out = validate.live_call(entry, plan, original, calls.live_settled(entry), calls.planner.name)
            if ran:
                return out
        return running(rest, leaves)

    return measuring
