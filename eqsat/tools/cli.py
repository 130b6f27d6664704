"""`python -m eqsat optimize`: optimize one function from the command line, print its plan, keep it as files; and
what the commands that work on one function share (its arguments, workload, flags and error reporting)."""

import argparse
import importlib
import inspect
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eqsat.plans.options import EXTRACTORS, OPTIONS, Limits, described
from eqsat.support.errors import EqsatError

EPILOG = """\
examples:
  python -m eqsat optimize --bench bert --json bert_cpu.json --html bert_cpu.html
  python -m eqsat optimize --bench bert --target h100 --params-argnums 0 --json bert_h100.json
  python -m eqsat compare bert_cpu.json bert_h100.json
  python -m eqsat optimize mypkg.model:forward --args f32[64,1024] f32[1024,1024] --measure
  python -m eqsat optimize eqsat.tools.examples:matmul_chain --dot plan.dot   # a factory returning a Workload

The function is captured, saturated under the rules, and the cheapest plan for the target extracted and
validated against the original on the example arguments. Without --args, MODULE:FUNCTION must be a factory
that takes no arguments and returns a eqsat.support.workload.Workload (function and example arguments together).
"""

# Short dtype names people write in shape specs, and numpy's full names (float32, int8, ...) also work.
_DTYPES = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u32": "uint32",
    "bool": "bool",
}
_SPEC = re.compile(r"^\s*([A-Za-z0-9_]+)\s*\[\s*([0-9,\s]*?)\s*,?\s*\]\s*$")


class UsageError(Exception):
    """A mistake in what the user asked for: printed as one paragraph, exit code 2."""


@dataclass(frozen=True)
class ArgSpec:
    """One positional argument of the function: its dtype and shape, as written in `--args`."""

    dtype: str
    shape: tuple[int, ...]

    def example(self, seed: int) -> np.ndarray:
        from eqsat.numerics.sample import example_array

        return example_array(self.shape, self.dtype, np.random.default_rng(seed))


def parse_arg_spec(text: str) -> ArgSpec:
    """'f32[64,1024]' -> ArgSpec('float32', (64, 1024)); 'i32[]' is a scalar. argparse shows the error."""
    match = _SPEC.match(text)
    dtype = _DTYPES.get(match.group(1), match.group(1)) if match else None
    if match is None or dtype not in {*_DTYPES.values(), "uint16", "uint64"}:
        raise argparse.ArgumentTypeError(
            f"bad argument spec {text!r}: write dtype[shape], e.g. f32[64,1024], i32[8] or f32[] for a scalar; "
            f"dtypes: {', '.join(_DTYPES)} (or numpy names such as float32)"
        )
    dims = [d for d in match.group(2).replace(" ", "").split(",") if d]
    return ArgSpec(dtype, tuple(int(d) for d in dims))


def number(kind: type[int] | type[float], least: float, *, above: bool = False) -> Callable[[str], Any]:
    """An argparse type: a finite number of this kind, at least `least` (or above it), so that a bad count or
    time is an argument error that names the flag, not a traceback from where the value is used."""
    what = f"{'a whole number' if kind is int else 'a finite number'} {'above' if above else 'of at least'} {least:g}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < least or (above and value == least):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


# How the command line parses each option of eqsat.optimize it takes; each flag's name, default and help are the
# option's own (eqsat.plans.options.Options), so that they cannot drift from optimize's (tests/test_options_once.py)
_PARSED: dict[str, dict[str, Any]] = {
    "target": {"metavar": "PROFILE"},
    "rules": {"nargs": "+", "metavar": "FILE"},
    "disabled_rules": {"nargs": "+", "metavar": "GROUP"},
    "params_argnums": {"type": int, "nargs": "+", "metavar": "N"},
    "extractor": {"choices": EXTRACTORS},
    "memory_budget": {"type": number(int, 1), "metavar": "BYTES"},
}
_ALIASES = {"disabled_rules": ("--disable",)}  # the flag's name before flags were named after the options


