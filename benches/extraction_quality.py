"""Extraction quality on the benchmark models' e-graphs: the default extractor against the ILP optimum.

    python -m benches.extraction_quality [--scale small|full] [--ilp-seconds 20]

For each model: e-nodes, the DAG cost of the default choice (extractor "auto" in its default budget: greedy, the
sharing pass, a short ILP on e-graphs up to 4,000 nodes, the original kept if cheaper), the ILP's cost given
--ilp-seconds, whether the ILP proved optimality, and the gap where it did. Also times greedy-DAG
on the largest e-graph.
"""

import argparse
import time

import jax

from benches.models.registry import MODELS
from eqsat.capture.jaxpr import capture
from eqsat.egraph.rule_sources import collect
from eqsat.egraph.saturate import Saturation, saturate
from eqsat.extract.cost import load_profile
from eqsat.extract.dag import dag_cost
from eqsat.extract.extractors import EXTRACT_SECONDS, extract
from eqsat.extract.greedy import greedy_dag
from eqsat.extract.ilp import ilp_extract
from eqsat.extract.plan import extraction_problem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.extraction_quality", description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="small", choices=["small", "full"])
    parser.add_argument("--ilp-seconds", type=float, default=20.0)
    parser.add_argument("--target", default="h100", help="profile whose costs are extracted (h100: merges pay)")
    args = parser.parse_args(argv)
    profile = load_profile(args.target)
    rules = collect(disabled=profile.disabled_rules)
    largest = (0, None)
    for name, build in MODELS.items():
        work = build(args.scale)
        graph = capture(jax.make_jaxpr(work.fn)(*work.args))
        snapshot = saturate(graph, rules, Saturation())
        costs, roots, baseline = extraction_problem(graph, snapshot, profile)
        # what optimize() does by default: "auto" within the default extraction budget
        choice, report = extract(snapshot.nodes, costs, roots, "auto", EXTRACT_SECONDS, baseline, 0.0)
        chosen = dag_cost(snapshot.nodes, costs, choice, roots)
        _, ilp_cost, optimal = ilp_extract(snapshot.nodes, costs, roots, args.ilp_seconds, warm_start=choice)
        gap = f"{(chosen - ilp_cost) / ilp_cost * 100:6.2f} %" if optimal else "  (not proven)"
        print(
            f"{name:<14} e-nodes {len(snapshot.nodes):6d}  chosen {chosen:.6e}  ilp {ilp_cost:.6e}  "
            f"optimal {optimal!s:<5}  gap {gap}  ({report.method})",
            flush=True,
        )
        largest = max(largest, (len(snapshot.nodes), (snapshot.nodes, costs)), key=lambda t: t[0])
    nodes, costs = largest[1]
    start = time.perf_counter()
    greedy_dag(nodes, costs)
    print(f"greedy-DAG on the largest e-graph ({len(nodes)} e-nodes): {time.perf_counter() - start:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
