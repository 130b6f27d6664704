"""Never slower than jax.jit: a plan chosen on a predicted gain is timed against the original before it is kept.

The cost model predicts; the clock decides, by evidence. After validation, the plan and the original run in
interleaved rounds (eqsat.numerics.measure.interleaved) within Limits.guard_seconds, and after each round a sign test
asks whether the plan was faster (or slower) in more rounds than chance allows on a machine where the two are equal:
on a shared machine one round can be off by 30 %, so a round is one vote, never a measure of the gain. A gain
beyond that noise (CLEAR_RATIO, every round the same way) also counts by its size: a t-test on the rounds' log
ratios decides it, so a model 5x faster in three rounds of half a second each is decided on its first call
instead of by live calls. The rounds stop as soon as either test decides with CONFIDENCE. A plan decided faster is
kept; one decided slower is refused, and the refusal is stored with the plan (a later process runs the original at
once).

An undecided measurement (a program of 0.5 s fits three rounds in the budget) is no refusal: the live calls go on
measuring. Meanwhile a plan the cost model predicts clearly faster (CLEAR_PREDICTION) whose rounds leaned its way
is what the calls trace (under an outer transformation, say), otherwise the original is; the calls themselves run
one program each, timed, alternating, so that two calls make one more round of the same test and no call costs
more than the slower program. The rounds go on until the test decides, the two are even (EVEN_ROUNDS rounds whose
middle half lie within EVEN_RATIO of each other) or LIVE_ROUNDS rounds have run; then the median decides, and no
refusal is stored.
"""

import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax

from eqsat.numerics.measure import Comparison, interleaved

# the budget's default; tests set it to 0 (tests/conftest.py), since timing there depends on the machine's load
DEFAULT_SECONDS = float(os.environ.get("EQSAT_GUARD_SECONDS", "0.3"))
CONFIDENCE = 0.99  # one-sided: 7 of 7 rounds, 10 of 11, 12 of 14, ...
CLEAR_PREDICTION = 1.5  # predicted speed-up above which an undecided plan keeps running
LIVE_ROUNDS = 40  # rounds after which an undecided measurement settles on its median
EVEN_ROUNDS, EVEN_RATIO = 10, 1.1  # rounds whose interquartile ratios lie within 1/1.1-1.1 settle sooner: even
CLEAR_RATIO = 1.3  # a geometric-mean ratio beyond one round's noise: the size test may decide it (or its inverse)


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


def size_test(ratios: list[float]) -> tuple[str, float]:
    """("faster" | "slower" | "undecided", confidence) from the rounds' sizes: where every round of three or more
    went one way and their geometric mean is beyond CLEAR_RATIO, a one-sided t-test on the log ratios (zero mean:
    the two equal)."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / max(n, 1)
    one_way = all(x > 0 for x in logs) or all(x < 0 for x in logs)
    if n < 3 or not one_way or abs(mean) < math.log(CLEAR_RATIO):
        return "undecided", 0.0
    spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    p = 0.0 if spread == 0 else student_sf(abs(mean) / (spread / math.sqrt(n)), n - 1)
    return ("faster" if mean > 0 else "slower", 1 - p) if p <= 1 - CONFIDENCE else ("undecided", 1 - p)


def student_sf(t: float, dof: int) -> float:
    """P(T > t) for Student's t with an integer number of degrees of freedom, t >= 0, in closed form (Abramowitz
    and Stegun 26.7.3-4; importing scipy.stats for it cost 0.4-0.8 s of a plan's first call)."""
    theta = math.atan(t / math.sqrt(dof))
    cos2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    for k in range(1 + dof % 2, dof - 1, 2):  # the series in cos^2: odd dof from 2/3, even from 1/2
        term *= cos2 * k / (k + 1)
        total += term
    if dof % 2:
        inside = 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if dof > 1 else 0.0))
    else:
        inside = math.sin(theta) * total
    return (1 - inside) / 2


def decide(ratios: list[float]) -> tuple[str, float, str]:
    """(decision, confidence, which test decided: "sign" or "size") for rounds of original / plan time ratios."""
    decision, confidence = sign_test(sum(r > 1 for r in ratios), len(ratios))
    if decision == "undecided":
        by_size, sure = size_test(ratios)
        if by_size != "undecided":
            return by_size, sure, "size"
    return decision, confidence, "sign"


def _decided(ratios: list[float]) -> bool:
    return decide(ratios)[0] != "undecided"


def measure(
    original: Callable[[], Any],
    optimized: Callable[[], Any],
    guard_seconds: float,
    warm: bool = False,
    predicted: float = 1.0,
    across: Callable[[list[float], bool], tuple[list[float], bool]] | None = None,
) -> dict[str, Any]:
    """Interleaved rounds of both calls until the sign test decides or about `guard_seconds` pass (three rounds at
    least): what the plan records (Plan.measured) and whether it is kept. `warm`: both have run on these
    arguments (validation ran them), so no call is spent compiling them; otherwise a first call of each does,
    before any round. `predicted`: the cost model's speed-up, which keeps an undecided plan that it calls clear.
    `across`: each round as every process measured it (eqsat/support/processes.py); then no live calls measure on (they
    would in one process's calls only): an undecided measurement settles on its median at once."""
    result = interleaved(
        original,
        optimized,
        (),
        seconds=guard_seconds,
        round_seconds=guard_seconds / 40,
        warm=warm,
        min_rounds=3,
        decided=_decided,
        across=across,
    )
    rounds = list(zip(result.baseline_times, result.candidate_times, strict=True))
    return _judged(rounds, predicted, source="first call", live=across is None)


