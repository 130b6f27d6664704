"""Each elementwise `; @rounding` rule's accuracy over its function's whole domain (issue 42 item 3).

A rule whose new form is another formula (silu through tanh) changes each element's rounding, not only a sum's
order. Its error against the float64 value must stay within ACCURACY_FACTOR of the original's own in every binade of
the input, tails included (where the function underflows, saturates or cancels): judged by the output's largest value,
exact gelu's erfc as 1 - erf lost every digit below x = -3 unseen. Each function of FUNCTIONS is captured on a grid
over its domain and saturated with one rule alone; the nodes the rule put in the output's e-class are evaluated there.
"""

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from eqsat.capture.jaxpr import capture
from eqsat.egraph.check import _propagate
from eqsat.egraph.rule_sources import ROUNDING_MARK, RuleSource, keeping, real_rules
from eqsat.egraph.saturate import Saturation, saturate
from eqsat.numerics.tolerance import ACCURACY_FACTOR
from eqsat.numerics.widening import widened

# the elementwise functions models use, where a rule that re-forms an activation fires
FUNCTIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": jax.nn.gelu,
    "sigmoid": jax.nn.sigmoid,
    "softplus": jax.nn.softplus,
    "log_sigmoid": jax.nn.log_sigmoid,
}
DTYPES = ("float32", "bfloat16", "float16")
_LIMITS = Saturation(iterations=4, nodes=800, seconds=2.0)


@dataclass(frozen=True)
class DomainRow:
    """A rule's largest relative error over a function's domain in one dtype, where (x), the original's, and the
    first binade of x where the rule's error is beyond ACCURACY_FACTOR times the original's worst there (None: none)."""

    rule: str
    function: str
    dtype: str
    worst: float
    at: float
    original_worst: float
    original_at: float
    beyond: tuple[float, float, float] | None  # (x, the rule's error, the original's worst in x's binade)

    def line(self, width: int) -> str:
        verdict = "ok"
        if self.beyond is not None:
            x, error, own = self.beyond
            verdict = f"LOSES DIGITS: {error:.3g} at x = {x:.6g}, the original's worst in that binade {own:.3g}"
        return (
            f"{self.rule:<{width}}  {self.function:<11}  {self.dtype:<8}  {self.worst:>9.3g}  {self.at:>11.5g}  "
            f"{self.original_worst:>9.3g}  {self.original_at:>11.5g}  {verdict}"
        )


def grid(dtype: str) -> np.ndarray:
    """Every binade of both signs from the smallest normal to the largest finite value, and [-40, 40] finely (where
    activations turn, saturate and underflow), in `dtype`."""
    finfo = jnp.finfo(dtype)
    magnitudes = np.logspace(np.log10(float(finfo.tiny)), np.log10(float(finfo.max)), 4096)
    values = np.concatenate([np.linspace(-40.0, 40.0, 1 << 15), magnitudes, -magnitudes, [0.0]])
    out = np.unique(np.asarray(values, dtype))
    return out[np.isfinite(out)]


def measure(sources: list[RuleSource], rule: str, name: str, dtype: str) -> DomainRow | None:
    """rule's row on FUNCTIONS[name] in dtype; None where it does not fire there."""
    fn, x = FUNCTIONS[name], grid(dtype)
    graph = capture(jax.make_jaxpr(fn)(x))
    snapshot = saturate(graph, keeping(sources, lambda names: rule in names), _LIMITS)
    if not snapshot.rule_matches.get(rule):
        return None
    checked: list = []
    values, outs = jax.device_get(_propagate(graph, snapshot, [x], checked))
    root = snapshot.orig[graph.outputs[0]]
    original = np.asarray(values[root], np.float64)
    with jax.enable_x64(True):
        exact = np.asarray(widened(lambda v: [fn(v)], [x], np.dtype(np.float64))[0], np.float64)
    judged = np.isfinite(exact) & np.isfinite(original) & (np.abs(exact) >= float(jnp.finfo(dtype).tiny))
    wide, exact = x.astype(np.float64)[judged], exact[judged]
    own = np.abs(original[judged] - exact) / np.abs(exact)
    # every node of the output's class: the original's and what the rule put there
    nodes = [
        np.asarray(out, np.float64)[judged] for node, out in zip(checked, outs, strict=True) if node.eclass == root
    ]
    ours = np.max([np.abs(v - exact) / np.abs(exact) for v in nodes], axis=0, initial=0.0)
    # by binade of x and sign: the rule within ACCURACY_FACTOR of the original's worst there, or a few roundings
    binade = np.sign(wide) * (np.floor(np.log2(np.maximum(np.abs(wide), 1e-300))) + 2000)
    keys, index = np.unique(binade, return_inverse=True)
    worst = np.zeros(keys.size)
    np.maximum.at(worst, index, own)
    allowed = ACCURACY_FACTOR * np.maximum(worst[index], float(jnp.finfo(dtype).eps))
    bad = np.flatnonzero(ours > allowed)
    beyond = None if bad.size == 0 else (float(wide[bad[0]]), float(ours[bad[0]]), float(worst[index[bad[0]]]))
    i, j = int(np.argmax(ours)), int(np.argmax(own))
    return DomainRow(rule, name, dtype, float(ours[i]), float(wide[i]), float(own[j]), float(wide[j]), beyond)


def rounding_rows(sources: list[RuleSource], dtypes: Sequence[str] = DTYPES) -> list[DomainRow]:
    """Every `; @rounding` rule that fires on one of FUNCTIONS, measured on each it fires on, in each dtype."""
    rounding = real_rules(sources, (ROUNDING_MARK,))
    rows = []
    for name in FUNCTIONS:
        for dtype in dtypes:
            snapshot = saturate(capture(jax.make_jaxpr(FUNCTIONS[name])(grid(dtype))), sources, _LIMITS)
            fired = sorted(r for r, n in snapshot.rule_matches.items() if n and r in rounding)
            rows += filter(None, (measure(sources, rule, name, dtype) for rule in fired))
    return rows


def table(rows: list[DomainRow]) -> str:
    width = max((len(r.rule) for r in rows), default=4)
    head = f"{'rule':<{width}}  {'function':<11}  {'dtype':<8}  {'worst rel':>9}  {'at x':>11}  {'original':>9}  "
    return "\n".join([head + f"{'at x':>11}  verdict", *(r.line(width) for r in rows)])
