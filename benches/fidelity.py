"""Cost-model fidelity: does the predicted time of a plan rank plans as their measured times do?

    python -m benches.fidelity            # ~40 candidate plans, a few minutes on 2 cores
    python -m benches.fidelity --quick    # shorter timings, the larger sub-blocks left out

Candidates are plans of the benchmark models (small scale), of sub-blocks of them (layers, attention, conv + BN,
an RNN cell, at a few sizes) and of the demo examples, each planned under several targets, rule-group subsets
and extractors; identical plans are kept once. Every plan is priced with the `cpu` profile (the calibrated one
from `python -m eqsat calibrate` when present) and timed as jax.jit of its lowering. The figure of merit is the
Spearman rank correlation of predicted and measured times (target >= 0.95). Kernel choices (a depthwise conv
and its shifted form, one_hot @ table and its gather) are priced by the timing cache, as planning prices them.
Writes benches/fidelity.json.
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import spearmanr

import eqsat
from benches.charts import CHARTS, draw_fidelity, write_charts
from benches.models import layers as L
from eqsat.backends.lower import lower
from eqsat.egraph.rule_sources import builtin_groups
from eqsat.extract.cost import Profile, calibrated_path, load_bundled, load_profile, node_cost
from eqsat.extract.plan import Plan
from eqsat.extract.timing import attached
from eqsat.numerics.measure import median_time
from eqsat.support.workload import Workload

# (label, target, disabled rule groups, extractor): how one workload yields several plans. "none" disables every
# group, giving the original program; a100 plans keep the GEMM merges that the cpu profile turns off.
VARIANTS: list[tuple[str, str, tuple[str, ...] | None, str]] = [
    ("cpu", "cpu", (), "auto"),
    ("none", "cpu", None, "greedy"),
    ("a100", "a100", (), "greedy"),
    ("no-algebra", "cpu", ("algebra",), "greedy"),
]


@dataclass
class Candidate:
    label: str
    plan: Plan
    args: list[Any]  # the flat arguments the lowered plan takes


def _sub_blocks(quick: bool) -> Iterator[Workload]:
    """Layers of the benchmark models as workloads of their own, at a few sizes."""
    gen = L.ParamGen(0)
    sizes = [(8, 64), (64, 256)] if quick else [(8, 64), (64, 256), (128, 512), (1, 1024)]
    for rows, d in sizes:
        p = gen.materialize({"in": gen.dense(d, 4 * d), "out": gen.dense(4 * d, d), "ln": gen.norm(d)})
        x = gen.materialize(gen.normal((rows, d)))
        yield Workload(f"ffn-{rows}x{d}", lambda p, x: L.dense(L.gelu(L.dense(x, p["in"])), p["out"]), (p, x))
        yield Workload(f"layer_norm-{rows}x{d}", lambda p, x: L.layer_norm(x, p["ln"]), (p, x))
    for seq, d, heads in [(16, 64, 4), (64, 256, 8)] if quick else [(16, 64, 4), (64, 256, 8), (128, 512, 8)]:
        p = gen.materialize(L.init_mha(gen, d, heads))
        x = gen.materialize(gen.normal((seq, d)))
        yield Workload(f"mha-{seq}x{d}", lambda p, x, h=heads: L.mha(x, p, h), (p, x))
    for hw, c in [(8, 16), (16, 32)] if quick else [(8, 16), (16, 32), (28, 64)]:
        p = gen.materialize(gen.conv_bn(3, c, c))
        x = gen.materialize(gen.normal((1, hw, hw, c)))
        yield Workload(f"conv_bn-{hw}x{hw}x{c}", lambda p, x: L.conv_bn(x, p), (p, x))
    for n, hw, c, k, stride in [(2, 56, 32, 3, 1), (2, 28, 96, 5, 2)] if quick else [
        (2, 56, 32, 3, 1), (2, 28, 96, 5, 2), (2, 112, 16, 3, 1), (2, 14, 384, 3, 1), (1, 7, 960, 3, 1)
    ]:  # fmt: skip
        x, w = gen.materialize((gen.normal((n, hw, hw, c)), gen.normal((k, k, 1, c))))
        yield Workload(f"depthwise-{n}x{hw}x{hw}x{c}-{k}x{k}/{stride}", _depthwise(stride), (x, w))
    for vocab, width in [(2000, 64), (8000, 256)]:
        table = gen.materialize(gen.normal((vocab, width)))
        ids = jnp.asarray(np.random.default_rng(0).integers(0, vocab, (4, 32)), jnp.int32)
        yield Workload(f"one_hot-{vocab}x{width}", lambda t, i, v=vocab: jax.nn.one_hot(i, v) @ t, (table, ids))
    from benches.models import nasrnn

    for n in [16, 128] if quick else [16, 128, 512]:
        p = gen.materialize({"w": [gen.normal((n, n)) for _ in range(8)], "u": [gen.normal((n, n)) for _ in range(8)]})
        h, x = gen.materialize((gen.normal((1, n)), gen.normal((1, n))))
        yield Workload(f"nas_cell-{n}", nasrnn.nas_cell, (p, h, x))


def _depthwise(stride: int) -> Callable[[Any, Any], Any]:
    def conv(x: Any, w: Any) -> Any:
        return jax.nn.relu(
            jax.lax.conv_general_dilated(
                x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                feature_group_count=x.shape[-1],
            )
        )  # fmt: skip

    return conv


def workloads(quick: bool) -> Iterator[Workload]:
    from benches.acceptance import WORKLOADS
    from benches.models.registry import MODELS

    for build in WORKLOADS.values():
        yield build("small")
        yield build("full")
    yield from _sub_blocks(quick)
    for name, build in MODELS.items():
        if not (quick and name in ("nasnet_a", "inception_v3")):  # the slowest to compile
            yield build("small")


def candidates(works: Iterator[Workload] | list[Workload], variants: list = VARIANTS) -> list[Candidate]:
    """Distinct plans of each workload under the variants (a plan found twice is kept once)."""
    every_group = tuple(builtin_groups())
    out: list[Candidate] = []
    for work in works:
        seen: set[str] = set()
        for variant, target, disabled, extractor in variants:
            fast = eqsat.optimize(
                work.fn,
                target=target,
                disabled_rules=every_group if disabled is None else disabled,
                extractor=extractor,
                validate=False,
            )
            plan = fast.plan(*work.args)
            key = repr([(n.op, n.inputs, n.attrs, n.shape, n.dtype) for n in plan.nodes] + [plan.outputs])
            if key not in seen:
                seen.add(key)
                out.append(Candidate(f"{work.name}/{variant}", plan, jax.tree_util.tree_leaves(work.args)))
    return out


def price(plan: Plan, profile: Profile) -> float:
    """Predicted seconds of a plan under another profile than the one it was planned for."""
    total = 0.0
    for node in plan.nodes:
        if node.op not in ("Var", "Get", "TCons", "TNil"):
            in_shapes = [plan.nodes[j].shape for j in node.inputs]
            total += node_cost(node.op, in_shapes, node.shape, node.dtype, profile, node.attrs).seconds
    return total


def evaluate(cands: list[Candidate], profile: Profile, seconds: float = 0.3, log: Callable | None = None) -> dict:
    """Predicted (under `profile`) and measured seconds per candidate, and their Spearman rank correlation."""
    rows = []
    for c in cands:
        measured = median_time(jax.jit(lower(c.plan)), tuple(c.args), seconds)
        row = {
            "candidate": c.label,
            "nodes": len(c.plan.nodes),
            "rewritten": sum(n.rewritten for n in c.plan.nodes),
            "predicted_s": price(c.plan, profile),
            "measured_s": measured,
        }
        rows.append(row)
        if log:
            log(row)
    rho = spearmanr([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]).statistic
    return {"spearman": float(rho), "rows": rows}


def _print_row(row: dict) -> None:
    print(
        f"{row['candidate']:<34} nodes {row['nodes']:5d}  rewritten {row['rewritten']:4d}  "
        f"predicted {row['predicted_s'] * 1e3:9.4f} ms  measured {row['measured_s'] * 1e3:9.4f} ms  "
        f"ratio {row['measured_s'] / max(row['predicted_s'], 1e-12):7.2f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.fidelity", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timings, fewer sub-block sizes")
    parser.add_argument("--seconds", type=float, help="timing budget per plan (default 0.15 quick, 0.4 full)")
    parser.add_argument("--out", default="benches/fidelity.json")
    parser.add_argument("--charts", default=str(CHARTS), help="folder for the scatter's SVG ('' for none)")
    args = parser.parse_args(argv)
    seconds = args.seconds or (0.15 if args.quick else 0.4)
    t0 = time.perf_counter()
    cands = candidates(workloads(args.quick))
    # kernel choices are priced by what the timing cache measured while the candidates were planned
    profile = attached(load_profile("cpu"))
    calibrated = calibrated_path("cpu").is_file()
    kind = "calibrated" if calibrated else "bundled"
    print(f"{len(cands)} distinct plans in {time.perf_counter() - t0:.1f} s; profile cpu ({kind})")
    result = evaluate(cands, profile, seconds, log=_print_row)
    bundled = attached(load_bundled("cpu"))
    for row, cand in zip(result["rows"], cands, strict=True):  # labels repeat (an example at two scales)
        row["predicted_bundled_s"] = price(cand.plan, bundled)
    rho_bundled = spearmanr(
        [r["predicted_bundled_s"] for r in result["rows"]], [r["measured_s"] for r in result["rows"]]
    )
    print(
        f"Spearman rank correlation, predicted vs measured, {len(cands)} plans: {result['spearman']:.3f} "
        f"({kind} cpu profile; bundled profile: {rho_bundled.statistic:.3f}) "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor()} cpus={os.cpu_count()} "
        f"jax={jax.__version__}",
        "command": "python -m benches.fidelity " + " ".join(argv if argv is not None else sys.argv[1:]),
        "profile": str(calibrated_path("cpu")) if calibrated else "extract/profiles/cpu.json (bundled)",
        "plans": len(cands),
        "spearman": result["spearman"],
        "spearman_bundled_profile": float(rho_bundled.statistic),
        "rows": result["rows"],
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    if args.charts:
        write_charts(lambda: draw_fidelity(Path(args.out), Path(args.charts)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