def live_timed(program: Callable[[], Any], plan: bool) -> tuple[Any, float]:
    """A live call of one program (the plan's, or the original's: `plan`), blocked: its results and seconds."""
    start = time.perf_counter()
    out = jax.block_until_ready(program())
    return out, time.perf_counter() - start


def live_first(measured: dict[str, Any]) -> bool:
    """Whether the plan runs first in the next live round (the order alternates between rounds)."""
    return measured["rounds"] % 2 == 0


def with_round(measured: dict[str, Any], seconds: tuple[float, float]) -> dict[str, Any]:
    """The measurement with one more round from a live call: (original, plan) seconds."""
    return _judged([*map(tuple, measured["rounds_s"]), seconds], measured["predicted"], source="live calls")


def _judged(rounds: list[tuple[float, float]], predicted: float, source: str, live: bool = True) -> dict[str, Any]:
    """What (original, plan) seconds per round say: the sign test's decision, whether the plan runs (`kept`) and
    whether live calls go on measuring (`live`). Past LIVE_ROUNDS undecided rounds (or at once, where no live
    calls may measure) the median decides (`settled`), storing no refusal."""
    original, plan = [o for o, _ in rounds], [p for _, p in rounds]
    ratios = [o / max(p, 1e-12) for o, p in rounds]
    result = Comparison.of(original, plan, ratios)
    decision, confidence, test = decide(ratios)
    even = result.rounds >= EVEN_ROUNDS and 1 / EVEN_RATIO <= result.ratio_low <= result.ratio_high <= EVEN_RATIO
    settled = decision == "undecided" and (result.rounds >= LIVE_ROUNDS or not live or even)
    if decision != "undecided":
        kept = decision == "faster"
    elif settled:
        kept = result.ratio >= 1
    else:  # meanwhile: the plan where the model calls it clear and the rounds lean its way
        kept = predicted >= CLEAR_PREDICTION and result.faster_rounds * 2 > result.rounds
    return {
        "ratio": result.ratio,  # original time / plan time, the median of the rounds
        "ratio_low": result.ratio_low,
        "ratio_high": result.ratio_high,
        "rounds": result.rounds,
        "faster_rounds": result.faster_rounds,
        "decision": decision,
        "confidence": confidence,
        "test": test,  # "sign": more rounds one way than chance allows; "size": every round, by more than noise
        "predicted": predicted,
        "original_s": result.baseline_s,
        "optimized_s": result.candidate_s,
        "kept": kept,
        "live": decision == "undecided" and not settled,  # live calls go on measuring
        "source": source,  # where the last round came from: the first call's measurement, or live calls
        "rounds_s": [[float(f"{o:.4g}"), float(f"{p:.4g}")] for o, p in rounds],
    }


def _percent(confidence: float) -> str:
    """A confidence as people read it: never "100%" (a t-test's tiny p rounds to it)."""
    return ">99.9%" if confidence > 0.999 else f"{confidence:.0%}"


def describe(measured: dict[str, Any]) -> str:
    """The measurement and the decision in a sentence (Plan.measured; the plan's fallback where the original runs)."""
    decision = measured.get("decision", "faster" if measured["kept"] else "slower")
    runs = "the plan runs" if measured["kept"] else "the original runs"
    if measured.get("live"):
        verdict = (
            f"undecided ({_percent(measured['confidence'])} confident): live calls run the plan and the original in "
            f"turn until the test decides ({runs} where a call cannot be timed"
            + (f", predicted {measured['predicted']:.2f}x)" if measured["kept"] else ")")
        )
    elif decision == "undecided":
        verdict = f"undecided after {measured['rounds']} rounds: the median decides, {runs} (no refusal stored)"
    else:
        how = " (every round, beyond noise)" if measured.get("test") == "size" else ""
        verdict = (
            f"faster with {_percent(measured['confidence'])} confidence{how}: kept"
            if measured["kept"]
            else f"slower with {_percent(measured['confidence'])} confidence{how}: the original runs"
        )
    source = " (the last on live calls)" if measured.get("source") == "live calls" else ""
    return (
        f"measured {measured['ratio']:.2f}x against the original (IQR {measured['ratio_low']:.2f}-"
        f"{measured['ratio_high']:.2f}; faster in {measured.get('faster_rounds', '?')} of {measured['rounds']} "
        f"interleaved rounds{source}; original {measured['original_s'] * 1e3:.3f} ms, plan "
        f"{measured['optimized_s'] * 1e3:.3f} ms): {verdict}"
    )


def refused_for_good(measured: dict[str, Any]) -> bool:
    """Whether the refusal is evidence enough to store: the plan was measured slower with confidence."""
    return not measured["kept"] and measured.get("decision") == "slower"
