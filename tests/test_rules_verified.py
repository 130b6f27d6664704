"""Rule verification: every equality the rules add holds on concrete values of random programs."""

import re

import numpy as np
from hypothesis import HealthCheck, given, settings
from jax import lax

from eqsat.__main__ import main
from eqsat.egraph.rule_sources import REAL_MARK, RuleSource, collect, real_rules
from eqsat.numerics.tolerance import rule_tolerance
from eqsat.ops.table import OPS
from eqsat.tools.generators import GENERATORS, generators, programs
from eqsat.tools.program import Program
from eqsat.tools.verify import check_program, check_rules

UNSOUND_SUB = '(rewrite (Sub a b) (Sub b a) :name "unsound-sub")'


def test_every_op_has_a_generator():
    # every op leads programs: a hand-written GENERATORS entry (named op-variant, such as Dense-relu, for one op in
    # several forms) or one drawn from its table entry; opaque calls (Op) have theirs, Get comes with them
    structural = {name for name, op in OPS.items() if op.structural} - {"Op"}
    assert set(OPS) - structural <= {name.split("-")[0] for name in generators()}
    assert "Op" in GENERATORS


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(programs(max_steps=3))
def test_random_programs_agree_with_builtin_rules(prog: Program):
    disagreements, _, _ = check_program(prog, collect())
    assert not disagreements, "\n".join(d.describe() for d in disagreements)


def test_real_number_rules_are_marked_in_the_files():
    marked = real_rules(collect())
    assert {"dot-assoc-right", "dot-factor-left", "conv-add-weights", "fold-scale-into-conv"} <= marked
    assert not {"add-comm", "shared-input-merge", "mt-mt", "concat-assoc=>", "dot-of-row-slice"} & marked
    src = RuleSource("mine", "<test>", "; @real: exp is not exact\n(rewrite (Exp (Add a b)) (Mul (Exp a) (Exp b)))")
    assert real_rules([src]) == real_rules([src], (REAL_MARK,)) == {"(rewrite (Exp (Add a b)) (Mul (Exp a) (Exp b)))"}


def test_rules_that_only_sum_in_another_order_are_tolerated_and_not_guarded():
    """`; @rounding` rules (the kernel alternatives, stable forms) change rounding like `; @real` ones, so `rules
    check` allows for it; they cannot overflow where the original does not, so the overflow watch leaves them."""
    rounding = real_rules(collect()) - real_rules(collect(), (REAL_MARK,))
    assert {
        "depthwise-shifted",
        "pool-sum-sliced",
        "pointwise-conv-dot",
        "cumulative-blocked",
        "stable-softmax-2d",
    } <= rounding
    assert not {"dot-assoc-right", "dot-factor-left", "cumulative-prod-blocked", "pick-of-log-softmax"} & rounding
    src = RuleSource("mine", "<test>", '; @rounding: a sum\n(rewrite (Add (Add a b) c) (Add a (Add b c)) :name "r")')
    assert real_rules([src]) == {"r"} and not real_rules([src], (REAL_MARK,))


def test_float_sound_rules_get_a_tolerance_of_a_few_roundings():
    # layout rules (no sum reordered): 8 roundings of the magnitude; real-number rules: 1e-4 of it for float32
    assert rule_tolerance("float32", 1.0, real=False) == 8 * float(np.finfo(np.float32).eps)
    assert rule_tolerance("float32", 1.0, real=False, reduction=8) < rule_tolerance("float32", 1.0, real=True) / 10
    assert rule_tolerance("int32", 1e6, real=True) == 0.0


def test_unsound_rule_is_reported_with_its_eclass():
    prog = Program("float32")
    a, b = prog.fresh((3, 4)), prog.fresh((3, 4))
    prog.apply("sub", lax.sub, a, b)
    source = RuleSource("mine", "<test>", UNSOUND_SUB)
    disagreements, snapshot, graph = check_program(prog, [source])
    assert disagreements
    sub_class = snapshot.orig[len(graph.nodes) - 1]
    assert {d.eclass for d in disagreements} == {sub_class}
    assert disagreements[0].rules == ("unsound-sub",)
    assert disagreements[0].error > disagreements[0].allowed


def test_check_rules_marks_the_unsound_rule():
    report = check_rules([RuleSource("mine", "<test>", '(rewrite (Tanh x) x :name "tanh-id")')], examples=40)
    (stat,) = report.rules
    assert stat.fired and stat.verdict == "UNSOUND"
    assert report.disagreements and all(d.suspects == ("tanh-id",) for d in report.disagreements)
    assert not report.ok


def test_cli_reports_unsound_file(tmp_path, capsys):
    path = tmp_path / "mine.egg"
    # the last two: no built-in generator produces their left-hand side; their own patterns do
    path.write_text(
        UNSOUND_SUB + '\n(rewrite (Neg (Neg x)) (Neg x) :name "nn")\n(rewrite (Sqrt (Mul x x)) x :name "sq")\n'
    )
    assert main(["rules", "check", str(path), "--examples", "40"]) == 1
    out = capsys.readouterr().out
    assert "e-class" in out
    for name in ("unsound-sub", "nn", "sq"):
        assert re.search(rf"^{name} .* UNSOUND$", out, re.M), name


def test_builtin_rules_all_fire_and_agree(capsys):
    # every built-in rule fires on the generated programs and no e-class disagrees (about 90 s: each op and shape
    # compiles once; the programs are derandomized, so the run is the same every time)
    assert main(["rules", "check", "--examples", "400"]) == 0, capsys.readouterr().out


def test_rules_no_generator_reaches_are_checked_on_their_own_pattern():
    from eqsat.egraph.rule_sources import rules_in
    from eqsat.tools.generators import pattern_programs

    for text, sound in [
        ("(rewrite (Neg (Neg x)) (Neg x))", False),
        ("(rewrite (Sqrt (Mul x x)) x)", False),
        ("(rewrite (Neg (Neg x)) x)", True),
        ("(rule ((= e (Add (Dot x w1) (Dot x w2))) (= (shape w1) (shape w2))) ((union e (Dot x (Add w1 w2)))))", True),
    ]:
        src = RuleSource("mine", "<test>", text)
        (rule,) = rules_in(src)
        progs = pattern_programs(rule.command)
        assert progs and {p.dtype for p in progs} == {"float32", "float64"}
        found = [check_program(prog, [src])[0] for prog in progs[:2]]
        assert all(found) if not sound else not any(found), text
    (rule,) = rules_in(RuleSource("mine", "<test>", "(rewrite (Transpose p (Transpose q x)) x)"))
    assert pattern_programs(rule.command) == []  # a variable attribute: no program to build
