"""Benchmark workloads: each module exposes ``build(scale) -> Workload``."""
