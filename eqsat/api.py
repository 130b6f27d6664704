"""The public API: optimize() wraps a function like jax.jit; each input signature gets its own plan.

Optimized is jax.jit's surface (call, `lower`, `trace`, `eval_shape`, `clear_cache`, methods, export) over the
calls' side, eqsat/dispatch/dispatcher.py: a call that owes nothing is jax.jit's call of the plan (or of the original)
and nothing else; one that may owe work (a plan to validate, a plan built in the background to switch to) goes there.
"""

import functools
import inspect
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import jax

from eqsat.backends import memory
from eqsat.backends.memory import BudgetReport, MemoryReport, memory_report
from eqsat.dispatch.dispatcher import Dispatcher
from eqsat.dispatch.prepare import prepare
from eqsat.extract.plan import Plan
from eqsat.plans.buckets import Buckets, PaddedCall, Padding
from eqsat.plans.options import OPTIONS, Limits, Options, ResolvedOptions, options_help, resolve

if TYPE_CHECKING:
    from eqsat.census.census import Census


class Optimized:
    """The callable optimize() returns: call it like the original (or like jax.jit(original): `.lower`, `.trace`,
    `.clear_cache`, jax.export); `.plan(*args)` shows what runs. With buckets every method takes the call as its
    bucket pads it (eqsat/plans/buckets.py), and a call's results are sliced back."""

    def __init__(self, fun: Callable[..., Any], options: ResolvedOptions) -> None:
        self.fun, self.options = fun, options
        self._calls = Dispatcher(fun, options)
        self._padding = None if options.buckets is None else Padding(fun, options)
        # fun's name, doc, __wrapped__ and attributes, as jax.jit copies them, but never over our own state (fun
        # may carry a wrapped Optimized's, as jax.grad(optimize(f)) does)
        functools.update_wrapper(self, fun, updated=())
        vars(self).update({k: v for k, v in getattr(fun, "__dict__", {}).items() if k not in vars(self)})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        padded = None if self._padding is None else self._padding.padded(args, kwargs)
        if padded is None:
            return self._call(args, kwargs)
        return padded.cut(self._call(padded.args, padded.kwargs))

    def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        calls = self._calls
        epoch = calls.plans.epoch
        if calls.quiet != epoch:  # something may be owed: a plan to validate, a landing, a trace
            return calls.call(args, kwargs)
        try:
            out = calls.dispatch.run(*args, **kwargs)  # jax.jit's call, and nothing else while nothing moved
        except BaseException:
            calls.hand_over(args, kwargs, None)
            raise
        if calls.plans.epoch == epoch:
            return out
        calls.hand_over(args, kwargs, out)
        return calls.finish(args, kwargs, out, raced=True)  # it may have run a plan another thread just built

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """A method decorator, as jax.jit is: the instance becomes the first argument."""
        return self if obj is None else types.MethodType(self, obj)

    def trace(self, *args: Any, **kwargs: Any) -> jax.stages.Traced:
        """jax.jit's ahead-of-time trace of the optimized program (arguments may be jax.ShapeDtypeStructs)."""
        args, kwargs, _ = self._padded(args, kwargs)
        return self._calls.checked(lambda run: run.trace(*args, **kwargs), args, kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """jax.jit's lowering of the optimized program: `.as_text()`, `.compile()`, `.cost_analysis()`."""
        args, kwargs, _ = self._padded(args, kwargs)
        return self._calls.checked(lambda run: run.lower(*args, **kwargs), args, kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """jax.jit's eval_shape: the results' shapes and dtypes, as jax.ShapeDtypeStructs."""
        args, kwargs, padded = self._padded(args, kwargs)
        shapes = self._calls.checked(lambda run: run.eval_shape(*args, **kwargs), args, kwargs)
        return shapes if padded is None else padded.cut(shapes)

    def clear_cache(self) -> None:
        """Forget every plan (of this function and settings, however often wrapped) and trace, as jax.jit's
        clear_cache does."""
        self._calls.clear()
        if self._padding is not None:
            self._padding.clear()

    def cache_info(self) -> dict[str, int]:
        """How many plans the signature cache holds now, how many it keeps at most (cache_size), and how many of
        them are being built in the background (running the original meanwhile)."""
        return self._calls.info()

    def prepare(self, *params: Any) -> Callable[..., Any]:
        """A function of the remaining arguments, the parameters (params_argnums, in order) bound.

        It computes the parameter-only part of each plan once, as an inference engine does when it builds.
        """
        run = prepare(self._calls, params)
        return run if self._padding is None else functools.partial(self._padded_prepared, run, params)

    def plan(self, *args: Any, prepared: bool | None = None, **kwargs: Any) -> Plan:
        """The plan for arguments of these shapes and dtypes (built if needed).

        With parameters declared it is the plan `prepare` runs, unless prepared=False: then the plan a direct
        call runs, which prices parameter-only work as the per-call work it is."""
        args, kwargs, _ = self._padded(args, kwargs)
        _, signature = self._calls.signature(args, kwargs)
        return self._calls.entry(signature, bool(self.options.params_argnums) if prepared is None else prepared).plan

    def census(self, *args: Any, measure_seconds: float | None = None, seconds: float = 1.0) -> "Census":
        """The kernel census at these arguments (eqsat/census/census.py): every kernel of the program timed alone
        against its roofline, the alternatives the plan chose, the program end to end; prints as a table, saves as JSON.
        `measure_seconds`: measuring new kernels at most (default Limits.measure_seconds); `seconds`: timing the
        program end to end (0: not timed)."""
        from eqsat.census.census import census_of  # imported where it is used: planning and calls never load it

        args, _, _ = self._padded(args, {})
        return census_of(self, args, self._calls.programs, measure_seconds, seconds)

    def memory(self, *args: Any, **kwargs: Any) -> MemoryReport:
        """Memory of the plan for these arguments: liveness, best-fit arena, lower bound, a memory-aware order
        (our model) and XLA's own figure of the compiled program; also kept in the plan's summary."""
        args, kwargs, _ = self._padded(args, kwargs)
        flat, signature = self._calls.signature(args, kwargs)
        entry = self._calls.entry(signature)
        entry.plan.memory = memory_report(entry.plan, entry.running, flat)
        return entry.plan.memory

    def _padded(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any], PaddedCall | None]:
        """The arguments as the call's bucket pads them (as they are without buckets, or where it runs unpadded)."""
        padded = None if self._padding is None else self._padding.padded(args, kwargs)
        return (args, kwargs, None) if padded is None else (padded.args, padded.kwargs, padded)

    def _padded_prepared(self, run: Callable[..., Any], params: tuple, *rest: Any, **kwargs: Any) -> Any:
        """A prepared call padded to its bucket: the bucket's argument numbers count the parameters too."""
        n = len(rest) + len(params)
        placed = sorted(zip((i % n for i in self.options.params_argnums), params, strict=True), key=lambda p: p[0])
        at = {i for i, _ in placed}
        full = list(rest)
        for i, param in placed:
            full.insert(i, param)
        padded = self._padding.padded(tuple(full), kwargs)
        if padded is None:
            return run(*rest, **kwargs)
        others = [a for i, a in enumerate(padded.args) if i not in at]
        return padded.cut(run(*others, **padded.kwargs))


# optimize's two forms, each typed: optimize(f, ...) is an Optimized, optimize(...) a decorator that makes one. The
# keywords are Options' fields, written out for IDEs and help(); tests/test_options_once.py holds the three
# signatures to the fields (names, defaults, annotations).
@overload
def optimize(
    fun: Callable[..., Any],
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
) -> Optimized: ...


@overload
def optimize(
    fun: None = None,
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
) -> Callable[[Callable[..., Any]], Optimized]: ...


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
) -> Optimized | Callable[[Callable[..., Any]], Optimized]:
    """Optimize a JAX function by equality saturation; use as `optimize(f, ...)` or `@optimize(...)`.

    The options, each with its type, default and one-line doc, are declared once in `eqsat.plans.options.Options`; the
    user guide's page "optimize and its options" (docs/guide/optimize.md) tables them, and help(eqsat.optimize)
    lists them below.
    """
    given = locals()  # the keywords, under the names Options' fields share with this signature
    options = Options(**{name: given[name] for name in OPTIONS})
    if fun is None:
        return functools.partial(_optimized, options=options)
    return _optimized(fun, options)


