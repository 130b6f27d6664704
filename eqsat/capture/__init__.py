"""Capture: a JAX function's jaxpr as eqsat's graph IR, and the IR encoded for egglog."""
