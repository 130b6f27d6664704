"""Memory budgets (optimize(..., memory_budget=N)): XLA's own figure for each new plan's compiled program, and
for a gradient over budget its loss run as rematerialized segments (backends.memory.fit_budget)."""

import warnings
from collections.abc import Callable
from typing import Any

import jax

from eqsat.backends.memory import figure_of, fit_budget, memory_report
from eqsat.errors import EqsatWarning
from eqsat.plan_life import Entry, Event, Verdict
from eqsat.planning import Planner


def check_budget(
    planner: Planner, entries: list[Entry], compiled: Any, args: tuple, kwargs: dict[str, Any]
) -> list[tuple[Entry, Verdict]]:
    """Record XLA's figure of the program just compiled (`compiled`, jax's Compiled) in each entry's plan; warn
    where it is over budget, or rematerialize. Returns the entries refitted, each with its verdict."""
    options, fun = planner.options, planner.fun
    figure = figure_of(compiled)
    refitted = []
    for entry in entries:
        entry.plan.memory = memory_report(entry.plan)
        entry.plan.memory.xla = figure
        if options.memory_budget is not None and jax.default_backend() == "cpu":
            entry.plan.memory.applied.append("XLA:CPU memory-optimized scheduler")
        if options.donate_argnums or options.donate_argnames:
            entry.plan.memory.applied.append(f"donated arguments {options.donate_argnums}")
        if options.memory_budget is not None and figure["total"] > options.memory_budget:
            runs = None if kwargs else rematerialize(planner, entry, args)
            if runs is not None:
                refitted.append((entry, Verdict((Event.REFITTED,), runs=runs)))
                continue
            warnings.warn(
                f"eqsat: {getattr(fun, '__name__', 'the function')} needs {figure['total']} bytes by XLA's measure, "
                f"over the budget of {options.memory_budget}; for a training step, "
                "eqsat.fit_budget(grad_fn, args, budget, loss=loss) rematerializes segments of the loss",
                EqsatWarning,
                stacklevel=5,
            )
    return refitted


def rematerialize(planner: Planner, entry: Entry, call_args: tuple) -> Callable[..., list[Any]] | None:
    """For a gradient of a loss (jax.grad keeps the loss as __wrapped__): the program that runs the loss as
    rematerialized segments, where it fits. The loss is planned with the gradient's options."""
    fun, options = planner.fun, planner.options
    loss: Callable[..., Any] | None = getattr(fun, "__wrapped__", None)
    if loss is None or options.static_argnums:
        return None
    loss_plan = Planner(loss, options, {}).plan(call_args)
    fitted, report = fit_budget(fun, call_args, options.memory_budget, loss=loss, loss_plan=loss_plan)
    if not report.fits:
        return None
    tree = jax.tree_util.tree_structure(list(call_args))
    entry.plan.memory.xla = report.achieved
    entry.plan.memory.applied.append(report.mechanism)
    return jax.jit(lambda *flat: jax.tree_util.tree_leaves(fitted(*jax.tree_util.tree_unflatten(tree, flat))))
