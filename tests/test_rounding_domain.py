"""`rules check` measures each elementwise `; @rounding` rule over its function's whole domain, binade by binade,
beside the original's own error (issue 42 item 3): scaled by the output's largest value, a tail with every digit
lost looked like rounding."""

from eqsat.egraph.rule_sources import RuleSource
from eqsat.tools import domain

# silu as x - x * sigmoid(-x): for very negative x, sigmoid(-x) rounds to 1 and the difference cancels
_CANCELLING = '(rewrite (Mul x (Logistic x)) (Sub x (Mul x (Logistic (Neg x)))) :name "mine")'


def _rows(text: str) -> list[domain.DomainRow]:
    return domain.rounding_rows([RuleSource("mine", "<test>", "; @rounding: another formula\n" + text)])


def test_a_rule_that_loses_a_tail_is_flagged_in_that_binade():
    rows = _rows(_CANCELLING)
    assert {(r.rule, r.function) for r in rows} == {("mine", "silu")} and len(rows) == 3  # float32, bfloat16, float16
    for row in rows:
        assert row.beyond is not None and row.worst >= 0.5
        x, error, own = row.beyond
        assert x < -1 and error > domain.ACCURACY_FACTOR * own
    assert "LOSES DIGITS" in domain.table(rows)


def test_a_rule_that_keeps_every_digit_is_ok_everywhere():
    rows = _rows('(rewrite (Mul x (Logistic x)) (Mul (Logistic x) x) :name "mine")')
    assert {(r.function, r.dtype) for r in rows} >= {("silu", "float32"), ("silu", "bfloat16"), ("silu", "float16")}
    assert all(r.beyond is None and r.worst <= r.original_worst for r in rows)
    assert all(line.endswith("ok") for line in domain.table(rows).splitlines()[1:])