def add_options(group: Any, *names: str, note: str = "", **defaults: Any) -> None:
    """Flags for these options of eqsat.optimize: `--name-with-dashes` (`--no-name` for one on by default), each
    with the option's default (or the command's own, given in `defaults`) and its doc, then `note`, as help."""
    for name in names:
        doc = described(name)[3]
        default = defaults.get(name, OPTIONS[name].default)
        flag = "--" + name.replace("_", "-")
        if default is True:
            group.add_argument(f"--no-{flag[2:]}", dest=name, action="store_false", help=f"{name}=False ({doc}){note}")
            continue
        shown = "" if default in (None, ()) else f" (default: {default})"
        flags = (flag, *_ALIASES.get(name, ()))
        group.add_argument(*flags, dest=name, default=default, help=f"{doc}{shown}{note}", **_PARSED.get(name, {}))


def optimize_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of eqsat.optimize that the command's flags set, under the names the flags share with them."""
    return {name: getattr(args, name) for name in OPTIONS if hasattr(args, name)}


def add_common_flags(p: argparse.ArgumentParser) -> None:
    """The flags every command takes, before or after its name (only the ones given are set: main sets the
    defaults once, so a subcommand's unset flag does not overwrite the one given before it)."""
    common = p.add_argument_group("common flags")
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log plans as they are built (-vv: every phase, too)",
    )
    common.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=argparse.SUPPRESS,
        help="show no progress (the live display on a terminal, fuzz's progress lines)",
    )


