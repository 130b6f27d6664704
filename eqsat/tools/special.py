"""Special-valued inputs for rule and kernel checks (issue 42): arrays of ordinary normals with NaNs, infinities,
signed zeros, subnormals, the largest finite values, all-equal rows and the tails of elementwise functions placed
where kernels go wrong: the first and last position of a row, the row's maximum and its neighbours."""

from typing import Any

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from eqsat.tools.program import DrawFn, Program, Shape

# What replaces an element (or a whole row, for "equal"): "tail" is a value where an elementwise function
# underflows, saturates or cancels (tails below)
KINDS = ("nan", "inf", "-inf", "0", "-0", "subnormal", "-subnormal", "max", "-max", "tail", "equal")
# Where along the last axis: the row's current maximum, next to it (either side), its ends, anywhere
WHERE = ("first", "last", "max", "before max", "after max", "random")


def tails(dtype: Any) -> tuple[float, ...]:
    """Values where elementwise functions leave their ordinary range in this dtype: exp overflows past log(max) and
    underflows to subnormals and zero below log(tiny) and log(smallest subnormal); tanh, logistic and erf saturate
    by 10-20; a square overflows past sqrt(max); 1 +- eps cancels in log and subtraction; x + 1 == x past 2/eps."""
    finfo = jnp.finfo(dtype)
    big, tiny, sub, eps = (float(v) for v in (finfo.max, finfo.tiny, finfo.smallest_subnormal, finfo.eps))
    edges = (np.log(big), np.log(tiny), np.log(sub), np.sqrt(big), 2 / eps)
    values = [v + d for v in edges for d in (-1.0, 0.0, 1.0)] + [10.0, 20.0, 50.0, 1 + eps, 1 - eps / 2]
    return tuple(sorted({s * v for v in values for s in (1.0, -1.0)}))


def _value(kind: str, dtype: Any, rng: np.random.Generator) -> float:
    finfo = jnp.finfo(dtype)
    table = {
        "nan": np.nan,
        "inf": np.inf,
        "-inf": -np.inf,
        "0": 0.0,
        "-0": -0.0,
        "subnormal": float(finfo.smallest_subnormal),
        "-subnormal": -float(finfo.smallest_subnormal),
        "max": float(finfo.max),
        "-max": -float(finfo.max),
    }
    return table[kind] if kind in table else float(rng.choice(tails(dtype)))


def special_array(shape: Shape, dtype: Any, rng: np.random.Generator, placements: int = 4) -> np.ndarray:
    """An array of normals with 1 to `placements` special values, each at a drawn position of a drawn row (the last
    axis is the row: reductions, windows and arg-reductions run along it as often as along any)."""
    x = rng.standard_normal(shape)
    rows = x.reshape(-1, shape[-1] if shape else 1)  # a view: placements write into x
    if rows.size == 0:
        return x.astype(dtype)
    for _ in range(int(rng.integers(1, placements + 1))):
        kind, where, r = str(rng.choice(KINDS)), str(rng.choice(WHERE)), int(rng.integers(rows.shape[0]))
        if kind == "equal":  # an all-equal row: ties everywhere, a max pool's window of one value
            rows[r] = _value(str(rng.choice(KINDS[:-1])), dtype, rng) if rng.integers(2) else rows[r, 0]
            continue
        n = rows.shape[1]
        top = 0 if np.all(np.isnan(rows[r])) else int(np.nanargmax(rows[r]))
        at = {"first": 0, "last": n - 1, "max": top, "before max": top - 1, "after max": top + 1}.get(where)
        at = int(rng.integers(n)) if at is None else min(max(at, 0), n - 1)
        rows[r, at] = _value(kind, dtype, rng)
    with np.errstate(over="ignore"):  # a float32 tail beyond the narrow type's range rounds to inf, as it would
        return x.astype(dtype)


@st.composite
def special_inputs(draw: DrawFn, prog: Program, salt: int = 0) -> list[np.ndarray]:
    """Inputs for the program: each special-valued (special_array) or, one time in four, plain normals, so that
    special values meet ordinary operands. The choices come from a generator seeded by a drawn integer and `salt`
    (a test's name: hypothesis's first, simplest draw differs between tests)."""
    rng = np.random.default_rng([draw(st.integers(0, 2**32 - 1)), salt])
    return [
        special_array(shape, prog.dtype, rng) if rng.integers(4) else rng.standard_normal(shape).astype(prog.dtype)
        for shape in prog.input_shapes
    ]
