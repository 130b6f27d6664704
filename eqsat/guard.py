"""Never slower than jax.jit: a plan chosen on a predicted gain is timed against the original before it is kept.

The cost model predicts; the clock decides. After validation, the plan and the original run in interleaved rounds
(eqsat.measure.compare) within Limits.guard_seconds, and the plan is kept only where three rounds in four were
faster (the lower quartile of the per-round ratios above 1): on a shared machine one round can be off by 30 %, and
a plan no faster than the original beyond that noise is no reason to run a program other than jax.jit's. A model
whose calls outlast the budget is timed in three rounds, each of which must be faster: five of NASNet-A's 0.9 s
rounds were most of its first call.
"""

import os
from collections.abc import Callable
from typing import Any

from eqsat.measure import compare

# the budget's default; tests set it to 0 (tests/conftest.py), since timing there depends on the machine's load
DEFAULT_SECONDS = float(os.environ.get("EQSAT_GUARD_SECONDS", "0.3"))


def measure(
    original: Callable[[], Any], optimized: Callable[[], Any], seconds: float, warm: bool = False
) -> dict[str, Any]:
    """Interleaved rounds of both calls within about `seconds` (three rounds each at least): what the plan records
    (Plan.measured) and whether it is kept. `warm`: both have run on these arguments (validation ran them), so
    no call is spent compiling them; otherwise a first call of each does, before any round."""
    result = compare(original, optimized, (), seconds=seconds, round_seconds=seconds / 40, warm=warm, min_rounds=3)
    return {
        "ratio": result.ratio,  # original time / plan time, the median of the rounds
        "ratio_low": result.ratio_low,
        "ratio_high": result.ratio_high,
        "rounds": result.rounds,
        "original_s": result.baseline_s,
        "optimized_s": result.candidate_s,
        "kept": result.ratio_low > 1.0,
    }


def describe(measured: dict[str, Any]) -> str:
    verdict = "kept" if measured["kept"] else "not faster beyond noise: the original runs"
    return (
        f"measured {measured['ratio']:.2f}x against the original (IQR {measured['ratio_low']:.2f}-"
        f"{measured['ratio_high']:.2f}, {measured['rounds']} interleaved rounds; original "
        f"{measured['original_s'] * 1e3:.3f} ms, plan {measured['optimized_s'] * 1e3:.3f} ms): {verdict}"
    )
