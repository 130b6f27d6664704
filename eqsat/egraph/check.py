"""Checking a saturated e-graph against concrete values: every e-node must compute its e-class's value.

check_egraph evaluates the original program on concrete inputs, giving each original e-class a value, then
evaluates every e-node whose children have values with its op's lowering and compares the result with its
e-class's value. `rules check` (eqsat/tools/verify.py) runs it over random programs; validation
(eqsat/checks/validate.py) runs it on the caller's arguments to tell which rule made a wrong plan wrong.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from eqsat.capture.ir import Graph
from eqsat.egraph.saturate import ENode, Snapshot
from eqsat.numerics.tolerance import difference, rule_tolerance
from eqsat.ops.table import OPAQUE, OPS, TCONS, TNIL


@dataclass(frozen=True)
class Disagreement:
    """An e-node whose value differs from its e-class's: the rewrite that put it there is unsound."""

    eclass: str
    op: str
    attrs: tuple
    children: tuple[str, ...]
    error: float  # max abs difference (inf where NaN/inf positions differ)
    allowed: float  # the tolerance it exceeded
    rules: tuple[str, ...]  # rules that fired in this saturation (the snapshot cannot say which made the node)
    class_nodes: tuple[str, ...] = ()  # every node of the e-class, as text, for the report
    program: str = ""  # the generated program, filled in by check_rules
    suspects: tuple[str, ...] = ()  # rules that reproduce it alone, filled in by check_rules
    # the node's value holds an inf or NaN or is all zero: where @real rules fired, the overflow watch
    # (backends/lower.py _in_range) runs the original instead
    out_of_range: bool = False
    # it differs only where the class value is inf or NaN and the node's finite (a stable form's purpose)
    rescued: bool = False

    def describe(self) -> str:
        lines = [
            f"e-class {self.eclass}: {node_text(self.op, self.attrs, self.children)} differs from the class value "
            f"by {self.error:.3g} (allowed {self.allowed:.3g})",
            f"  rules fired: {', '.join(self.rules) or '-'}",
        ]
        if self.suspects:
            lines.append(f"  reproduced by: {', '.join(self.suspects)}")
        lines += [f"  node: {text}" for text in self.class_nodes]
        if self.program:
            lines += [f"  program: {line}" for line in self.program.splitlines()]
        return "\n".join(lines)


def node_text(op: str, attrs: tuple, children: tuple[str, ...]) -> str:
    return f"({' '.join([op, *(repr(a) for a in attrs), *children])})"


def _magnitude(*values: Any) -> float:
    """Largest finite |element| over the given arrays (non-arrays ignored)."""
    scale = 0.0
    for value in values:
        # jnp's issubdtype: numpy's does not count bfloat16 a number (its values were compared exactly)
        if (
            isinstance(value, jax.Array | np.ndarray)
            and value.size
            and jax.numpy.issubdtype(value.dtype, jax.numpy.number)
        ):
            a = np.abs(np.asarray(value, dtype=np.complex128 if np.iscomplexobj(value) else np.float64))
            scale = max(scale, float(np.max(a[np.isfinite(a)], initial=0.0)))
    return scale


def _is_64bit(graph: Graph) -> bool:
    return any(node.dtype is not None and node.dtype.endswith("64") for node in graph.nodes)


def _environment(graph: Graph, inputs: Sequence[Any]) -> dict[str, Any]:
    env = {graph.nodes[i].attrs[0]: x for i, x in zip(graph.inputs, inputs, strict=True)}
    env.update(graph.consts)
    return env


def _evaluate(graph: Graph, env: dict[str, Any]) -> list[Any]:
    values: list[Any] = []
    for node in graph.nodes:
        values.append(graph.apply(node.op, node.attrs, [values[i] for i in node.inputs], env.__getitem__))
    return values


def evaluate(graph: Graph, inputs: Sequence[Any]) -> list[Any]:
    """The value of every node of the original program on these inputs."""
    with jax.enable_x64(_is_64bit(graph)):
        return _evaluate(graph, _environment(graph, [np.asarray(x) for x in inputs]))


def _is_array(value: Any) -> bool:
    return isinstance(value, jax.Array | np.ndarray)


