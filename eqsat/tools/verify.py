"""Rule verification: every equality a rule adds must hold on concrete values.

check_egraph (eqsat/egraph/check.py) evaluates every e-node of a saturated e-graph on concrete inputs and
compares it with its e-class's value. check_rules does that over random programs (eqsat/tools/generators.py: hypothesis
strategies, one small entry per op or rule pattern) saturated with the rules under test, and counts how often each
rule fired.
Verification is about truth, not profitability: groups a target disables are checked too.
"""

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from eqsat.capture.ir import Graph
from eqsat.capture.jaxpr import capture
from eqsat.egraph.check import Disagreement, check_egraph
from eqsat.egraph.rule_sources import (
    REAL_MARK,
    RuleSource,
    builtin_groups,
    collect,
    keeping,
    real_rules,
    rule_names,
    rules_in,
)
from eqsat.egraph.saturate import Saturation, Snapshot, saturate
from eqsat.support.errors import EqsatError
from eqsat.tools import domain
from eqsat.tools.generators import generators, pattern_programs, programs
from eqsat.tools.program import Program

# Small enough that one program saturates and evaluates in well under a second, large enough that rules
# two or three rewrites away from the captured program get to fire.
VERIFY_LIMITS = Saturation(iterations=4, nodes=800, seconds=2.0)


def check_program(
    prog: Program,
    sources: list[RuleSource],
    seed: int = 0,
    limits: Saturation = VERIFY_LIMITS,
    inputs: Sequence[Any] | None = None,
) -> tuple[list[Disagreement], Snapshot, Graph]:
    """Capture, saturate with `sources` and check every e-class on random normal inputs: with the rules sound in
    floating point alone, within their tight tolerance, then (if some rules are marked real) with every rule,
    within the tolerance of real-number rules. Returns the disagreements and the last saturation.

    `inputs`: these instead (special values, eqsat/tools/special.py), with zeros' signs compared too, all the
    rules at once (the rules sound in floating point get the same check of NaNs, infinities and signs). Where rules
    marked `; @real` fired, an e-node whose value holds an inf or NaN (or is all zero) is left to the overflow
    watch, which runs the original wherever a plan that used them does (backends/lower.py with_overflow_watch); the
    saturation without those rules is then checked in full, since a plan extracted from it is not watched."""
    special = inputs is not None
    inputs = prog.random_inputs(seed) if inputs is None else list(inputs)
    with jax.enable_x64(prog.dtype.endswith("64")):
        graph = capture(jax.make_jaxpr(prog)(*inputs))
    float_sound = _float_sound(tuple(sources))
    found: list[Disagreement] = []
    if not special or float_sound is None:  # special values: NaNs, infinities and signs, which no tolerance moves
        snapshot = saturate(graph, list(float_sound or sources), limits)
        found += check_egraph(graph, snapshot, inputs, real=False, special=special)
    if float_sound is not None:
        snapshot = saturate(graph, sources, limits)
        every = check_egraph(graph, snapshot, inputs, real=True, special=special)
        watched = _real_rules(tuple(sources))
        if special and any(d.out_of_range for d in every) and any(snapshot.rule_matches.get(r) for r in watched):
            unwatched = keeping(sources, lambda names: not set(names) & watched)
            found += check_egraph(graph, saturate(graph, unwatched, limits), inputs, real=True, special=True)
            every = [d for d in every if not d.out_of_range]
        found += every
    return found, snapshot, graph


@functools.lru_cache(maxsize=8)
def _real_rules(sources: tuple[RuleSource, ...]) -> frozenset[str]:
    """The rules marked `; @real`: a plan that fired any runs under the overflow watch."""
    return real_rules(list(sources), (REAL_MARK,))


@dataclass
class RuleStat:
    name: str  # the :name, else egglog's text of the rule; "=>" / "<=" for the two directions of a birewrite
    group: str
    real: bool = False  # marked `; @real`: checked within the tolerance of real-number rules
    fired: int = 0
    unsound: bool = False  # reproduced a disagreement on its own

    @property
    def verdict(self) -> str:
        if self.unsound:
            return "UNSOUND"
        return "ok" if self.fired else "never fired"


@dataclass
class Report:
    rules: list[RuleStat]
    disagreements: list[Disagreement]
    errors: list[str]  # programs whose saturation failed (a rule equating different shapes, ...)
    programs: int
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.disagreements and not self.errors and all(r.fired for r in self.rules)

    def table(self) -> str:
        width = min(60, max((len(r.name) for r in self.rules), default=4))
        group = max((len(r.group) for r in self.rules), default=5)
        lines = [f"{'rule':<{width}}  {'group':<{group}}  {'holds for':<9}  {'fired':>7}  verdict"]
        for r in self.rules:
            name = r.name if len(r.name) <= width else r.name[: width - 3] + "..."
            holds = "reals" if r.real else "floats"
            lines.append(f"{name:<{width}}  {r.group:<{group}}  {holds:<9}  {r.fired:>7}  {r.verdict}")
        lines.append(
            f"{len(self.rules)} rules, {self.programs} programs, {len(self.disagreements)} disagreeing e-classes, "
            f"{self.seconds:.1f} s"
        )
        return "\n".join(lines)


