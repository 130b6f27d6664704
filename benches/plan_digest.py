"""Each bench row's plan priced by the device profile alone (no timings measured), as a digest two trees can be
compared by: a refactor that changes no plan gives the same digest in both.

    python -m benches.plan_digest --json before.json        # in one tree
    python -m benches.plan_digest --against before.json     # in the other: the rows whose plan differs

Kernel choices made from measured timings differ from run to run of one tree; priced by the profile, a plan is
deterministic. A row's digest: its rewritten ops, its predicted seconds (to the nanosecond) and its fallback.
"""

import argparse
import json
from typing import Any

import eqsat
from benches import acceptance, kernels

PROFILE_ONLY = eqsat.Limits(measure_seconds=0.0)


def digest(plan: Any) -> list[Any]:
    return [dict(sorted(plan.rewritten_ops().items())), round(plan.predicted.seconds, 9), plan.fallback]


def digests() -> dict[str, list[Any]]:
    rows = {}
    for name in (*kernels.CASES, *kernels.SMALL, *kernels.WITH_HAND):
        work = kernels.workload(name)
        rows[name] = digest(eqsat.optimize(work.fn, limits=PROFILE_ONLY).plan(*work.args))
        print(name, rows[name], flush=True)
    for name, (example, target, prepared, _) in acceptance.CASES.items():
        work = acceptance.WORKLOADS[example]()
        argnums = work.params_argnums if prepared else ()
        fast = eqsat.optimize(work.fn, target=target, params_argnums=argnums, limits=PROFILE_ONLY)
        rows[name] = digest(fast.plan(*work.args, prepared=prepared))
        print(name, rows[name], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.plan_digest", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the digests here")
    parser.add_argument("--against", help="digests another tree wrote: print the rows whose plan differs")
    args = parser.parse_args(argv)
    rows = digests()
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    if args.against:
        with open(args.against) as given:
            other = json.load(given)
        differ = [name for name in rows if other.get(name) != rows[name]]
        for name in differ:
            print(f"differs: {name}: {other.get(name)} -> {rows[name]}")
        print(f"{len(rows) - len(differ)} of {len(rows)} rows give the same plan")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
