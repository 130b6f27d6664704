"""The op table's shape and dtype rules are sections of eqsat/ops/shapes.egg that each entry names: the prelude they
make is the one the rules written in Python gave, every section serves an op, and a name or a file that is wrong
fails when the table is built, naming the op or the file and line."""

import re
from pathlib import Path

import pytest

from eqsat.capture.encode import prelude
from eqsat.ops.shape_rules import parse, shapes_file
from eqsat.ops.table import OPS, OpSpec
from eqsat.support.errors import RuleError

# The prelude as eqsat/ops/table.py generated it from its Python rule strings, before they moved to
# eqsat/ops/shapes.egg. It pins every op's analysis rules, word for word and in order: regenerate it with
# `python -c "from eqsat.capture.encode import prelude; print(prelude())" > tests/data/prelude.egg` where a change to an
# op's rules is meant.
FROZEN = Path(__file__).parent / "data" / "prelude.egg"


def _op_of(line: str) -> str | None:
    """The op a line of the prelude declares or analyses (None: the declarations all ops share)."""
    found = re.match(r"\(constructor (\S+) ", line) or re.search(r'"analysis:(?:shape-(\w+)-\d+|dtype-(\w+))"\)$', line)
    return None if found is None else next(group for group in found.groups() if group)


def test_the_prelude_is_the_one_the_python_rule_strings_gave():
    frozen = FROZEN.read_text().splitlines()
    ops = {_op_of(line) for line in frozen} - {None}
    # ops added since are left out: their rules are new
    now = [line for line in prelude().splitlines() if _op_of(line) is None or _op_of(line) in ops]
    assert now == frozen
    assert len(ops) == 52 and sum(":name" in line for line in now) == 138  # the frozen ops' constructors and rules


def test_every_section_serves_some_op():
    named = {("shape", op.shape_kind) for op in OPS.values()} | {("dtype", op.dtype_kind) for op in OPS.values()}
    assert set(shapes_file().sections) <= named
    assert not [op.name for op in OPS.values() if not op.structural and op.shape_kind is None]


def test_the_dtype_kind_says_whether_the_input_dtype_is_kept():
    assert OPS["Add"].keeps_input_dtype and OPS["Conv"].keeps_input_dtype
    assert not any(OPS[name].keeps_input_dtype for name in ("Convert", "OneHot", "ArgReduce", "ArgReduceMasked"))
    assert OPS["Convert"].dtype_rule == "(rule ((= e (Convert k0 a))) ((set (dtype e) k0)))"


@pytest.mark.parametrize("field", ["shape_kind", "dtype_kind"])
def test_an_unknown_section_fails_when_the_table_is_built(field):
    with pytest.raises(ValueError, match=r"op Erf: .* 'no-such' is not a section .* of .*shapes\.egg; its"):
        OpSpec("Erf", (), 1, "elementwise", lambda _attrs, x: x, **{field: "no-such"})


RULE = "(rule ((= e {pattern}) (= sa (shape a))) ((set (shape e) sa)))"
MALFORMED = {
    "a rule not closed": (
        f"; @shape a\n{RULE[:-1]}\n",
        2,
        "unbalanced parentheses: this rule is not closed at the end",
    ),
    "a rule not closed before the next section": (f"; @shape a\n{RULE[:-1]}\n; @shape b\n{RULE}\n", 2, "line 3"),
    "a ')' too many": (f"; @shape a\n{RULE})\n", 2, r"a '\)' that closes nothing"),
    "a rule outside a section": (f"; rules\n{RULE}\n", 2, "a rule outside a section"),
    "a section defined twice": (f"; @shape a\n{RULE}\n; @shape a\n{RULE}\n", 3, r"defined twice \(first at line 1\)"),
    "an unknown placeholder": (f"; @shape a\n{RULE.replace('{pattern}', '({name} a)')}\n", 2, "placeholder {name}"),
    "a stray brace": (f"; @shape a\n{RULE.replace('{pattern}', '{pattern')}\n", 2, "a brace"),
    "an empty section": (f"; @shape a\n; @shape b\n{RULE}\n", 1, "holds 0 rules"),
    "a dtype section of two rules": (f"; @dtype a\n{RULE}\n{RULE}\n", 1, "holds 2 rules: a dtype section holds one"),
    "a header of no kind": (f"; @shapes a\n{RULE}\n", 1, "a section starts with"),
    "a rewrite": ("; @shape a\n(rewrite (Neg a) a)\n", 2, r"only \(rule \.\.\.\) commands"),
    "text outside a rule": (f"; @shape a\n{RULE} x\n", 2, "'x' outside a rule"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_file_names_its_line(case):
    text, line, message = MALFORMED[case]
    with pytest.raises(RuleError, match=rf"^bad\.egg:{line}: .*{message}"):
        parse(text, "bad.egg")


def test_a_section_serves_each_op_that_names_it():
    text = f"; @shape same\n; a comment\n{RULE}\n(rule ((= e ({{op}} x a)))\n  ((set (shape e) x)))\n"
    section = parse(text, "ok.egg").sections["shape", "same"]
    assert section.line == 1
    assert section.rules_for("Neg", "(Neg a)") == (
        "(rule ((= e (Neg a)) (= sa (shape a))) ((set (shape e) sa)))",
        "(rule ((= e (Neg x a))) ((set (shape e) x)))",
    )
