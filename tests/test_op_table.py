"""The op table is the whole truth about an op: a new op is one entry, and capture, the e-graph, extraction,
lowering, the cost model and `rules check` all take it from there."""

import ast
import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.capture.jaxpr import CAPTURES, capture
from eqsat.egraph.rule_sources import RuleSource
from eqsat.extract.cost import PRICES
from eqsat.ops.table import OPS, CostClass, OpSpec
from eqsat.tools.generators import generators
from eqsat.tools.verify import check_rules

SIN = OpSpec(
    "Sin", (), 1, "elementwise", lambda _attrs, x: lax.sin(x), "unary", ("sin",),
)  # fmt: skip
REV = OpSpec(
    "Rev", ("Shape",), 1, "elementwise", lambda attrs, x: lax.rev(x, attrs[0]), "unary", ("rev",),
    capture_params=lambda params: (tuple(params["dimensions"]),),
    example_attrs=lambda shape: [((axis,),) for axis in range(len(shape))],
)  # fmt: skip
# sine is odd; reversing a negation is negating the reversal
RULES = """
(rewrite (Sin (Neg a)) (Neg (Sin a)) :name "sin-odd")
(rewrite (Rev k0 (Neg a)) (Neg (Rev k0 a)) :name "rev-neg")
"""


@pytest.fixture
def new_ops(monkeypatch):
    for spec in (SIN, REV):
        monkeypatch.setitem(OPS, spec.name, spec)


def f(x: jax.Array) -> jax.Array:
    return lax.rev(-lax.sin(-x), (1,)) * 2.0 + jnp.tanh(x)


X = jnp.asarray(np.random.default_rng(0).standard_normal((3, 5)), jnp.float32)


def test_a_new_op_is_one_table_entry(new_ops):
    ops = [node.op for node in capture(jax.make_jaxpr(f)(X)).nodes]
    assert "Sin" in ops and "Rev" in ops and "Op" not in ops  # captured as table ops, not opaque calls
    fast = eqsat.optimize(f, rules=RULES)
    np.testing.assert_allclose(fast(X), f(X), rtol=1e-5, atol=1e-6)
    plan = fast.plan(X)
    assert plan.fallback is None
    assert plan.rules_fired.get("sin-odd", 0) >= 1 and plan.rules_fired.get("rev-neg", 0) >= 1
    assert {"Sin", "Rev"} <= {node.op for node in plan.nodes}


def test_rules_check_draws_programs_of_a_new_op_from_its_entry(new_ops):
    assert {"Sin", "Rev"} <= set(generators())
    report = check_rules([RuleSource("mine", "<test>", RULES)], examples=8, leads=["Sin", "Rev"])
    assert report.ok, report.table()
    assert {stat.name: stat.fired > 0 for stat in report.rules} == {"sin-odd": True, "rev-neg": True}
    unsound = RuleSource("mine", "<test>", '(rewrite (Rev k0 a) (Rev k0 (Neg a)) :name "bad")')
    assert not check_rules([unsound], examples=4, leads=["Rev"]).ok


def test_without_its_entry_the_primitive_stays_opaque():
    assert "Rev" not in OPS
    ops = [node.op for node in capture(jax.make_jaxpr(f)(X)).nodes]
    assert ops.count("Op") == 2


def test_cost_classes_are_an_enum_with_a_price_each():
    assert set(PRICES) == set(CostClass)
    assert all(isinstance(op.cost_class, CostClass) for op in OPS.values())
    with pytest.raises(ValueError, match="'fused'"):
        OpSpec("Bad", (), 1, "fused", lambda _attrs, x: x)


