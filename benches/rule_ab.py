"""What one built-in rule is worth on a model: eqsat's plan with the built-in rules against the same rules less that
one, built and timed in one process, interleaved (then the plan against jax.jit).

    python -m benches.rule_ab benches.real_models:keras_efficientnetb0_batch2 --rule pointwise-conv-dot

FACTORY is a zero-argument function returning an eqsat.support.workload.Workload (as `python -m eqsat census` takes).
"""

import argparse
import importlib
from typing import Any

import jax

import eqsat
from eqsat.egraph.rule_sources import builtin_groups, keeping, rule_names
from eqsat.numerics.measure import interleaved
from eqsat.tools.versus import ready


def without_rule(rule: str) -> tuple[str, str]:
    """The group holding `rule`, and that group's text with the rule blanked out."""
    for name, source in builtin_groups().items():
        if rule in rule_names(source):
            return name, keeping([source], lambda names: rule not in names)[0].text
    raise SystemExit(f"no built-in rule is named {rule!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("factory", help="MODULE:FUNCTION, a zero-argument Workload factory")
    parser.add_argument("--rule", required=True, help="a built-in rule's :name")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per comparison (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="comparisons of the two plans (default 2)")
    args = parser.parse_args(argv)
    module, _, function = args.factory.partition(":")
    work = getattr(importlib.import_module(module), function)()
    group, text = without_rule(args.rule)

    def built(**options: Any) -> eqsat.Optimized:
        fast = eqsat.optimize(work.fn, **options)
        ready(fast, work.args)
        return fast

    less, full = built(rules=[text], disabled_rules=[group]), built()
    plan = full.plan(*work.args)
    print(f"{work.name}: {args.rule} ({group}) fired {plan.rules_fired.get(args.rule, 0)} times; the plan is kept: "
          f"{(plan.measured or {}).get('kept')}")  # fmt: skip
    for _ in range(args.rounds):
        c = interleaved(less, full, work.args, args.seconds)
        print(f"  with {args.rule} against without: {c.ratio:.2f}x (IQR {c.ratio_low:.2f}-{c.ratio_high:.2f}, "
              f"{c.rounds} interleaved rounds; {c.candidate_s * 1e3:.3f} ms with it, {c.baseline_s * 1e3:.3f} ms "
              "without)", flush=True)  # fmt: skip
    print(f"  against jax.jit: {interleaved(jax.jit(work.fn), full, work.args, args.seconds)}")


if __name__ == "__main__":
    main()
