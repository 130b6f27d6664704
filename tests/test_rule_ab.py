"""benches/rule_ab.py: one built-in rule taken out of its group, the rest of the group kept as it stands."""

import pytest

from benches.rule_ab import without_rule
from eqsat.egraph.rule_sources import RuleSource, builtin_groups, check_syntax, rule_names


def test_one_rule_is_blanked_out_of_its_group_and_the_group_still_parses():
    group, text = without_rule("pointwise-conv-dot")
    assert group == "kernels"
    left = rule_names(RuleSource(group, "kernels less one", text))
    assert left == [n for n in rule_names(builtin_groups()["kernels"]) if n != "pointwise-conv-dot"]
    check_syntax([RuleSource(group, "kernels less one", text)])
    with pytest.raises(SystemExit, match="no built-in rule is named 'no-such-rule'"):
        without_rule("no-such-rule")
