"""Command line: `python -m eqsat demo` optimizes the bundled examples and prints plans and measured speed-ups."""

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from eqsat.support.progress import configure_logging, live_progress
from eqsat.tools.cli import (
    UsageError,
    add_common_flags,
    add_optimize_command,
    add_options,
    add_tpu_check_command,
    number,
    reporting,
    target_profile,
)
from eqsat.tools.cli_measure import add_census_command, add_tune_command


def demo(args: argparse.Namespace) -> int:
    from eqsat.tools.examples import EXAMPLES
    from eqsat.tools.versus import against_jit

    names = args.model or list(EXAMPLES)
    for name in names:
        if name not in EXAMPLES:
            raise UsageError(f"unknown example {name!r}; choose from {', '.join(sorted(EXAMPLES))}")
        work = EXAMPLES[name](args.scale)
        prepared = " (parameters declared and prepared)" if work.params_argnums else ""
        print(f"== {work.name}: {work.note}{prepared}")
        with live_progress(None if args.progress else False):
            timing, fast = against_jit(work, args.target, prepared=True, seconds=args.seconds)
        print(fast.plan(*work.args).summary())
        print(f"  measured         {timing}")
        print(f"  (the ratio is jax.jit time / eqsat time, same process, interleaved; target {args.target})\n")
    return 0


def compare_plans(args: argparse.Namespace) -> int:
    from eqsat.census.census import is_census
    from eqsat.extract.changes import compare
    from eqsat.plans.plan_json import PlanFormatError, load_plan

    censuses = [path for path in args.plans if is_census(path)]
    paths = [path for path in args.plans if path not in censuses]
    if censuses:
        status = compare_censuses(censuses)
        if status or not paths:
            return status
    try:
        plans = [load_plan(path) for path in paths]
    except (OSError, PlanFormatError) as error:  # a missing or malformed file: one line, not a traceback
        reason = f"{error.filename}: {error.strerror}" if isinstance(error, OSError) else str(error)
        print(f"python -m eqsat compare: error: {reason}", file=sys.stderr)
        return 2
    twice = sorted({path for path in paths if paths.count(path) > 1})
    if twice:
        print(f"python -m eqsat compare: error: {', '.join(twice)} given twice", file=sys.stderr)
        return 2
    compare(*plans, labels=paths)
    if args.html:
        if len(plans) != 2:
            print("python -m eqsat compare: error: --html draws two plans against each other", file=sys.stderr)
            return 2
        from eqsat.tools.html_report import to_html

        print(f"wrote {to_html(plans[0], args.html, versus=plans[1], labels=tuple(paths))}")
    return 0


def compare_censuses(paths: list[str]) -> int:
    """Print one census, or two side by side (`python -m eqsat census --json` saves them); 2 for more."""
    from eqsat.census.census import echo, load_census, side_by_side

    found = [load_census(path) for path in paths]
    if len(found) > 2:
        print("python -m eqsat compare: error: censuses are compared two at a time", file=sys.stderr)
        return 2
    echo(found[0] if len(found) == 1 else side_by_side(found[0], found[1], (paths[0], paths[1])))
    return 0


def calibrate(args: argparse.Namespace) -> int:
    if args.out:  # a folder that cannot be made is an error now, not after the minute of measuring
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.target != "cpu":  # a TPU: what its compiler fuses, compiled deviceless
        from eqsat.tools import calibrate_fusion

        target_profile(args.target)  # an unknown target is a usage error
        print(calibrate_fusion.summary(calibrate_fusion.calibrate_fusion(args.target, args.out)))
        return 0
    from eqsat.tools.calibrate import calibrate, summary

    print(summary(calibrate(args.seconds, args.out)))
    return 0


def rules_check(args: argparse.Namespace) -> int:
    from eqsat.tools.verify import run_check

    return run_check(args.files, examples=args.examples, leads=args.lead)


def fuzz(args: argparse.Namespace) -> int:
    from eqsat.tools.fuzz import FAILURES, Outcome
    from eqsat.tools.fuzz import fuzz as run_fuzz

    done = [0]

    def report(outcome: Outcome) -> None:
        if outcome.status in FAILURES:
            print(f"{outcome.status} in case {outcome.case.index}: {outcome.detail[:200]}", flush=True)
        done[0] += 1
        if args.progress and done[0] % args.every == 0:
            print(f"{done[0]} cases, {time.strftime('%H:%M:%S')}", flush=True)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    os.environ.setdefault("EQSAT_PLAN_STORE", "off")  # thousands of one-off programs: none is worth keeping
    signal.signal(signal.SIGTERM, stop)  # a long run stopped with kill still prints the summary of what ran
    summary = run_fuzz(args.n, args.seed, args.only, progress=report, jobs=args.jobs, first=args.first)
    print(summary.table())
    return 1 if summary.failures else 0


def main(argv: list[str] | None = None, own_process: bool = False) -> int:
    """`own_process`: the command runs in a process of its own (`python -m eqsat`), whose jax settings it may set."""
    args = command_line(own_process).parse_args(argv)
    configure_logging(args.verbose)
    return args.run(args)


