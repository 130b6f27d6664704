"""Bad input gets one clear paragraph that says what was wrong and where."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat


def test_non_callable():
    with pytest.raises(TypeError, match="expects a callable"):
        eqsat.optimize(42)


def test_untraceable_function():
    def branchy(x):
        if x.sum() > 0:  # Python control flow on a traced value
            return x
        return -x

    # jax's own error, as jax.jit raises it, with a note naming the function; no hint that could be wrong
    with pytest.raises(jax.errors.TracerBoolConversionError) as caught:
        eqsat.optimize(branchy)(jnp.ones(3))
    assert "eqsat.optimize traced branchy" in "\n".join(caught.value.__notes__)


def test_a_traced_bool_names_the_users_function_and_argument_as_jax_jit_does():
    def branchy(weights, x):
        if x.sum() > 0:
            return weights @ x
        return x

    messages = []
    for traced in (jax.jit(branchy), eqsat.optimize(branchy)):
        with pytest.raises(jax.errors.TracerBoolConversionError) as caught:
            traced(jnp.ones((3, 3)), jnp.ones(3))
        messages.append(str(caught.value))
    assert "the function branchy at " in messages[1] and "the argument x." in messages[1], messages[1]
    assert "flat_fun" not in messages[1] and "leaves[" not in messages[1]
    assert messages[1] == messages[0]


def test_non_array_argument():
    with pytest.raises(TypeError, match="as an abstract array"):
        eqsat.optimize(lambda x: x)("text")


def test_malformed_rule_file_names_file_and_line(tmp_path):
    path = tmp_path / "mine.egg"
    path.write_text(
        '; my rules\n(rewrite (Add a b) (Add b a) :name "c")\n(rewrite (Add a b)\n  (Frobnicate a b) :name "f")\n'
    )
    with pytest.raises(eqsat.RuleError, match=r"mine\.egg:4:3: invalid rule: .*Unbound function Frobnicate"):
        eqsat.optimize(lambda x: x, rules=[path])


def test_rule_name_used_twice_names_file_and_line(tmp_path):
    path = tmp_path / "mine.egg"
    path.write_text('\n(rewrite (Tanh x) (Tanh x) :name "shared-input-merge")\n')
    with pytest.raises(eqsat.RuleError, match=r"mine\.egg:2:1: .*Rule already exists: shared-input-merge"):
        eqsat.optimize(lambda x: x, rules=[path])


def test_an_unclosed_parenthesis_is_reported_where_it_opens(tmp_path):
    # egglog reads on to the end of the file and reports it there (line 5 here)
    path = tmp_path / "mine.egg"
    path.write_text('; my rules\n(rewrite (Add a b) (Add b a) :name "c"\n\n(rewrite (Mul a b) (Mul b a) :name "m")\n')
    never_closed = r"invalid rule: the parenthesis of \(rewrite ...\) that opens here is never closed"
    with pytest.raises(eqsat.RuleError, match=rf"mine\.egg:2:1: {never_closed}"):
        eqsat.optimize(lambda x: x, rules=[path])
    with pytest.raises(eqsat.RuleError, match=r"<rules string 1>:2:20: .* \(Add ...\) that opens here is never closed"):
        eqsat.optimize(lambda x: x, rules=["; mine\n(rewrite (Add a b) (Add b a"])  # the innermost of those left open


def test_missing_rule_file_and_unknown_group():
    with pytest.raises(eqsat.RuleError, match="does not exist"):
        eqsat.optimize(lambda x: x, rules=["no/such/file.egg"])
    with pytest.raises(eqsat.RuleError, match="unknown rule group"):
        eqsat.optimize(lambda x: x, disabled_rules=["nope"])


def test_unknown_target():
    with pytest.raises(ValueError, match="unknown target 'tpu9'"):
        eqsat.optimize(lambda x: x, target="tpu9")


def test_shape_conflict_names_the_rule():
    fast = eqsat.optimize(lambda a, b: a @ b, rules=['(rewrite (Dot a b) a :name "collapse")'])
    with pytest.raises(eqsat.ShapeConflictError, match=r"<rules string 1>:1:\d+: \(rewrite \(Dot a b\) a"):
        fast(jnp.ones((2, 3)), jnp.ones((3, 4)))


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ('(include "/etc/passwd")', "1:1", r"\(include ...\)"),
        ('(relation R (i64)) (R 1) (output "eqsat-x.txt" (R 1))', "1:1", r"\(relation ...\)"),
        ('; mine\n(rewrite (Exp x) x)\n  (input R "/etc/passwd")', "3:3", r"\(input ...\)"),
        ("(rewrite (Exp x) x)\n(push)", "2:1", r"\(push ...\)"),
        ("(run 1000000)", "1:1", r"\(run ...\)"),
        ('(extract (Var "x"))', "1:1", r"\(extract ...\)"),
        ("(set-option enable_proofs 1)", "1:1", r"\(set-option ...\)"),
        ("(sort S)", "1:1", r"\(sort ...\)"),
        ("(rule ((= e (Exp x))) ((union e (Exp (Neg (Neg x))))) :ruleset analysis)", "1:1", ":ruleset analysis"),
        ("(rule ((= e (Exp x)) (= s (shape x)))\n  ((set (shape e) s)))", "2:4", r"\(set \(shape"),
    ],
)
def test_rule_files_hold_rules_only(tmp_path, text, where, what):
    # refused before egglog sees the text: nothing is read or written, the message names file:line:col
    with pytest.raises(eqsat.RuleError, match=rf"<rules string 1>:{where}: {what}.* is not allowed") as info:
        eqsat.optimize(lambda x: x, rules=text)
    assert "root:" not in str(info.value) and "rule, rewrite and birewrite" in str(info.value)
    path = tmp_path / "mine.egg"
    path.write_text(text)
    with pytest.raises(eqsat.RuleError, match=rf"mine\.egg:{where}: "):
        eqsat.optimize(lambda x: x, rules=[path])
    assert not (tmp_path / "eqsat-x.txt").exists()


def test_rule_options_are_accepted():
    eqsat.optimize(
        lambda x: x,
        rules='; ok\n(rewrite (Neg (Neg x)) x :name "nn" :when ((= (shape x) (shape x))) :subsume)\n'
        '(birewrite (Tanh x) (Tanh x) :name "tt")\n(rule ((= e (Exp x))) ((union e (Exp x))) :name "ee")',
    )


@pytest.mark.parametrize(
    ("limits", "error", "says"),
    [
        ({"seconds": "10"}, TypeError, r"seconds='10'\): seconds must be a number"),
        ({"iterations": 2.5}, TypeError, "iterations must be a whole number"),
        ({"nodes": -1}, ValueError, "nodes must be 0 or more"),
        ({"measure_seconds": float("nan")}, ValueError, "measure_seconds must be 0 or more"),
        ({"timing_transfer": 0.5}, ValueError, "0 to measure every shape"),
    ],
)
def test_a_wrong_limit_is_refused_where_it_is_made(limits, error, says):
    with pytest.raises(error, match=says):
        eqsat.Limits(**limits)
    assert eqsat.Limits(iterations=np.int64(3), seconds=np.float32(1.5), timing_transfer=0).iterations == 3
