"""jax.jit's side of a dispatch: the jax.jit object whose traces inline each signature's entry
(eqsat/dispatch/dispatcher.py decides what they inline), with the source exclusions and trace checks that keep it
jax.jit's to the user."""

import copy
import functools
import os
import weakref
from collections.abc import Callable
from typing import Any

import jax
from jax._src import (
    config,
    source_info_util,  # register_exclusion: jax names the user's line, not eqsat's
)
from jax._src import core as jax_core  # the trace a body runs under, to tell a call on values from an outer trace

import eqsat.backends
import eqsat.extract
from eqsat.plans.plan_cache import SharedPlans
from eqsat.plans.signature import concrete


class JitDispatch:
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
        self.ran: dict[Any, str] = {}  # signature -> the program its trace inlined (EQSAT_CHECK_LOCKSTEP)
        ref, dispatch = self.body, weakref.ref(self)  # weakly, as the body: no cycle through the jax.jit
        body = functools.wraps(self.fun, updated=())(lambda *args, **kwargs: ref()(dispatch(), *args, **kwargs))
        self.run = jax.jit(body, **self.jit_options)

    def fresh(self) -> "JitDispatch":
        new = copy.copy(self)
        new.reset()
        return new


# a cache miss's explanation (jax_explain_cache_misses) and a traced equation's source name the user's line
for _package in (eqsat, eqsat.backends, eqsat.extract):
    source_info_util.register_exclusion(os.path.join(os.path.dirname(_package.__file__), ""))


def unexplained(method: Callable[..., Any]) -> Callable[..., Any]:
    """eqsat's own traces (capturing, planning, validating, timing, compiling a plan) explain no cache miss: with
    jax_explain_cache_misses on, a call explains its own trace, once, as jax.jit's call does."""

    @functools.wraps(method)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with config.explain_cache_misses(False):
            return method(*args, **kwargs)

    return quiet


_JITTED = type(jax.jit(lambda: None))


def inlined(call: Callable[..., Any]) -> Callable[..., Any]:
    """What a jax.jit of ours wraps, for the dispatch's trace to hold the program itself: a jax.jit nested in it
    kept a trace and a lowering of its own per signature (a 6-layer MLP at 180 batch sizes: +7 MB)."""
    return call.__wrapped__ if isinstance(call, _JITTED) else call


def called_eagerly() -> bool:
    """Whether the trace running now is jax.jit's of a call on values (not under an outer transformation)."""
    return isinstance(getattr(jax_core.trace_ctx.trace, "parent_trace", None), jax_core.EvalTrace)


def runs_now(leaves: list[Any]) -> bool:
    """Whether a call on these leaves runs at once, as jax.jit runs it: values, under no trace. A scan body that
    closes over arrays calls on values, yet jax.jit stages that call into the body, where XLA may compute it
    otherwise (a dilated conv's holes times an inf weight: NaN at the top level, skipped in a loop body)."""
    return concrete(leaves) and isinstance(jax_core.trace_ctx.trace, jax_core.EvalTrace)