def _propagate(graph: Graph, snapshot: Snapshot, inputs: list[Any], checked: list[ENode]) -> tuple[dict, list]:
    """Class values, and the values of the nodes to compare with them (the nodes appended to `checked`).

    Original classes take the original program's values; a class first reached through a rewrite takes the
    value of the first of its nodes evaluated. A node whose lowering raises or whose result's shape or dtype
    differs from its class's is ill-typed: extraction never picks it, so it is not compared.
    """
    env = _environment(graph, inputs)
    values: dict[str, Any] = {}
    outs: list[Any] = []
    for i, value in enumerate(_evaluate(graph, env)):
        cls = snapshot.orig[i]
        if cls in values and _is_array(value):  # duplicates that capture merged into one class must agree too
            checked.append(next(n for n in snapshot.nodes if n.eclass == cls))
            outs.append(value)
        values.setdefault(cls, value)
    pending = list(snapshot.nodes)
    progress = True
    while pending and progress:  # a pass per level of new classes; each node is evaluated once
        progress, waiting = False, []
        for node in pending:
            if any(c not in values for c in node.children):
                waiting.append(node)
                continue
            progress = True
            args = [values[c] for c in node.children]
            if node.op in (TNIL, TCONS):
                values.setdefault(node.eclass, () if node.op == TNIL else (args[0], *args[1]))
                continue
            try:
                out = graph.apply(node.op, node.attrs, list(args[0]) if node.op == OPAQUE else args, env.__getitem__)
            except Exception:  # the lowering rejects these operands: ill-typed, never extracted
                continue
            want = values.get(node.eclass)
            if not _is_array(out):  # a multi-result opaque call: its results are compared through Get
                values.setdefault(node.eclass, out)
            elif want is None:
                shape, dtype = snapshot.shape.get(node.eclass), snapshot.dtype.get(node.eclass)
                if (shape is None or tuple(out.shape) == shape) and (dtype is None or out.dtype.name == dtype):
                    values[node.eclass] = out
            elif _is_array(want) and out.shape == want.shape and out.dtype == want.dtype:
                checked.append(node)
                outs.append(out)
        pending = waiting
    return {cls: v for cls, v in values.items() if _is_array(v)}, outs


def check_egraph(
    graph: Graph, snapshot: Snapshot, inputs: Sequence[Any], real: bool = True, special: bool = False
) -> list[Disagreement]:
    """Every e-node that type-checks on the inputs' values and disagrees with its e-class's value, within the
    tolerance of rules that hold for real numbers (`real`) or of rules sound in floating point.

    `special`: inputs with special values (eqsat/tools/special.py). Zeros' signs must agree too, except in a class
    that is a sum: an exact zero sum takes its sign from where the accumulation starts, which jax.jit's own kernels
    do not agree on (a dot of -0 products gives +0, a conv -0), and -(a + b) is -0 where (-a) + (-b) is +0. In a
    class whose sum's terms reach the overflow threshold, elements either side holds as inf or NaN are not compared
    (nor those both hold near the threshold): which partial sum overflows (to inf, or to NaN where infinities of
    both signs meet) depends on the order of the terms, which XLA's kernels block by shape, so a merged or
    re-laid-out operand changes it (jax.jit's own answer there is its kernel's, no rule to keep).

    Evaluation is eager, op by op: jax caches each op's compilation by shape, so repeated shapes across many
    programs are cheap (one jit per e-graph measured slower: thousands of nodes compile every time).
    """
    checked: list[ENode] = []
    with jax.enable_x64(_is_64bit(graph)):
        values, outs = jax.device_get(_propagate(graph, snapshot, [np.asarray(x) for x in inputs], checked))
    rules = tuple(sorted(rule for rule, count in snapshot.rule_matches.items() if count))
    by_class: dict[str, list[str]] = {}
    for node in snapshot.nodes:
        by_class.setdefault(node.eclass, []).append(node_text(node.op, node.attrs, node.children))
    reduction = max((_reduction(node, snapshot) for node in snapshot.nodes), default=1)
    sums = {node.eclass for node in snapshot.nodes if _sums(node)}
    overflowing = {n.eclass for n in snapshot.nodes if special and _sums(n) and _may_overflow(n, snapshot, values)}
    found = []
    for node, out in zip(checked, outs, strict=True):
        want = values[node.eclass]
        scale = _magnitude(want, out, *(values.get(c) for c in node.children))
        allowed = rule_tolerance(np.asarray(want).dtype, scale, real, reduction)
        summed = special and node.eclass in sums and jax.numpy.issubdtype(np.asarray(want).dtype, jax.numpy.floating)
        loose = _order_decides(want, out, _terms(node, snapshot, out, values)) if node.eclass in overflowing else None
        diff = difference(want, out, allowed, special and not summed, loose)
        if diff:
            beyond = ~np.isfinite(np.asarray(want, np.float64)) & np.isfinite(np.asarray(out, np.float64))
            rescued = special and not difference(want, out, allowed, not summed, beyond | (loose is not None and loose))
            found.append(
                Disagreement(
                    node.eclass, node.op, node.attrs, node.children, *diff, rules, tuple(by_class[node.eclass]),
                    out_of_range=_out_of_range(out), rescued=rescued,
                )
            )  # fmt: skip
    return found


