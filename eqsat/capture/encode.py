"""Encoding: the egglog prelude generated from the op table, and a graph as egglog commands."""

import jax.numpy as jnp
import numpy as np

from eqsat.capture.ir import Graph, Node
from eqsat.ops.table import GET, OPAQUE, OPS, SORTS, TCONS, TNIL, VAR

_VECTOR_LENGTHS = range(1, 7)  # the lengths of (zeros n) and (ones n): a conv's spatial axes, 1-3 in practice

ANALYSIS = "analysis"  # ruleset of the shape and dtype analyses, saturated before every rewrite step
# egglog functions and relations that hold facts about tensors, not tensors: not e-nodes of the program
FACTS = (
    "shape", "dtype", "Orig", "sibling-first", "sibling-last", "scalar-value", "axes-checked", "axes-built",
    "distinct-before",
)  # fmt: skip


def prelude() -> str:
    """Sorts, constructors and analyses of every op in the op table."""
    lines = [
        "(sort Tensor)",
        "(sort Shape (Vec i64))",
        "(function shape (Tensor) Shape :no-merge)",
        "(function dtype (Tensor) String :no-merge)",
        "(relation Orig (i64 Tensor))",
        # Where a contraction stands among those of its kind reading the same input (sibling GEMMs or convs), in
        # program order, as an interval (first, last) that merges widen: merge rules join only neighbours, so n
        # siblings give O(n^2) merges, not every subset in every order.
        "(function sibling-first (Tensor) i64 :merge (min old new))",
        "(function sibling-last (Tensor) i64 :merge (max old new))",
        # per-axis shape checks of any rank (Bcast's): (axes-checked e i last) says axes 0..i-1 of e's input hold
        "(relation axes-checked (Tensor i64 i64))",
        # shapes of any rank built axis by axis (Transpose's, Pad's, the pools'): the first i axes of e's shape
        "(function axes-built (Tensor i64) Shape :no-merge)",
        # (distinct-before e i j): entry i of e's permutation differs from its entries 0..j-1 (Transpose's)
        "(relation distinct-before (Tensor i64 i64))",
        # the value of a floating-point scalar constant (relu is max(x, 0.0)), for rules to match on
        "(function scalar-value (Tensor) f64 :merge (min old new))",
        # constant vectors by length, for rules to compare attributes with (a conv's unpadded, undilated axes)
        "(function zeros (i64) Shape :no-merge)",
        "(function ones (i64) Shape :no-merge)",
        *(f"(set (zeros {n}) (vec-of{' 0' * n})) (set (ones {n}) (vec-of{' 1' * n}))" for n in _VECTOR_LENGTHS),
        f"(ruleset {ANALYSIS})",
    ]
    for op in OPS.values():
        if op.declaration is not None:
            lines.append(op.declaration)
            continue
        lines.append(f"(constructor {op.name} ({op.signature()}) Tensor)")
        for k, rule in enumerate(op.shape_rules):
            lines.append(f'{rule.removesuffix(")")} :ruleset {ANALYSIS} :name "{ANALYSIS}:shape-{op.name}-{k}")')
        if op.arity:
            lines.append(f'{op.dtype_rule.removesuffix(")")} :ruleset {ANALYSIS} :name "{ANALYSIS}:dtype-{op.name}")')
    return "\n".join(lines)


def encode(graph: Graph) -> str:
    """Each node as a let-bound term, with its shape and dtype known from capture, tagged (Orig index); each GEMM
    and conv with its place among the siblings it could merge with (see prelude)."""
    lines = []
    term_of: dict[tuple, int] = {}  # a term -> its first node: egglog makes one e-node of identical terms
    canonical: list[int] = []
    siblings: dict[tuple, int] = {}  # merge group -> the last place given in it
    for i, node in enumerate(graph.nodes):
        canonical.append(term_of.setdefault((node.op, node.attrs, tuple(canonical[j] for j in node.inputs)), i))
        lines.append(f"(let $eqsat_n{i} {_term(graph, node)})")
        if node.shape is not None:
            lines.append(f"(set (shape $eqsat_n{i}) {SORTS['Shape'].to_egglog(node.shape)})")
            lines.append(f'(set (dtype $eqsat_n{i}) "{node.dtype}")')
        value = graph.consts.get(node.attrs[0]) if node.op == VAR else None
        if value is not None and value.shape == () and jnp.issubdtype(value.dtype, jnp.floating) and np.isfinite(value):
            literal = np.format_float_positional(float(value), unique=True, trim="0")
            lines.append(f"(set (scalar-value $eqsat_n{i}) {literal})")
        group = _merge_group(graph, node, canonical)
        if group is not None and canonical[i] == i:
            k = siblings[group] = siblings.get(group, -1) + 1
            lines.append(f"(set (sibling-first $eqsat_n{i}) {k}) (set (sibling-last $eqsat_n{i}) {k})")
        lines.append(f"(Orig {i} $eqsat_n{i})")
    return "\n".join(lines)


def _merge_group(graph: Graph, node: Node, canonical: list[int]) -> tuple | None:
    """Which contractions a merge rule could join with this one: those of its op reading the same first input whose
    op table's merge_key agrees."""
    spec = OPS.get(node.op)
    if spec is None or spec.merge_key is None:
        return None
    key = spec.merge_key(node.attrs, [graph.nodes[i].shape for i in node.inputs])
    return None if key is None else (node.op, canonical[node.inputs[0]], *key)


def _term(graph: Graph, node: Node) -> str:
    attrs = OPS[node.op].attrs_to_egglog(node.attrs)
    if node.op == OPAQUE:  # its inputs as a list
        args = f"({TNIL})"
        for i in reversed(node.inputs):
            args = f"({TCONS} $eqsat_n{i} {args})"
        return f"({OPAQUE} {attrs[0]} {args})"
    if node.op == GET:  # its input before its attribute
        return f"({GET} $eqsat_n{node.inputs[0]} {attrs[0]})"
    parts = attrs + [f"$eqsat_n{i}" for i in node.inputs]
    return f"({node.op} {' '.join(parts)})"
