"""eqsat: an equality-saturation graph superoptimizer for JAX.

fast = eqsat.optimize(f)         # or @eqsat.optimize
y = fast(*args)                  # same result as f(*args), faster where the rules allow
plan = fast.plan(*args)          # the extracted plan for these argument shapes
eqsat.compare(plan_a, plan_b)    # plans side by side
"""

import importlib
from typing import Any

# Names load on first use (PEP 562), so that a lower layer (extract.cost, importing eqsat.ops.table) can be imported on
# its own without pulling in the API above it, whose imports lead back to that layer.
_HOMES = {
    "fit_budget": "eqsat.api",
    "Buckets": "eqsat.plans.buckets",
    "EqsatWarning": "eqsat.support.errors",
    "Optimized": "eqsat.api",
    "optimize": "eqsat.api",
    "CaptureError": "eqsat.support.errors",
    "EqsatError": "eqsat.support.errors",
    "RuleError": "eqsat.support.errors",
    "ShapeConflictError": "eqsat.support.errors",
    "Limits": "eqsat.plans.options",
    "Plan": "eqsat.extract.plan",
    "compare": "eqsat.extract.changes",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'eqsat' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "Buckets",
    "CaptureError",
    "EqsatError",
    "EqsatWarning",
    "Limits",
    "Optimized",
    "Plan",
    "RuleError",
    "ShapeConflictError",
    "compare",
    "fit_budget",
    "optimize",
]
