"""What the pool alternatives add on a keras model: eqsat with every kernel rule against eqsat without the two pool
rules (rules/kernels.egg less pool-max-sliced / pool-sum-sliced, as user rules), and jax.jit, in one process,
interleaved.

    python -m benches.pools_ab [NAME]      # a keras.applications model, weights=None, batch 2; NASNetMobile by default
"""

import re
import sys
from importlib import resources

import jax

import eqsat
from benches.models.keras_apps import keras_app
from eqsat.numerics.measure import interleaved


def without_pools() -> str:
    """rules/kernels.egg with its pool rules (each rule a blank-line-separated paragraph) left out."""
    text = resources.files("eqsat.rules").joinpath("kernels.egg").read_text()
    return "\n\n".join(p for p in re.split(r"\n\s*\n", text) if "Pool" not in p)


def main(name: str = "NASNetMobile") -> None:
    work = keras_app(name, name, batch=2)
    full = eqsat.optimize(work.fn)
    no_pools = eqsat.optimize(work.fn, disabled_rules=("kernels",), rules=without_pools())
    for label, fn in (("full", full), ("no pools", no_pools)):
        jax.block_until_ready(fn(*work.args))
        print(label, fn.plan(*work.args).rewritten_ops(), flush=True)
    for label, base, cand in (("pools on / off", no_pools, full), ("jit / pools on", jax.jit(work.fn), full)):
        c = interleaved(base, cand, work.args, 8.0)
        print(f"{label}: {c.baseline_s * 1e3:.1f} ms / {c.candidate_s * 1e3:.1f} ms = {c.ratio:.2f}x "
              f"(IQR {c.ratio_low:.2f}-{c.ratio_high:.2f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:])
