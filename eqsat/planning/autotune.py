"""Auto-tuning: measure the best distinct candidate plans and the original on this device, keep the fastest.

Candidates: the plan, and plans extracted with each kind of rewritten op forbidden, and with all of them.
"""

from collections.abc import Callable
from typing import Any

import jax

from eqsat.backends.lower import with_parameter_only_values
from eqsat.extract.plan import Plan
from eqsat.numerics.measure import median_time


def autotune(
    best: Plan,
    extract: Callable[[frozenset[str]], Plan],
    flat: list[Any],
    original: Callable[..., Any],
    candidates: int,
    seconds: float = 0.3,
) -> Plan:
    """The fastest of `candidates` plans (by predicted time) and the original, measured on flat; `extract(forbid)`
    extracts the same e-graph with those ops forbidden rewritten. The chosen plan records every measurement."""
    rewritten = frozenset(best.rewritten_ops())
    bans = [frozenset({op}) for op in sorted(rewritten)] + ([rewritten] if len(rewritten) > 1 else [])
    found = {_shape_of(best): ("extracted plan", best)}
    for ban in bans:
        found.setdefault(_shape_of(plan := extract(ban)), (f"without new {'/'.join(sorted(ban))}", plan))
    ranked = sorted(found.values(), key=lambda c: c[1].predicted.seconds)[:candidates]
    rows = [("original (jax.jit)", None, best.original.seconds, median_time(original, flat, seconds))]
    for label, plan in ranked:
        body, once = with_parameter_only_values(plan, flat)  # once: the parameter-only values
        rows.append((label, plan, plan.predicted.seconds, median_time(jax.jit(body), (*flat, *once), seconds)))
    label, chosen, _, _ = min(rows, key=lambda r: r[3])
    chosen = chosen or best
    chosen.autotune = [
        {"label": lab, "predicted_s": pred, "measured_s": meas, "chosen": lab == label} for lab, _, pred, meas in rows
    ]
    if label.startswith("original"):
        chosen.fallback = "auto-tuning measured the original program fastest"
    return chosen


def _shape_of(plan: Plan) -> tuple:
    """What tells two candidate plans apart: their nodes, without costs."""
    return tuple((n.op, n.inputs, n.attrs) for n in plan.nodes)
