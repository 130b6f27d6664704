"""Dispatch: which program each call runs, jax.jit's side of it, and the verdicts applied to plans."""
