"""Low precision: chains of bfloat16 or float16 elementwise ops computed in float32 and rounded once at their ends.

XLA:CPU computes each narrow-float elementwise op in float32 and rounds its result back (gelu in bfloat16 over
2x128x8192: 33 ms, 8.1 ms computed in float32 and rounded once). Rounding every op is what the original program
says, but it is only the original's own error: the chain computed in float32 and rounded once is closer to the
exact value, and validation accepts exactly that much difference (eqsat/numerics/tolerance.py narrow_less_accurate).

This is a choice made on the extracted plan rather than an e-graph rewrite: dropping a rounding is sound in no
dtype (no rule could pass `rules check`), and the best choice never needs search: every maximal connected region of
narrow elementwise nodes is widened whole, where the roundings it saves (the cost model prices each one,
Profile.narrow_rounding) outweigh those it keeps at its exits. Lowering (backends/lower.py) computes a widened
node on its inputs in float32 and rounds it where a node outside its region, or a result, reads it; the guard
times the plan against the original as any other.
"""

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax.numpy as jnp

from eqsat.extract.cost import NARROW_FLOATS, Profile, rounding_seconds
from eqsat.ops.table import ONE_HOT, OPS, CostClass

if TYPE_CHECKING:
    from eqsat.extract.plan import PlanNode

WIDE = "float32"
# the name that switches widening off, in disabled_rules beside the rule groups (eqsat/plans/options.py): a rounding the
# program means, `(x.astype(bfloat16) + 1024) - 1024`, is then kept
GROUP = "low-precision"
_WIDENED_CLASSES = (CostClass.ELEMENTWISE, CostClass.BITCAST)


def widen(nodes: list["PlanNode"], roots: Sequence[int], profile: Profile) -> list["PlanNode"]:
    """The plan nodes (PlanNode) with `wide` set on those computed in float32, and their costs without the
    roundings saved; roots: the plan's results and effects, which read a value as it is typed."""
    narrow = [False] * len(nodes)  # computed from a narrow value: rounded already, so rounding it again may be deferred
    for i, node in enumerate(nodes):
        narrow[i] = node.dtype in NARROW_FLOATS or any(narrow[j] for j in node.inputs)
    candidate = [_widenable(nodes, node, narrow) for node in nodes]
    region = list(range(len(nodes)))  # union-find over widenable nodes joined by their edges

    def find(i: int) -> int:
        while region[i] != i:
            region[i] = region[region[i]]
            i = region[i]
        return i

    for i, node in enumerate(nodes):
        for j in node.inputs:
            if candidate[i] and candidate[j]:
                region[find(i)] = find(j)
    exits = set(roots)
    exits.update(j for i, node in enumerate(nodes) if not candidate[i] for j in node.inputs)
    # a member's own rounding is saved unless it is an exit (then it is rounded once, where it is read)
    saved: dict[int, float] = {}
    for i, node in enumerate(nodes):
        if candidate[i] and i not in exits:
            saved[find(i)] = saved.get(find(i), 0.0) + rounding_seconds(node.shape, node.dtype, profile)
    widened = {i for i in range(len(nodes)) if candidate[i] and saved.get(find(i), 0.0) > 0.0}
    out = list(nodes)
    for i in widened:
        node = nodes[i]
        rounding = 0.0 if i in exits else rounding_seconds(node.shape, node.dtype, profile)
        out[i] = dataclasses.replace(
            node, wide=True, cost=dataclasses.replace(node.cost, seconds=node.cost.seconds - rounding)
        )
    return out


def _widenable(nodes: list["PlanNode"], node: "PlanNode", narrow: list[bool]) -> bool:
    """A per-call elementwise op of the table computed from float inputs, with a narrow float result (its op follows
    its inputs' dtype, so that it computes in float32 on float32 inputs), or a Convert between a narrow float type
    and float32 (in float32 it is the identity: a conversion up reads the unrounded value). A conversion down of a
    value computed from no narrow value at all is the program's own quantization (`x.astype(bfloat16)` of a float32
    input), which stays: `narrow`, per node, whether it is computed from a narrow value. A product with a one-hot
    stays narrow: XLA turns x * one_hot into a select in float16 (no NaN from 0 x inf beside the label), not once a
    conversion to float32 stands between them (fuzz seed 2042 case 2875). A conversion to a type of narrower range
    stays too (_narrows_range)."""
    if node.parameter_only or node.op not in OPS or OPS[node.op].structural or not node.inputs:
        return False
    if any(nodes[j].op == ONE_HOT for j in node.inputs):
        return False
    floats = (*NARROW_FLOATS, WIDE)
    if not all(nodes[j].dtype in floats for j in node.inputs):
        return False
    if OPS[node.op].converts:
        source = nodes[node.inputs[0]].dtype
        return (
            node.dtype in floats
            and (node.dtype == WIDE or narrow[node.inputs[0]])
            and not _narrows_range(source, node.dtype)
        )
    spec = OPS[node.op]
    return node.dtype in NARROW_FLOATS and spec.cost_class in _WIDENED_CLASSES and spec.keeps_input_dtype


def _narrows_range(source: str, target: str) -> bool:
    """Whether converting float type `source` to float type `target` loses range, not only precision: bfloat16 or
    float32 to float16 makes values beyond 65504 inf and those under 6e-8 zero, which in float32 is no identity and
    which the program means (`x.astype(float16).astype(bfloat16)` of bfloat16 data: fuzz seed 2051, case 2694, 1e-31
    kept where jax.jit gives 0)."""
    wide, narrow = jnp.finfo(source), jnp.finfo(target)
    return narrow.maxexp < wide.maxexp or narrow.minexp > wide.minexp  # fewer exponent bits


def removed_roundings(nodes: Sequence["PlanNode"], roots: Sequence[int]) -> list["PlanNode"]:
    """The widened nodes whose rounding to their narrow type the plan drops: those read only inside their chain."""
    rounded = set(roots) | {j for node in nodes if not node.wide for j in node.inputs}
    return [node for i, node in enumerate(nodes) if node.wide and i not in rounded and node.dtype in NARROW_FLOATS]
