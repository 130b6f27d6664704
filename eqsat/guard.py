"""Never slower than jax.jit: a plan chosen on a predicted gain is timed against the original before it is kept.

The cost model predicts; the clock decides, by evidence. After validation, the plan and the original run in
interleaved rounds (eqsat.measure.compare) within Limits.guard_seconds, and after each round a sign test asks
whether the plan was faster (or slower) in more rounds than chance allows on a machine where the two are equal:
on a shared machine one round can be off by 30 %, so a round is one vote, never a measure of the gain. The rounds
stop as soon as the test decides with CONFIDENCE. A plan decided faster is kept; one decided slower is refused,
and the refusal is stored with the plan (a later process runs the original at once). An undecided measurement is
no refusal: a plan the cost model predicts clearly faster (CLEAR_PREDICTION) whose rounds leaned its way keeps
running; otherwise the original runs in this process, and a later process measures again.
"""

import math
import os
from collections.abc import Callable
from typing import Any

from eqsat.measure import compare

# the budget's default; tests set it to 0 (tests/conftest.py), since timing there depends on the machine's load
DEFAULT_SECONDS = float(os.environ.get("EQSAT_GUARD_SECONDS", "0.3"))
CONFIDENCE = 0.99  # one-sided: 7 of 7 rounds, 10 of 11, 12 of 14, ...
CLEAR_PREDICTION = 1.5  # predicted speed-up above which an undecided plan keeps running


def sign_test(faster: int, rounds: int) -> tuple[str, float]:
    """("faster" | "slower" | "undecided", confidence): how sure `faster` rounds of `rounds` make it that the plan
    is faster (or slower) than the original, against a coin toss per round."""
    p_faster, p_slower = _tail(faster, rounds), _tail(rounds - faster, rounds)
    if p_faster <= 1 - CONFIDENCE:
        return "faster", 1 - p_faster
    if p_slower <= 1 - CONFIDENCE:
        return "slower", 1 - p_slower
    return "undecided", 1 - min(p_faster, p_slower)


def _tail(k: int, n: int) -> float:
    """P(at least k heads in n fair tosses)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def _decided(ratios: list[float]) -> bool:
    return sign_test(sum(r > 1 for r in ratios), len(ratios))[0] != "undecided"


def measure(
    original: Callable[[], Any],
    optimized: Callable[[], Any],
    seconds: float,
    warm: bool = False,
    predicted: float = 1.0,
) -> dict[str, Any]:
    """Interleaved rounds of both calls until the sign test decides or about `seconds` pass (three rounds at
    least): what the plan records (Plan.measured) and whether it is kept. `warm`: both have run on these
    arguments (validation ran them), so no call is spent compiling them; otherwise a first call of each does,
    before any round. `predicted`: the cost model's speed-up, which keeps an undecided plan that it calls clear."""
    result = compare(
        original, optimized, (), seconds=seconds, round_seconds=seconds / 40, warm=warm, min_rounds=3, decided=_decided
    )
    decision, confidence = sign_test(result.faster_rounds, result.rounds)
    leaning = result.faster_rounds * 2 > result.rounds
    kept = decision == "faster" or (decision == "undecided" and predicted >= CLEAR_PREDICTION and leaning)
    return {
        "ratio": result.ratio,  # original time / plan time, the median of the rounds
        "ratio_low": result.ratio_low,
        "ratio_high": result.ratio_high,
        "rounds": result.rounds,
        "faster_rounds": result.faster_rounds,
        "decision": decision,
        "confidence": confidence,
        "predicted": predicted,
        "original_s": result.baseline_s,
        "optimized_s": result.candidate_s,
        "kept": kept,
    }


def describe(measured: dict[str, Any]) -> str:
    decision = measured.get("decision", "faster" if measured["kept"] else "slower")
    if decision == "undecided":
        verdict = f"undecided ({measured['confidence']:.0%} confident); " + (
            f"predicted {measured['predicted']:.2f}x: kept"
            if measured["kept"]
            else "the original runs in this process, measured again in the next"
        )
    elif measured["kept"]:
        verdict = f"faster with {measured['confidence']:.0%} confidence: kept"
    else:
        verdict = f"slower with {measured['confidence']:.0%} confidence: the original runs"
    return (
        f"measured {measured['ratio']:.2f}x against the original (IQR {measured['ratio_low']:.2f}-"
        f"{measured['ratio_high']:.2f}; faster in {measured.get('faster_rounds', '?')} of {measured['rounds']} "
        f"interleaved rounds; original {measured['original_s'] * 1e3:.3f} ms, plan "
        f"{measured['optimized_s'] * 1e3:.3f} ms): {verdict}"
    )


def refused_for_good(measured: dict[str, Any]) -> bool:
    """Whether the refusal is evidence enough to store: the plan was measured slower with confidence."""
    return not measured["kept"] and measured.get("decision") == "slower"