def _import_target(target: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FUNCTION (e.g. mypkg.model:forward), got {target!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(
            f"cannot import module {module_name!r} ({error}); run from the directory that holds it, "
            "or install its package"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{target} is a {type(obj).__name__}, not a function")
    return obj


def _bench(name: str, scale: str) -> Any:
    try:
        from benches.models.registry import MODELS
        from benches.real_models import REAL_MODELS
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("benches"):
            raise
        raise UsageError(
            "--bench runs the benchmark models of eqsat's repository (its benches/ folder, which is not installed); "
            "run it from a checkout of the repository"
        ) from None

    if name in MODELS:
        return MODELS[name](scale)
    if name in REAL_MODELS:
        try:
            return REAL_MODELS[name]()
        except ImportError as error:
            raise UsageError(f"benchmark {name!r} needs the optional extra `models` ({error})") from None
    raise UsageError(f"unknown benchmark {name!r}; choose from {', '.join([*MODELS, *REAL_MODELS])}")


def workload(args: argparse.Namespace) -> Any:
    """The Workload the options name: a benchmark, a function with --args, or a factory returning one."""
    from eqsat.support.workload import Workload

    if (args.bench is None) == (args.function is None):
        raise UsageError("give either MODULE:FUNCTION or --bench NAME (one, not both)")
    if args.bench is not None:
        if args.arg_specs:
            raise UsageError("--args applies to MODULE:FUNCTION; a --bench model brings its own arguments")
        return _bench(args.bench, args.scale)
    fn = _import_target(args.function)
    if args.arg_specs:
        _check_arity(fn, args.function, len(args.arg_specs))
        example = tuple(spec.example(seed) for seed, spec in enumerate(args.arg_specs))
        return Workload(getattr(fn, "__name__", args.function), fn, example)
    try:
        made = fn()
    except TypeError as error:
        raise UsageError(
            f"{args.function} is not a zero-argument Workload factory ({error}); to optimize it directly, "
            "describe its arguments with --args, e.g. --args f32[64,1024] i32[8]"
        ) from None
    if not isinstance(made, Workload):
        raise UsageError(
            f"{args.function}() returned a {type(made).__name__}, not a eqsat.support.workload.Workload; to optimize "
            "the function itself, describe its arguments with --args"
        )
    return made


def _check_arity(fn: Callable[..., Any], name: str, count: int) -> None:
    """One spec per positional argument, or a usage error naming the signature (not a TypeError from tracing)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin, some C callables): tracing will tell
        return
    try:
        signature.bind(*range(count))
    except TypeError as error:
        raise UsageError(
            f"--args gives {count} spec{'' if count == 1 else 's'} for {name}{signature}: {error}"
        ) from None


def _split(args: tuple, argnums: tuple[int, ...]) -> tuple[tuple, tuple]:
    """(the parameter arguments in argnums order, the other arguments in order)."""
    chosen = [i % len(args) for i in argnums]
    return tuple(args[i] for i in chosen), tuple(a for i, a in enumerate(args) if i not in chosen)


def reporting(
    name: str, body: Callable[[argparse.Namespace], int], errors: tuple[type[Exception], ...] = ()
) -> Callable[[argparse.Namespace], int]:
    """The command `name` running body: a user's mistake (and `errors`) is one paragraph on stderr, exit code 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return body(args)
        except (UsageError, EqsatError, OSError, *errors) as error:
            print(f"python -m eqsat {name}: error: {error}", file=sys.stderr)
            return 2

    return run


def target_profile(target: str) -> Any:
    """The device profile of --target; an unknown one is a usage error."""
    from eqsat.extract.cost import load_profile

    try:
        return load_profile(target)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _optimize(args: argparse.Namespace) -> int:
    import jax

    import eqsat
    from eqsat.numerics.measure import interleaved
    from eqsat.plans import plan_json
    from eqsat.plans.signature import merge_params
    from eqsat.support import progress
    from eqsat.tools import html_report

    target_profile(args.target)
    work = workload(args)
    params_argnums = tuple(args.params_argnums)
    if any(not -len(work.args) <= i < len(work.args) for i in params_argnums):
        raise UsageError(f"--params-argnums {list(params_argnums)}: {work.name} takes {len(work.args)} arguments")
    with progress.live_progress(None if args.progress else False):
        fast = eqsat.optimize(work.fn, **optimize_options(args), limits=_limits(args))
        plan = fast.plan(*work.args)
        params, rest = _split(work.args, params_argnums)
        # run the plan shown (prepared when there are parameters) once: that validates it on these arguments
        call, call_args = (fast.prepare(*params), rest) if params_argnums else (fast, work.args)
        if args.validate:
            jax.block_until_ready(call(*call_args))
        memory = fast.memory(*work.args) if args.memory else None
        timing = None
        if args.measure is not None:
            progress.begin("measure", f"measure against jax.jit ({args.measure:g} s)")
            baseline = jax.jit(work.fn)

            def reference(*rest: Any) -> Any:  # jax.jit of the original, called as the prepared plan is
                return baseline(*merge_params(params_argnums, params, rest))

            timing = interleaved(reference, call, call_args, seconds=args.measure)
    print(f"== {work.name}" + (f": {work.note}" if work.note else ""))
    print(plan.summary())
    if memory is not None:
        print(memory.summary())
    if timing is not None:
        print(f"  measured         {timing}  (jax.jit time / eqsat time)")
    for path, write in ((args.json, plan_json.save_plan), (args.html, html_report.to_html)):
        if path:
            print(f"wrote {write(plan, path)}")
    if args.dot:
        print(f"wrote {write_file(Path(args.dot), html_report.to_dot(plan))}")
    return 0


def _limits(args: argparse.Namespace) -> Limits:
    """The saturation limits of --iterations, --nodes and --seconds (each flag's default is the Limits field's)."""
    return Limits(iterations=args.iterations, nodes=args.nodes, seconds=args.seconds)


def write_file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def add_optimize_command(commands: Any) -> None:
    """Register `optimize` on the CLI's subparsers."""
    p = commands.add_parser(
        "optimize",
        help="optimize one function or benchmark, print its plan, save it as JSON / HTML / DOT",
        description="Optimize one function (or benchmark model) for a target and print the plan: predicted "
        "time, flops, bytes and kernels before and after, the rules that fired and what stopped saturation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_what(p, "optimize")
    how = p.add_argument_group("how to optimize")
    add_options(how, "target", note=". The plan runs anywhere; the target decides which rewrites pay")
    _add_optimize_options(p, how)


def add_what(p: argparse.ArgumentParser, verb: str) -> None:
    """The function or benchmark a command works on, and its example arguments."""
    what = p.add_argument_group(f"what to {verb}")
    what.add_argument(
        "function",
        nargs="?",
        metavar="MODULE:FUNCTION",
        help="the function to optimize, e.g. mypkg.model:forward (importable from here); with --args its "
        "arguments are made up from specs, without it FUNCTION is a zero-argument factory returning a Workload",
    )
    what.add_argument(
        "--args",
        dest="arg_specs",
        nargs="+",
        type=parse_arg_spec,
        metavar="SPEC",
        help="one dtype[shape] per positional argument, e.g. --args f32[64,1024] i32[8] (f32[] is a scalar); "
        "floats are random normal, integers zero. Pytree arguments need a Workload factory or --bench",
    )
    what.add_argument(
        "--bench",
        metavar="NAME",
        help="a benchmark model with its own example arguments, weights included: bert, nasrnn, resnext50, "
        "... (benches/models/registry.py) or a real PyPI model such as flax_bert (needs the extra `models`)",
    )
    what.add_argument(
        "--scale", default="full", choices=["full", "small"], help="benchmark size for --bench (default: full)"
    )


def _add_optimize_options(p: argparse.ArgumentParser, how: Any) -> None:
    """The rest of optimize's options: how to optimize (after --target) and what to show and keep."""
    add_options(how, "params_argnums", "rules", "disabled_rules", "extractor")
    how.add_argument(
        "--iterations",
        type=number(int, 0),
        metavar="N",
        default=Limits.iterations,
        help="saturation iterations at most (default %(default)s)",
    )
    how.add_argument(
        "--nodes",
        type=number(int, 0),
        metavar="N",
        default=Limits.nodes,
        help="stop saturating at this many e-nodes (default %(default)s)",
    )
    how.add_argument(
        "--seconds",
        type=number(float, 0),
        metavar="S",
        default=Limits.seconds,
        help="saturation time limit in seconds (default %(default)s)",
    )
    add_options(how, "validate", note=": the plan is not run against the original on the example arguments")
    out = p.add_argument_group("what to show and keep")
    out.add_argument("--json", metavar="OUT.json", help="save the plan (reload with eqsat.plans.plan_json.load_plan)")
    out.add_argument("--html", metavar="OUT.html", help="self-contained report: both graphs and per-node costs")
    out.add_argument("--dot", metavar="OUT.dot", help="the plan as Graphviz DOT (dot -Tsvg OUT.dot > plan.svg)")
    out.add_argument("--memory", action="store_true", help="also print the plan's memory: liveness, arena, XLA's")
    out.add_argument(
        "--measure",
        type=number(float, 0, above=True),
        nargs="?",
        const=3.0,
        metavar="SECONDS",
        help="time the plan against jax.jit, interleaved in this process (budget default 3 s)",
    )
    p.set_defaults(run=reporting("optimize", _optimize))


def _tpu_check(args: argparse.Namespace) -> int:
    """The tpu-check command: the original and the plan compiled for a TPU, deviceless; 1 where either fails."""
    from eqsat.support import progress
    from eqsat.tools import tpu_check

    tpu_check.quiet_libtpu()  # before the example arguments start jax's backends
    target_profile(args.target)
    work = workload(args)
    device = tpu_check.tpu_device(args.topology or tpu_check.topology_of(args.target))
    with progress.live_progress(None if args.progress else False):
        found = tpu_check.check(work, device=device, **optimize_options(args))
    print(tpu_check.side_by_side(found))
    return 1 if any(c.error for _, c in tpu_check.programs(found)) else 0


def add_tpu_check_command(commands: Any) -> None:
    """Register `tpu-check` on the CLI's subparsers."""
    p = commands.add_parser(
        "tpu-check",
        help="plan for a TPU profile and compile the original and the plan with XLA's TPU compiler, deviceless",
        description="Plan the function for a TPU profile (validated here, on the CPU), then lower the original and "
        "the plan for a TPU topology and compile both with XLA's own TPU compiler, no TPU needed: compiled or the "
        "compiler's error, fusions, flops, bytes accessed, temp and peak bytes, beside eqsat's prediction. Needs "
        "libtpu (the optional extra `tpu-aot`).",
        epilog="examples:\n  python -m eqsat tpu-check eqsat.tools.examples:matmul_chain\n"
        "  python -m eqsat tpu-check mypkg.model:forward --args f32[64,1024] f32[1024,1024] --topology v5e:2x2\n"
        "  python -m eqsat tpu-check --bench bert --scale small --memory-budget 50000000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_what(p, "check")
    add_options(p, "target", "memory_budget", target="tpu-v5e")
    p.add_argument("--topology", help="TPU topology to compile for (default: the target profile's, v5e:2x2)")
    p.set_defaults(run=reporting("tpu-check", _tpu_check))
