"""The egglog rules that derive each op's output shape and dtype: named sections of eqsat/ops/shapes.egg, which the op
table's entries name (OpSpec.shape_kind, OpSpec.dtype_kind) and the prelude instantiates for each op."""

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import NoReturn

from eqsat.support.errors import RuleError

KINDS = ("shape", "dtype")
PLACEHOLDERS = ("op", "pattern")  # {op}: the op's name; {pattern}: its term (OP k0 .. a b), OpSpec.pattern()
FIRST_INPUT = "first-input"  # the dtype section of ops whose output has their first input's dtype
_HEADER = re.compile(r";\s*@")  # a line `; @KIND NAME` starts a section
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class Section:
    """One named section: its rules' text (whitespace collapsed, placeholders in place) and where it starts."""

    kind: str
    name: str
    line: int
    rules: tuple[str, ...]

    def rules_for(self, op: str, pattern: str) -> tuple[str, ...]:
        values = {"op": op, "pattern": pattern}
        return tuple(_PLACEHOLDER.sub(lambda m: values[m[1]], rule) for rule in self.rules)


@dataclass(frozen=True)
class RuleFile:
    origin: str  # the file's path, for messages
    sections: dict[tuple[str, str], Section]  # (kind, name) -> its section, in file order

    def section(self, kind: str, name: str, op: str) -> Section:
        """The section an op's table entry names; a ValueError naming the op, the name and the file if none is."""
        found = self.sections.get((kind, name))
        if found is None:
            names = [n for k, n in self.sections if k == kind]
            raise ValueError(
                f"op {op}: {kind} kind {name!r} is not a section (`; @{kind} {name}`) of {self.origin}; "
                f"its {kind} sections are {names}"
            )
        return found


@dataclass
class _Parser:
    origin: str
    sections: dict[tuple[str, str], Section] = field(default_factory=dict)
    section: tuple[str, str, int] | None = None  # the open section: kind, name, first line
    rules: list[str] = field(default_factory=list)  # the open section's rules so far
    rule: list[str] = field(default_factory=list)  # the open rule's characters
    start: int = 0  # the open rule's first line
    depth: int = 0  # parentheses open in it

    def fail(self, line: int, message: str) -> NoReturn:
        raise RuleError(f"{self.origin}:{line}: {message}")

    def header(self, text: str, line: int) -> None:
        """A line `; @KIND NAME`: the open section closes, this one opens."""
        if self.depth:
            self.fail(self.start, f"unbalanced parentheses: this rule is not closed when line {line} starts a section")
        words = _HEADER.sub("", text, count=1).split()
        if len(words) != 2 or words[0] not in KINDS:
            self.fail(line, f"a section starts with `; @shape NAME` or `; @dtype NAME`, not {text!r}")
        self.close()
        kind, name = words
        if (kind, name) in self.sections:
            self.fail(
                line, f"section `; @{kind} {name}` is defined twice (first at line {self.sections[kind, name].line})"
            )
        self.section = (kind, name, line)

    def close(self) -> None:
        """The open section done: it must hold a rule, and a dtype section exactly one (one name per op)."""
        if self.section is None:
            return
        kind, name, line = self.section
        if not self.rules or (kind == "dtype" and len(self.rules) != 1):
            holds = "one" if kind == "dtype" else "at least one"
            self.fail(line, f"section `; @{kind} {name}` holds {len(self.rules)} rules: a {kind} section holds {holds}")
        self.sections[kind, name] = Section(kind, name, line, tuple(self.rules))
        self.rules = []

    def code(self, text: str, line: int) -> None:
        """A line's text before its comment: characters of rules, placeholders checked."""
        for placeholder in _PLACEHOLDER.findall(text):
            if placeholder not in PLACEHOLDERS:
                self.fail(line, f"unknown placeholder {{{placeholder}}}; the placeholders are {{op}} and {{pattern}}")
        if {"{", "}"} & set(_PLACEHOLDER.sub("", text)):
            self.fail(line, "a brace that opens or closes no placeholder ({op} or {pattern})")
        for char in text:
            if not self.depth and char == ")":
                self.fail(line, "unbalanced parentheses: a ')' that closes nothing")
            if not self.depth and not char.isspace():
                if char != "(":
                    self.fail(line, f"{char!r} outside a rule: a section holds (rule ...) commands and `;` comments")
                if self.section is None:
                    self.fail(
                        line, "a rule outside a section (one starts at a line `; @shape NAME` or `; @dtype NAME`)"
                    )
                self.start = line
            self.depth += (char == "(") - (char == ")")
            self.rule.append(char)
            if not self.depth and char == ")":
                self.finish()
        self.rule.append(" ")

    def finish(self) -> None:
        rule = " ".join("".join(self.rule).split())
        if not rule.startswith("(rule "):
            self.fail(self.start, f"only (rule ...) commands may stand in a section, not {rule[:40]!r}")
        self.rules.append(rule)
        self.rule = []


def parse(text: str, origin: str) -> RuleFile:
    """The sections of a file of shape and dtype rules; a RuleError naming the file and line where it is malformed
    (unbalanced parentheses, a rule outside a section, a section defined twice or empty, an unknown placeholder)."""
    parser = _Parser(origin)
    for line, raw in enumerate(text.splitlines(), 1):
        code = raw.partition(";")[0]
        if not code.strip() and _HEADER.match(raw.strip()):
            parser.header(raw.strip(), line)
        else:
            parser.code(code, line)
    if parser.depth:
        parser.fail(parser.start, "unbalanced parentheses: this rule is not closed at the end of the file")
    parser.close()
    return RuleFile(origin, parser.sections)


@cache
def shapes_file() -> RuleFile:
    """eqsat/ops/shapes.egg, the op table's shape and dtype rules (read once)."""
    path = resources.files("eqsat.ops") / "shapes.egg"
    return parse(path.read_text(), str(path))
