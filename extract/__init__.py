"""Extraction: the hardware cost model, device profiles and DAG-aware extractors that pick a plan."""
