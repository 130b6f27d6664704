"""Timing on shared, noisy machines: two functions measured interleaved in one process, reported as a ratio."""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax


@dataclass(frozen=True)
class Comparison:
    baseline_s: float  # median seconds per call
    candidate_s: float
    ratio: float  # median of per-round baseline/candidate: > 1 means the candidate is faster
    ratio_low: float  # 25th percentile of the per-round ratios
    ratio_high: float  # 75th percentile
    rounds: int
    faster_rounds: int  # rounds in which the candidate was faster
    baseline_times: tuple[float, ...] = ()  # seconds per call in each round
    candidate_times: tuple[float, ...] = ()

    @classmethod
    def of(cls, base: list[float], cand: list[float], ratios: list[float]) -> "Comparison":
        """The comparison of rounds timed in pairs (seconds per call of each, and baseline/candidate ratios)."""
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        faster = sum(r > 1 for r in ratios)
        median = statistics.median
        medians = median(base), median(cand), median(ratios)
        return cls(*medians, quartiles[0], quartiles[2], len(ratios), faster, tuple(base), tuple(cand))

    def __str__(self) -> str:
        return (
            f"{self.ratio:.2f}x (IQR {self.ratio_low:.2f}-{self.ratio_high:.2f}, {self.rounds} interleaved rounds; "
            f"jax.jit {self.baseline_s * 1e3:.3f} ms, eqsat {self.candidate_s * 1e3:.3f} ms)"
        )


def _time_once(fn: Callable[..., Any], args: tuple, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / repeat


def median_time(
    fn: Callable[..., Any],
    args: tuple,
    seconds: float = 0.5,
    min_rounds: int = 5,
    round_seconds: float = 0.02,
    warm: tuple[int, float] = (1, 0.0),
) -> float:
    """Median seconds per call of one (already jitted) function, in rounds of at least `round_seconds` each, after
    `warm` = (n, s): n calls (fewer where they take s seconds first) beside the one that compiles."""
    jax.block_until_ready(fn(*args))  # compiles
    warm_calls, warm_seconds = warm
    calls = [_time_once(fn, args, 1)]
    while len(calls) < warm_calls and sum(calls) < warm_seconds:
        calls.append(_time_once(fn, args, 1))
    repeat = max(1, int(round_seconds / max(calls[-1], 1e-6)))
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < min_rounds:
        times.append(_time_once(fn, args, repeat))
    return statistics.median(times)


def interleaved(
    baseline: Callable[..., Any],
    candidate: Callable[..., Any],
    args: tuple,
    seconds: float = 2.0,
    round_seconds: float = 0.02,
    warm: bool = False,
    min_rounds: int = 5,
    decided: Callable[[list[float]], bool] | None = None,
    across: Callable[[list[float], bool], tuple[list[float], bool]] | None = None,
) -> Comparison:
    """Interleave baseline and candidate rounds (order alternating) until `seconds` have passed, each round of at
    least `round_seconds` (20 ms keeps the timer's noise small) and at least `min_rounds`. `warm`: both have run
    on these arguments already, so no call is spent compiling them; a probe of one call each is the first round
    where one call fills a round (a model of 0.6 s a call measured in 5 rounds, not 7). `decided(ratios)`: stop
    as soon as it holds (min_rounds still run), a sequential test's stopping rule. `across(seconds, stop)`: the
    seconds and the wish to stop as every process of a multi-host job has them (eqsat/support/processes.py), so that
    each process runs the same rounds."""
    if not warm:
        jax.block_until_ready(baseline(*args))
        jax.block_until_ready(candidate(*args))
    deadline = time.perf_counter() + seconds  # the probes' round counts
    probes = [_time_once(baseline, args, 1), _time_once(candidate, args, 1)]
    if across is not None:
        probes, _ = across(probes, False)
    repeat = max(1, int(round_seconds / max(*probes, 1e-6)))
    base, cand, ratios = [], [], []
    if repeat == 1:
        base.append(probes[0])
        cand.append(probes[1])
        ratios.append(probes[0] / max(probes[1], 1e-9))
    stop = False
    while True:
        stop = stop if across is not None else time.perf_counter() >= deadline
        if len(ratios) >= min_rounds and (stop or (decided is not None and decided(ratios))):
            break
        pair = [(baseline, base), (candidate, cand)]
        for fn, sink in pair if len(ratios) % 2 == 0 else reversed(pair):
            sink.append(_time_once(fn, args, repeat))
        if across is not None:
            (base[-1], cand[-1]), stop = across([base[-1], cand[-1]], time.perf_counter() >= deadline)
        ratios.append(base[-1] / cand[-1])
    return Comparison.of(base, cand, ratios)