IDS = jnp.asarray([[0, 2], [5, 1], [3, 3], [4, 0]], jnp.int32)
# a program of each primitive the table names (on X2, a (4, 6) matrix) and the op it is captured as
X2 = jnp.asarray(np.random.default_rng(1).standard_normal((4, 6)), jnp.float32)
PROGRAMS: dict[str, tuple[Any, str]] = {
    "dot_general": (lambda x: x @ x.T, "Dot"),
    "conv_general_dilated": (
        lambda x: lax.conv_general_dilated(
            x[None, :, :, None], jnp.ones((3, 3, 1, 2)), (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        ),
        "Conv",
    ),
    "reduce_window_max": (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID"), "PoolMax"),
    "reduce_window_sum": (lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 2), (2, 2), "VALID"), "PoolSum"),
    "gather": (lambda x: jnp.take_along_axis(x, IDS, -1), "TakeAlong"),
    "scatter-add": (jax.grad(lambda x: jnp.take_along_axis(x, IDS, -1).sum()), "PutAlong"),
    "argmax": (lambda x: jnp.argmax(x, -1), "ArgReduce"),
    "argmin": (lambda x: jnp.argmin(x, 0), "ArgReduce"),
    "broadcast_in_dim": (lambda x: lax.broadcast_in_dim(x, (2, 4, 6), (1, 2)), "Bcast"),
    **{name: (lambda x, name=name: getattr(lax, name)(x, x), op) for name, op in (
        ("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"), ("max", "Max"), ("min", "Min"))},
    **{name: (getattr(lax, name), op) for name, op in (
        ("neg", "Neg"), ("exp", "Exp"), ("log", "Log"), ("tanh", "Tanh"), ("logistic", "Logistic"),
        ("sqrt", "Sqrt"), ("rsqrt", "Rsqrt"), ("erf", "Erf"), ("erfc", "Erfc"))},
    "integer_pow": (lambda x: lax.integer_pow(x, 3), "IntegerPow"),
    "convert_element_type": (lambda x: x.astype(jnp.bfloat16), "Convert"),
    "transpose": (lambda x: x.T, "Transpose"),
    "reshape": (lambda x: x.reshape(24), "Reshape"),
    "squeeze": (lambda x: lax.squeeze(x[:1], (0,)), "Reshape"),
    "reduce_sum": (lambda x: x.sum(0), "ReduceSum"),
    "reduce_max": (lambda x: x.max(1), "ReduceMax"),
    "concatenate": (lambda x: jnp.concatenate([x, x, x]), "Concat"),
    "slice": (lambda x: x[1:3], "Slice"),
    **{f"cum{kind}": (lambda x, kind=kind: getattr(lax, f"cum{kind}")(x, 1), "Cumulative")
       for kind in ("sum", "prod", "max", "min", "logsumexp")},
}  # fmt: skip


def _named_primitives() -> list[tuple[str, str]]:
    return [(primitive, op.name) for op in OPS.values() for primitive in op.primitives]


def test_each_primitive_is_named_by_one_entry_and_captured_as_it():
    named = _named_primitives()
    primitives = [primitive for primitive, _ in named]
    assert len(primitives) == len(set(primitives)), "a primitive named by two entries"
    assert set(PROGRAMS) == set(primitives), "a program for each primitive the table names"
    for primitive, op in named:
        fn, want = PROGRAMS[primitive]
        assert want == op
        graph = capture(jax.make_jaxpr(fn)(X2))
        assert primitive not in {call.primitive.name for call in graph.opaque}, primitive
        assert op in {node.op for node in graph.nodes}, primitive


def test_capture_functions_are_registered_on_entries_that_name_primitives():
    for name in CAPTURES:
        assert OPS[name].primitives, f"{name}: a capture function for an entry that names no primitive"
        assert OPS[name].capture_params is None, f"{name}: two ways to capture one entry"


@pytest.mark.parametrize("primitive", ["transpose", "dot_general", "reduce_window_max", "cumsum", "slice"])
def test_without_its_entry_naming_it_a_primitive_stays_opaque(monkeypatch, primitive):
    """Capture has no path but the table: an entry that stops naming a primitive leaves it opaque."""
    (op,) = [op for op in OPS.values() if primitive in op.primitives]
    kept = tuple(p for p in op.primitives if p != primitive)
    monkeypatch.setitem(OPS, op.name, dataclasses.replace(op, primitives=kept))
    graph = capture(jax.make_jaxpr(PROGRAMS[primitive][0])(X2))
    assert primitive in {call.primitive.name for call in graph.opaque}


# where op names may appear as strings: the table itself, and the tools that build programs by op name (eqsat/tools:
# generators, fuzzing, the HTML report)
NAMED_OPS_ALLOWED = ("eqsat/ops/table.py", "eqsat/tools/")
REPO = Path(__file__).resolve().parents[1]


def _op_names(node: ast.AST) -> list[str]:
    """The op names a string constant, or a tuple, set, list or frozenset(...) of them, holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in OPS else []
    if isinstance(node, ast.Tuple | ast.Set | ast.List):
        return [name for element in node.elts for name in _op_names(element)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set"):
        return [name for arg in node.args for name in _op_names(arg)]
    return []


def _only_op_names(node: ast.AST) -> bool:
    """A collection literal of op names alone (a named set of ops a module matches against)."""
    elements = getattr(node, "elts", None)
    return bool(elements) and all(isinstance(e, ast.Constant) and e.value in OPS for e in elements)


def test_no_op_name_is_compared_as_a_string_outside_the_table():
    """Modules ask the table (a property of an op's entry) or name an op by the constant ops.py exports."""
    found = set()
    for folder in ("eqsat", "extract", "backends"):
        for path in sorted((REPO / folder).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if where.startswith(NAMED_OPS_ALLOWED):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    names = [name for side in (node.left, *node.comparators) for name in _op_names(side)]
                elif isinstance(node, ast.MatchValue):
                    names = _op_names(node.value)
                else:
                    names = _op_names(node) if _only_op_names(node) else []
                found |= {f"{where}:{node.lineno} {name!r}" for name in names}
    assert not found, "op names compared as strings (ask the op table):\n" + "\n".join(sorted(found))
