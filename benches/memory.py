"""Memory figures of the benchmark models' plans, and the 70% budget on the training step.

    python -m benches.memory [--scale full|small]

For each model: the best-fit arena of the plan's buffers against the lower bound (peak live bytes), the peak of a
memory-aware order, and XLA's own figure (argument + output - alias + temp). Then the training step fitted into
70% of its unconstrained XLA figure with eqsat.fit_budget, checked against the original numerically.
"""

import argparse

import eqsat
from benches.models.registry import MODELS
from eqsat.backends.memory import (
    best_fit,
    liveness,
    lower_bound,
    memory_schedule,
    schedule_peak,
    xla_figure,
)

MIB = 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="full", choices=["full", "small"])
    args = parser.parse_args(argv)
    for name, build in MODELS.items():
        work = build(args.scale)
        plan = eqsat.optimize(work.fn).plan(*work.args)
        intervals = liveness(plan)
        bound, arena = lower_bound(intervals), best_fit(intervals)[1]
        ordered = schedule_peak(plan, memory_schedule(plan))
        xla = xla_figure(work.fn, work.args)["total"]
        print(
            f"{name:<14} best fit {arena / MIB:8.1f} MiB = {arena / bound:.3f}x lower bound {bound / MIB:8.1f} MiB;"
            f" memory-aware order {ordered / bound:.3f}x; XLA {xla / MIB:8.1f} MiB",
            flush=True,
        )
    work = MODELS["train_step"](args.scale)
    unconstrained = xla_figure(work.fn, work.args)["total"]
    _, report = eqsat.fit_budget(work.fn, work.args, int(0.7 * unconstrained), loss=work.fn.__wrapped__)
    print(f"train_step, 70% budget: {report.summary()}")
    return 0 if report.fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
