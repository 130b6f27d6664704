"""Memory budgets (optimize(..., memory_budget=N)): XLA's own figure for each new plan's compiled program, and
whether it is over the budget (a gradient's loss is then run as rematerialized segments: eqsat/planning/refusals.py)."""

import warnings
from typing import Any

import jax

from eqsat.backends.memory import figure_of, memory_report
from eqsat.plans.plan_life import Entry, Verdict
from eqsat.support.errors import EqsatWarning


def check_budget(
    entries: list[Entry], compiled: Any, memory_budget: int | None, donate_argnums: tuple[int, ...]
) -> tuple[list[tuple[Entry, Verdict]], int | None]:
    """XLA's figure of the program just compiled (`compiled`, jax's Compiled) as each entry's memory report (a
    verdict with it as a finding, for the dispatcher to apply), and the figure where it is over `memory_budget` (else
    None): a gradient's loss may then be rematerialized (eqsat/planning/refusals.py)."""
    figure = figure_of(compiled)
    found = []
    for entry in entries:
        report = memory_report(entry.plan)
        report.xla = figure
        if memory_budget is not None and jax.default_backend() == "cpu":
            report.applied.append("XLA:CPU memory-optimized scheduler")
        if donate_argnums:
            report.applied.append(f"donated arguments {donate_argnums}")
        found.append((entry, Verdict((), findings=(("memory", report),))))
    over = memory_budget is not None and figure["total"] > memory_budget
    return found, figure["total"] if over else None


def warn_over_budget(name: str, needed: int, memory_budget: int) -> None:
    warnings.warn(
        f"eqsat: {name} needs {needed} bytes by XLA's measure, over the budget of {memory_budget}; for a training "
        "step, eqsat.fit_budget(grad_fn, args, memory_budget, loss=loss) rematerializes segments of the loss",
        EqsatWarning,
        stacklevel=6,
    )