def _sums(node: ENode) -> bool:
    """The node adds terms (OpSpec.sums, or a contraction)."""
    spec = OPS.get(node.op)
    if spec is None:
        return False
    return (spec.sums(node.attrs) if callable(spec.sums) else spec.sums) or spec.contracted is not None


def _terms(node: ENode, snapshot: Snapshot, out: Any, values: dict[str, Any]) -> int:
    """How many terms a sum node adds per element: a contraction's length, else its largest input's size per
    element of its result (2 at least)."""
    sizes = [np.size(values[c]) for c in node.children if c in values]
    return max(_reduction(node, snapshot), -(-max(sizes, default=0) // max(np.size(out), 1)), 2)


def _may_overflow(node: ENode, snapshot: Snapshot, values: dict[str, Any]) -> bool:
    """Whether the node's terms reach the overflow threshold: the largest magnitude of its operands (of its two
    operands' product, for a contraction) times how many terms it adds."""
    operands = [values.get(c) for c in node.children]
    if not operands or any(v is None for v in operands) or not _is_array(operands[0]):
        return False
    dtype = np.asarray(operands[0]).dtype
    if not jax.numpy.issubdtype(dtype, jax.numpy.floating):
        return False
    spec = OPS.get(node.op)
    size = max(np.size(v) for v in operands)
    if spec is not None and spec.contracted is not None and len(operands) >= 2:
        bound, terms = _magnitude(operands[0]) * _magnitude(operands[1]), _reduction(node, snapshot)
    elif spec is not None and getattr(spec.named(node.attrs), "kind", None) == "prod":  # a cumulative product:
        n, largest = np.shape(operands[0])[spec.named(node.attrs).axis], _magnitude(*operands)  # in logarithms
        return largest > 1 and n * float(np.log(largest)) >= float(np.log(jax.numpy.finfo(dtype).max))
    else:
        bound, terms = _magnitude(*operands), max(size // max(min(np.size(v) for v in operands), 1), 2)
    return bound * max(terms, 2) >= float(jax.numpy.finfo(dtype).max)


def _order_decides(want: Any, out: Any, terms: int) -> np.ndarray:
    """In a class whose sum overflows midway: the elements either value holds as inf or NaN, and those both hold
    within `terms` terms of the overflow threshold. Which partial sum overflows (to inf, or to NaN where infinities
    of both signs meet, then whatever an epilogue such as relu makes of it) is the order's doing."""
    edge = float(jax.numpy.finfo(np.asarray(want).dtype).max) / (2 * terms)
    w, g = np.abs(np.asarray(want, np.float64)), np.abs(np.asarray(out, np.float64))
    return ~np.isfinite(w) | ~np.isfinite(g) | ((w >= edge) & (g >= edge))


def _out_of_range(value: Any) -> bool:
    """An inexact value with an inf or NaN, or all zero: what the overflow watch's check refuses."""
    a = np.asarray(value)
    if not jax.numpy.issubdtype(a.dtype, jax.numpy.inexact) or not a.size:
        return False
    return bool(not np.all(np.isfinite(a)) or not np.any(a != 0))


def _reduction(node: ENode, snapshot: Snapshot) -> int:
    """The length of the sum that computes each element of a contraction node; 1 for other nodes."""
    spec = OPS.get(node.op)
    if spec is None or spec.contracted is None or any(c not in snapshot.shape for c in node.children):
        return 1
    return spec.contracted([snapshot.shape[c] for c in node.children])
