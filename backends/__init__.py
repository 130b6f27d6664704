"""Backends: lowering a plan to JAX/XLA, and planning the memory of the lowered program."""
