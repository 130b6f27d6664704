"""eqsat: an equality-saturation graph superoptimizer for JAX.

fast = eqsat.optimize(f)         # or @eqsat.optimize
y = fast(*args)                  # same result as f(*args), faster where the rules allow
plan = fast.plan(*args)          # the extracted plan for these argument shapes
eqsat.compare(plan_a, plan_b)    # plans side by side
"""

from backends.memory import fit_budget
from eqsat.api import EqsatWarning, Optimized, optimize
from eqsat.errors import CaptureError, EqsatError, RuleError, ShapeConflictError
from eqsat.saturate import Limits
from extract.plan import Plan
from extract.report import compare

__all__ = [
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
