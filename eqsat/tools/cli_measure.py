"""`python -m eqsat tune` and `python -m eqsat census`: the commands that measure a function's kernels on this
device, into the timing cache or as a kernel census."""

import argparse
from pathlib import Path
from typing import Any

from eqsat.tools.cli import (
    add_options,
    add_what,
    number,
    optimize_options,
    reporting,
    target_profile,
    workload,
    write_file,
)


def _tune(args: argparse.Namespace) -> int:
    """The tune command: warm the timing cache for a function, or export / import / list cache files."""
    from eqsat.extract import timing

    if args.import_file:
        incoming = timing.parse(Path(args.import_file).read_bytes(), args.import_file)
        cache = timing.cache_for(incoming.device)
        added = cache.merge(incoming)
        cache.save()
        print(f"imported {added} new timings for {incoming.device} ({incoming.versions}) into {cache.path}")
        return 0
    if args.export_file:
        cache = timing.cache_for(args.device or timing.local_device())
        print(f"wrote {write_file(Path(args.export_file), cache.to_json())}: {len(cache.entries)} timings "
              f"for {cache.device} ({cache.versions})")  # fmt: skip
        return 0
    if args.function is None and args.bench is None:
        for path in sorted(timing.cache_path("x").parent.glob("*.json")):
            cache = timing.parse(path.read_bytes(), str(path))
            print(f"{path}: {len(cache.entries)} timings for {cache.device} ({cache.versions})")
        return 0
    return _warm(args)


def _measured_here(budget: float) -> Any:
    """Limits for tune and profile: the kernel choices measured at these very shapes (none priced from others),
    within the command's budget, so a census times what the plan was priced by (planned with the defaults, MobileNetV2's
    training step ran a strided depthwise gradient priced by its roofline at 34 ms where its rival ran 1.5 ms)."""
    import eqsat

    return eqsat.Limits(measure_seconds=budget, timing_transfer=0)


def _warm(args: argparse.Namespace) -> int:
    import eqsat
    from eqsat.extract import timing
    from eqsat.support import progress

    profile = target_profile(args.target)
    work = workload(args)
    with progress.live_progress(None if args.progress else False):
        fast = eqsat.optimize(work.fn, **optimize_options(args), limits=_measured_here(args.budget), validate=False)
        plan = fast.plan(*work.args)
    if profile.timing_device:  # what the command is for: an error where the cache cannot be written
        timing.cache_for(profile.timing_device).save()
    stats = plan.stats
    print(
        f"{work.name}: timing cache for {profile.timing_device or '(none: this profile names no device)'}: "
        f"{int(stats.get('timing_hits', 0))} already measured, {int(stats.get('timing_measured', 0))} measured now "
        f"in {stats.get('measure_s', 0.0):.1f} s, {int(stats.get('timing_skipped', 0))} left over the budget"
    )
    return 0


def add_tune_command(commands: Any) -> None:
    """Register `tune` on the CLI's subparsers."""
    p = commands.add_parser(
        "tune",
        help="warm the timing cache (measured kernel costs) ahead of time; export, import or list cache files",
        description="Measure the rival kernels of a function's plan on this device and keep them in the timing "
        "cache, so later optimizations measure nothing; or move a cache between machines: a cache measured on "
        "a GPU and imported here plans for that GPU's profile.",
        epilog="examples:\n  python -m eqsat tune mypkg.model:forward --args f32[2,224,224,3]\n"
        "  python -m eqsat tune --export h200.json --device 'gpu:NVIDIA H200'\n"
        "  python -m eqsat tune --import h200.json\n  python -m eqsat tune            # list the cache files",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_what(p, "tune")
    add_options(p, "target", note="; its timing cache is warmed")
    p.add_argument("--budget", type=number(float, 0), default=60.0, help="seconds of measuring at most (default 60)")
    p.add_argument("--export", dest="export_file", metavar="FILE", help="write a device's timing cache to FILE")
    p.add_argument("--device", help="the device to export (default: this one), as the cache names it")
    p.add_argument("--import", dest="import_file", metavar="FILE", help="merge a timing cache file into the cache")
    p.set_defaults(run=reporting("tune", _tune, (ValueError,)))


# programs compiling longer than this are kept in jax's compilation cache by the profile command (the kernels
# timed alone compile faster, and the timing cache keeps their times)
_KEEP_COMPILES_OVER_S = 0.3


def keep_compiled() -> None:
    """Keep the profile command's compiled programs in jax's persistent compilation cache, under eqsat's cache directory
    (unless jax has one set already), so that a census run again compiles neither the original nor the plan (1.6 s
    of MobileNetV2's 6.6 s). Only in a process of its own: jax reads the setting once, at its first compile, and a
    user's process keeps jax's settings as they are."""
    import jax

    from eqsat.extract.cost import cache_dir

    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "xla"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", _KEEP_COMPILES_OVER_S)


def _census(args: argparse.Namespace) -> int:
    """The census command: the kernel census of one function (eqsat/census/census.py)."""
    import eqsat
    from eqsat.census import census
    from eqsat.support import progress
    from eqsat.tools import html_report

    target_profile(args.target)
    work = workload(args)
    if args.own_process:
        keep_compiled()
    with progress.live_progress(None if args.progress else False):
        fast = eqsat.optimize(work.fn, **optimize_options(args), background=False, limits=_measured_here(args.budget))
        found = fast.census(*work.args, measure_seconds=args.budget, seconds=args.seconds)
    found.name = work.name
    census.echo(found)
    if args.json:
        print(f"wrote {found.save(args.json)}")
    if args.html:
        print(f"wrote {html_report.to_html(fast.plan(*work.args, prepared=False), args.html, census=found)}")
    return 0


def add_census_command(commands: Any) -> None:
    """Register `census` on the CLI's subparsers."""
    p = commands.add_parser(
        "census",
        help="the kernel census: every kernel of a function timed alone against its roofline, and what eqsat chose",
        description="Time every distinct kernel of the function's program alone on this device (through the timing "
        "cache: kernels measured before cost nothing), set each against its roofline price, name the alternatives "
        "its e-class holds and the one the plan runs, and time the original and the plan end to end. Sorted by the "
        "time lost against the roofline.",
        epilog="examples:\n  python -m eqsat census mypkg.model:forward --args f32[2,224,224,3] --json census.json\n"
        "  python -m eqsat census --bench resnext50 --scale small --html census.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_what(p, "census")
    add_options(p, "target", note="; its roofline prices the kernels")
    p.add_argument(
        "--budget", type=number(float, 0), default=30.0, help="seconds of measuring new kernels at most (default 30)"
    )
    p.add_argument(
        "--seconds",
        type=number(float, 0),
        default=1.0,
        help="seconds timing the program end to end (default 1; 0: the kernels alone, nothing compiled whole)",
    )
    p.add_argument("--json", metavar="OUT.json", help="save the census (eqsat.census.census.load_census reads it)")
    p.add_argument("--html", metavar="OUT.html", help="the plan's report with the census drawn as a chart")
    p.set_defaults(run=reporting("census", _census))