def command_line(own_process: bool = False) -> argparse.ArgumentParser:
    """`python -m eqsat`'s parser: every command with its flags."""
    parser = argparse.ArgumentParser(prog="python -m eqsat", description="Equality-saturation optimizer for JAX.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands_added = (add_optimize_command, add_tune_command, add_census_command, add_tpu_check_command)
    for add in (*commands_added, _add_demo, _add_compare, _add_calibrate):
        add(commands)
    rules = _add_rules(commands)
    _add_fuzz(commands)
    for p in (parser, *commands.choices.values(), *rules.choices.values()):
        add_common_flags(p)
    parser.set_defaults(verbose=0, progress=True, own_process=own_process)
    return parser


def _add_demo(commands: Any) -> None:
    p = _command(
        commands,
        "demo",
        "optimize the bundled examples and measure them against jax.jit",
        "python -m eqsat demo                     # every example, planned for the cpu and measured\n"
        "python -m eqsat demo --model matmul_chain --model conv_bn --scale small --seconds 1",
    )
    p.add_argument("--model", action="append", help="example to run (repeatable); default: all")
    p.add_argument("--scale", default="full", choices=["full", "small"], help="problem size")
    add_options(p, "target")
    p.add_argument("--seconds", type=number(float, 0, above=True), default=3.0, help="timing budget per example")
    p.set_defaults(run=reporting("demo", demo))


def _add_compare(commands: Any) -> None:
    p = _command(
        commands,
        "compare",
        "print saved plans (JSON from eqsat.plans.plan_json.save_plan) or censuses (census --json) side by side",
        "python -m eqsat compare bert_cpu.json bert_h100.json   # costs, kernels, rules, regions that differ\n"
        "python -m eqsat compare bert_cpu.json bert_h100.json --html cpu_vs_h100.html\n"
        "python -m eqsat compare mine.census.json theirs.census.json   # two censuses, kernel class by class",
    )
    p.add_argument("plans", nargs="+", help="plan JSON files, and up to two census JSON files")
    p.add_argument("--html", metavar="OUT.html", help="also write a report of two plans, region by region")
    p.set_defaults(run=compare_plans)


def _add_calibrate(commands: Any) -> None:
    p = _command(
        commands,
        "calibrate",
        "measure this machine (or what a TPU's compiler fuses) and write a calibrated profile to the cache",
        "python -m eqsat calibrate                # about a minute; target 'cpu' then plans with it\n"
        "python -m eqsat calibrate --seconds 20 --out my_cpu.json\n"
        "python -m eqsat calibrate --target tpu-v5e  # what XLA's TPU compiler fuses, for the memory model (libtpu)",
    )
    p.add_argument(
        "--target",
        default="cpu",
        help="cpu (default): time this machine; a TPU profile: compile fusion probes for it deviceless (needs libtpu)",
    )
    p.add_argument(
        "--seconds", type=number(float, 0, above=True), default=60.0, help="timing budget (compilation comes on top)"
    )
    p.add_argument("--out", help="profile JSON to write (default: the user cache, where target 'cpu' finds it)")
    p.set_defaults(run=reporting("calibrate", calibrate))


def _add_rules(commands: Any) -> Any:
    """`rules check`; returns the rules command's own subparsers (which take the common flags too)."""
    rules_examples = (
        "python -m eqsat rules check              # the built-in rules on random programs (about 90 s)\n"
        "python -m eqsat rules check my_rules.egg --examples 100\n"
        "python -m eqsat rules check --lead Conv --lead chain"
    )
    p = _command(commands, "rules", "rule tools", rules_examples)
    actions = p.add_subparsers(dest="action", required=True)
    p = _command(actions, "check", "verify the built-in rules plus FILEs on random programs", rules_examples)
    p.add_argument("files", nargs="*", metavar="FILE", help="rule files checked together with the built-in groups")
    p.add_argument("--examples", type=number(int, 1), default=400, help="random programs to saturate and check")
    p.add_argument(
        "--lead", action="append", metavar="ENTRY", help="programs led by this generator entry only (repeatable; an op "
        "name such as Conv, or a rule pattern such as chain); default: every entry"
    )  # fmt: skip
    p.set_defaults(run=reporting("rules check", rules_check, (ValueError,)))  # ValueError: an unknown --lead
    return actions


def _add_fuzz(commands: Any) -> None:
    p = _command(
        commands,
        "fuzz",
        "random programs through optimize under random transformations, against jax.jit",
        "python -m eqsat fuzz --n 1000 --seed 7 --jobs 2   # mismatches and crashes as they come, then a summary\n"
        "python -m eqsat fuzz --n 500 --seed 7 --first 500 # cases 500 to 999: a long run in parts\n"
        "python -m eqsat fuzz --seed 7 --only 123          # re-run case 123 of seed 7",
    )
    p.add_argument("--n", type=number(int, 1), default=200, help="cases to run")
    p.add_argument(
        "--seed", type=number(int, 0), default=0, help="seed: case I of seed S is the same program everywhere"
    )
    p.add_argument("--first", type=number(int, 0), default=0, help="start at case FIRST (a long run in parts)")
    p.add_argument("--only", type=number(int, 0), help="run only case ONLY of the seed (to reproduce a failure)")
    p.add_argument("--jobs", type=number(int, 1), default=1, help="worker processes the cases are spread over")
    p.add_argument("--every", type=number(int, 1), default=100, help="print a progress line every EVERY cases")
    p.set_defaults(run=fuzz)


def _command(commands: Any, name: str, help: str, examples: str) -> argparse.ArgumentParser:
    """A command with its help line as description and its examples below the flags."""
    indented = "\n".join("  " + line for line in examples.splitlines())
    return commands.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog=f"examples:\n{indented}\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


if __name__ == "__main__":
    sys.exit(main())
