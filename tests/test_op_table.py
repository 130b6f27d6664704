"""The op table is the whole truth about an op: a new op is one entry, and capture, the e-graph, extraction,
lowering, the cost model and `rules check` all take it from there."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.capture import capture
from eqsat.extract.cost import PRICES
from eqsat.ops import OPS, CostClass, OpSpec
from eqsat.rule_sources import RuleSource
from eqsat.tools.generators import generators
from eqsat.tools.verify import check_rules

ERF = OpSpec(
    "Erf", (), 1, "elementwise", lambda _attrs, x: lax.erf(x), "unary", ("erf",),
)  # fmt: skip
REV = OpSpec(
    "Rev", ("Shape",), 1, "elementwise", lambda attrs, x: lax.rev(x, attrs[0]), "unary", ("rev",),
    capture_params=lambda params: (tuple(params["dimensions"]),),
    example_attrs=lambda shape: [((axis,),) for axis in range(len(shape))],
)  # fmt: skip
# erf is odd; reversing a negation is negating the reversal
RULES = """
(rewrite (Erf (Neg a)) (Neg (Erf a)) :name "erf-odd")
(rewrite (Rev k0 (Neg a)) (Neg (Rev k0 a)) :name "rev-neg")
"""


@pytest.fixture
def new_ops(monkeypatch):
    for spec in (ERF, REV):
        monkeypatch.setitem(OPS, spec.name, spec)


def f(x: jax.Array) -> jax.Array:
    return lax.rev(-lax.erf(-x), (1,)) * 2.0 + jnp.tanh(x)


X = jnp.asarray(np.random.default_rng(0).standard_normal((3, 5)), jnp.float32)


def test_a_new_op_is_one_table_entry(new_ops):
    ops = [node.op for node in capture(jax.make_jaxpr(f)(X)).nodes]
    assert "Erf" in ops and "Rev" in ops and "Op" not in ops  # captured as table ops, not opaque calls
    fast = eqsat.optimize(f, rules=RULES)
    np.testing.assert_allclose(fast(X), f(X), rtol=1e-5, atol=1e-6)
    plan = fast.plan(X)
    assert plan.fallback is None
    assert plan.rules_fired.get("erf-odd", 0) >= 1 and plan.rules_fired.get("rev-neg", 0) >= 1
    assert {"Erf", "Rev"} <= {node.op for node in plan.nodes}


def test_rules_check_draws_programs_of_a_new_op_from_its_entry(new_ops):
    assert {"Erf", "Rev"} <= set(generators())
    report = check_rules([RuleSource("mine", "<test>", RULES)], examples=8, leads=["Erf", "Rev"])
    assert report.ok, report.table()
    assert {stat.name: stat.fired > 0 for stat in report.rules} == {"erf-odd": True, "rev-neg": True}
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