@functools.lru_cache(maxsize=8)
def _float_sound(sources: tuple[RuleSource, ...]) -> tuple[RuleSource, ...] | None:
    """The sources without the rules marked real, or None when none is marked (computed once per rule set)."""
    real = real_rules(list(sources))
    return tuple(keeping(list(sources), lambda names: not set(names) & real)) if real else None


def check_rules(
    sources: list[RuleSource],
    examples: int = 100,
    limits: Saturation = VERIFY_LIMITS,
    max_steps: int = 4,
    leads: Sequence[str] | None = None,
) -> Report:
    """Saturate `examples` random programs with the rules and check every e-class; count each rule's matches.
    Each generator entry (or each of `leads`) leads an equal share of the programs.

    Deterministic (hypothesis derandomized). A disagreement's program is re-saturated with each rule that fired
    alone, and those that reproduce it are marked unsound.
    """
    start = time.perf_counter()
    real = real_rules(sources)
    stats = {name: RuleStat(name, src.name, name in real) for src in sources for name in rule_names(src)}
    found: list[Disagreement] = []
    errors: list[str] = []
    count = 0
    entries = generators()
    unknown = sorted(set(leads or ()) - set(entries))
    if unknown:
        raise ValueError(f"no generator entry {unknown}; the entries are {sorted(entries)}")
    leads = sorted(leads or entries)
    run_settings = settings(
        max_examples=max(1, -(-examples // len(leads))),
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )

    def run(prog: Program, seed: int) -> None:
        nonlocal count
        count += 1
        try:
            bad, snapshot, _ = check_program(prog, sources, seed, limits)
        except EqsatError as error:
            errors.append(f"{error}\n  program: {prog!r}".replace("\n", "\n  "))
            return
        for rule, matches in snapshot.rule_matches.items():
            stats.setdefault(rule, RuleStat(rule, "?")).fired += matches
        if bad:
            suspects = tuple(_reproducing(prog, sources, seed, limits, bad[0].rules))
            for name in suspects:
                stats[name].unsound = True
            found.extend(Disagreement(**{**d.__dict__, "program": repr(prog), "suspects": suspects}) for d in bad)

    # each generator entry leads its share of the programs, so every op and rule pattern is exercised
    for lead in leads:
        run_settings(given(programs(max_steps=max_steps, lead=lead), st.integers(0, 2**31 - 1))(run))()
    # the user's rules, and any rule no generator reached, also run on programs built from their own patterns
    builtin = set(builtin_groups())
    for src in sources:
        for rule in rules_in(src):
            if src.name not in builtin or not any(stats[name].fired for name in rule.names):
                for seed, prog in enumerate(pattern_programs(rule.command)):
                    run(prog, seed)
    return Report(list(stats.values()), found, errors, count, time.perf_counter() - start)


def _reproducing(
    prog: Program, sources: list[RuleSource], seed: int, limits: Saturation, fired: tuple[str, ...]
) -> list[str]:
    """The rules among `fired` that make the program disagree on their own."""
    culprits = []
    for rule in fired:
        alone = keeping(sources, lambda names, rule=rule: rule in names)
        try:
            if check_program(prog, alone, seed, limits)[0]:
                culprits.append(rule)
        except EqsatError:
            continue
    return culprits


def run_check(files: Sequence[str], examples: int = 100, leads: Sequence[str] | None = None) -> int:
    """`python -m eqsat rules check [FILE...]`: the built-in groups plus the files; 0 when every rule fired, no
    e-class disagreed and every elementwise @rounding rule is as accurate as the original in every binade of its
    function's domain (eqsat/tools/domain.py), 1 otherwise."""
    sources = collect(list(files))
    report = check_rules(sources, examples, leads=leads)
    print(report.table())
    # each elementwise @rounding rule over its function's whole domain, beside the original's own error
    rows = domain.rounding_rows(sources)
    print(f"\n@rounding rules over their functions' domains (relative error against float64):\n{domain.table(rows)}")
    for d in report.disagreements:
        print()
        print(d.describe())
    for error in report.errors:
        print(f"\nsaturation failed: {error}")
    silent = [r.name for r in report.rules if not r.fired]
    if silent:
        print(
            f"\nnever fired on {report.programs} programs (neither a generator nor its own pattern, built from the "
            f"op table, produced its left-hand side): {silent}"
        )
    return 0 if report.ok and all(row.beyond is None for row in rows) else 1