optimize.__doc__ = (optimize.__doc__ or "") + options_help()  # none under python -OO


def _optimized(fun: Callable[..., Any], options: Options) -> Optimized:
    _check_function(fun)
    return Optimized(fun, resolve(fun, options))


def _check_function(fun: Any) -> None:
    """TypeError unless fun is a function optimize can trace, as jax.jit's."""
    if isinstance(fun, staticmethod):
        raise TypeError(f"staticmethod arguments are not supported by eqsat.optimize (nor by jax.jit): {fun!r:.80}")
    if not callable(fun):
        raise TypeError(
            f"Expected a callable value, got {fun!r:.80}: eqsat.optimize expects a callable (a function of JAX arrays)"
        )
    if inspect.isgeneratorfunction(fun):
        raise TypeError(f"Expected a function, got a generator function: {fun!r:.80}")


def fit_budget(
    fn: Callable[..., Any],
    args: Sequence[Any],
    memory_budget: int,
    *,
    loss: Callable[..., Any] | None = None,
    **tried: Any,
) -> tuple[Callable[..., Any], BudgetReport]:
    """A jitted function computing fn that fits memory_budget by XLA's measure where one was found, and the report:
    backends.memory.fit_budget (`tried`: its other keywords), with the segments of a given loss taken from eqsat's
    plan of it."""
    if loss is not None and tried.get("loss_plan") is None:
        tried["loss_plan"] = optimize(loss).plan(*args)
    return memory.fit_budget(fn, args, memory_budget, loss=loss, **tried)
