"""Rule sources: the built-in groups under rules/ and the user's files or strings, checked at load."""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import egglog.bindings as egg

from eqsat.capture.encode import prelude
from eqsat.support.errors import RuleError


@dataclass(frozen=True)
class RuleSource:
    name: str  # group name (file stem) or "<rules string N>"
    origin: str  # file path or the same "<rules string N>", used in messages
    text: str


def builtin_groups() -> dict[str, RuleSource]:
    folder = resources.files("eqsat.rules")
    return {
        Path(entry.name).stem: RuleSource(Path(entry.name).stem, str(entry), entry.read_text())
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".egg")
    }


def collect(extra: list[str | Path] | str | Path | None = None, disabled: tuple[str, ...] = ()) -> list[RuleSource]:
    """The built-in groups (less `disabled`), then the user's rule files and strings, each checked."""
    groups = builtin_groups()
    unknown = sorted(set(disabled) - set(groups))
    if unknown:
        raise RuleError(
            f"unknown rule group(s) {unknown} in disabled_rules; the groups are {sorted(groups)}, and "
            "'low-precision' keeps narrow roundings"
        )
    sources = [src for name, src in groups.items() if name not in disabled]  # a target may disable one too
    if extra is None:
        extra = []
    elif isinstance(extra, str | Path):
        extra = [extra]
    loaded = {str(Path(src.origin).resolve()) for src in sources}
    builtin_only = True
    for i, item in enumerate(extra):
        src = _user_source(item, i)
        check_commands(src)
        if src.origin.startswith("<") or str(Path(src.origin).resolve()) not in loaded:
            sources.append(src)  # a built-in group named by its file is loaded once, even where a target disabled it
            builtin_only = False
    if not builtin_only:
        # the user's rules parsed with the built-in ones (a name used twice is an error); the built-in groups alone
        # are checked by the test suite, and parsing them took 0.5 s of every process's first optimize()
        check_syntax(sources)
    return sources


def _user_source(item: str | Path, index: int) -> RuleSource:
    if isinstance(item, Path) or (isinstance(item, str) and "(" not in item):
        path = Path(item)
        if not path.is_file():
            raise RuleError(f"rule file {str(path)!r} does not exist (rules= takes paths or egglog text)")
        return RuleSource(path.stem, str(path), path.read_text())
    if not isinstance(item, str):
        raise RuleError(f"rules= takes paths or strings of egglog text, got {type(item).__name__}")
    label = f"<rules string {index + 1}>"
    return RuleSource(label, label, item)


# Comment lines right above a rule that say it holds for real numbers, not in floating point:
REAL_MARK = "; @real"  # its new intermediates may overflow or underflow where the original's do not (watched)
ROUNDING_MARK = "; @rounding"  # the same terms in another order, or a form in range wherever the original is


@dataclass(frozen=True)
class Rule:
    """One rule of a source: the names saturation reports its matches under ("=>" / "<=" for a birewrite's two
    directions; egglog's text of the rule where it has no :name), the mark on the line above it (REAL_MARK,
    ROUNDING_MARK or none), and where it stands in the source's text (byte offsets)."""

    names: tuple[str, ...]
    mark: str
    start: int
    stop: int
    line: int = 0
    command: Any = field(default=None, compare=False, repr=False)  # egglog's parsed command (patterns for verify)


def rules_in(src: RuleSource) -> list[Rule]:
    """The rules of a source, in file order."""
    raw = src.text.encode()
    out = []
    for command in egg.EGraph().parse_program(src.text, filename=src.origin):
        inner = getattr(command, "rewrite", None) or getattr(command, "rule", None)
        if inner is None:
            continue
        if hasattr(command, "rewrite"):
            name = inner.name or " ".join(str(command).split())
            names = (f"{name}=>", f"{name}<=") if type(command).__name__ == "BiRewriteCommand" else (name,)
        else:
            names = (inner.name or str(command),)
        before = raw[: inner.span.i].decode()
        above = before.rstrip().rsplit("\n", 1)[-1].strip()
        line = before.count("\n") + 1
        mark = next((m for m in (REAL_MARK, ROUNDING_MARK) if above.startswith(m)), "")
        out.append(Rule(names, mark, inner.span.i, inner.span.j, line, command))
    return out


def rule_locations(sources: list[RuleSource]) -> dict[str, str]:
    """Each rule name -> 'FILE:LINE' where the rule stands, to name a rule in a message."""
    return {name: f"{src.origin}:{rule.line}" for src in sources for rule in rules_in(src) for name in rule.names}


def keeping(sources: list[RuleSource], keep: Callable[[list[str]], bool]) -> list[RuleSource]:
    """The sources with only the rules whose names `keep` accepts: the others blanked out in place, so that
    declarations, `; @real` marks and every line and column stay where the file has them."""
    out = []
    for src in sources:
        raw = bytearray(src.text.encode())
        for rule in rules_in(src):
            if not keep(list(rule.names)):
                span = slice(rule.start, rule.stop)
                raw[span] = bytes(b if b == ord("\n") else ord(" ") for b in raw[span])
        out.append(RuleSource(src.name, src.origin, raw.decode()))
    return out


ALLOWED = (
    "a rule file holds only rule, rewrite and birewrite commands (with :name, :when, :subsume; the rewrites' "
    "default ruleset) and ; comments"
)
_RULE_HEADS = ("rule", "rewrite", "birewrite")
_RULE_COMMANDS = ("RewriteCommand", "BiRewriteCommand", "RuleCommand")
_ANALYSIS_FACTS = ("shape", "dtype")  # derived by the op table's analysis ruleset alone
_HEAD = re.compile(rb"\(\s*([^\s()]*)")


def check_commands(src: RuleSource) -> None:
    """Refuse, before egglog runs anything, every command of a user's rule source that is not a rule: includes,
    input/output, push/pop, run, extract, print, set-option and declarations could read or write files, run
    unbounded or change the prelude. Rules may not join a ruleset (the analysis is the op table's) nor set a
    tensor's shape or dtype; every rule carries a :name. Errors name file, line and column and say what is
    allowed."""
    raw = src.text.encode()
    forms, unclosed = _top_level_forms(raw)
    for start, head in forms:  # before egglog parses: its parser reads (include ...) files
        if head not in _RULE_HEADS:
            raise RuleError(f"{_where(src, raw, start)}: ({head} ...) is not allowed: {ALLOWED}")
    if unclosed is not None:  # egglog reports it at the end of the text
        opened = _HEAD.match(raw, unclosed)
        raise RuleError(
            f"{_where(src, raw, unclosed)}: invalid rule: the parenthesis of ({opened.group(1).decode()} ...) that "
            "opens here is never closed"
        )
    try:
        commands = egg.EGraph().parse_program(src.text, filename=src.origin)
    except egg.EggSmolError as error:
        raise RuleError(located_message(error, src)) from None
    for command in commands:
        kind = type(command).__name__
        inner = command.rewrite if hasattr(command, "rewrite") else command.rule
        if kind not in _RULE_COMMANDS:  # the heads were checked; this guards against a desugaring surprise
            raise RuleError(f"{_where(src, raw, inner.span.i)}: {kind} is not allowed: {ALLOWED}")
        start = inner.span.i
        ruleset = command.name if hasattr(command, "rewrite") else inner.ruleset
        if ruleset:
            raise RuleError(
                f"{_where(src, raw, start)}: :ruleset {ruleset} is not allowed: user rules run with the rewrites, "
                f"under the limits; the analysis ruleset is the op table's ({ALLOWED})"
            )
        for action in inner.head if kind == "RuleCommand" else ():
            if type(action).__name__ == "Set" and action.lhs in _ANALYSIS_FACTS:
                raise RuleError(
                    f"{_where(src, raw, action.span.i)}: (set ({action.lhs} ...)) is not allowed: shapes and dtypes "
                    f"are derived by the op table's analysis; a rule may guard on them, not set them ({ALLOWED})"
                )
        if not inner.name:
            raise RuleError(
                f'{_where(src, raw, start)}: this rule has no :name (add one, e.g. :name "my-factor"): plans count '
                "the rules that fired, and validation blames a wrong result on rules, by their names"
            )


def _top_level_forms(raw: bytes) -> tuple[list[tuple[int, str]], int | None]:
    """(offset, head symbol) of each top-level form, skipping ; comments and strings (a stray atom at top level
    is reported with head '', as egglog would refuse it too), and the offset of the innermost parenthesis left
    open at the end, if any."""
    forms, opened, pos = [], [], 0
    while pos < len(raw):
        c = raw[pos : pos + 1]
        if c == b";":
            end = raw.find(b"\n", pos)
            pos = len(raw) if end < 0 else end
        elif c == b'"':
            pos += 1
            while pos < len(raw) and raw[pos : pos + 1] != b'"':
                pos += 2 if raw[pos : pos + 1] == b"\\" else 1
        elif c == b"(":
            if not opened:
                head = _HEAD.match(raw, pos)
                forms.append((pos, head.group(1).decode() if head else ""))
            opened.append(pos)
        elif c == b")":
            if opened:
                opened.pop()
        elif not opened and not c.isspace():
            forms.append((pos, raw[pos:].split(None, 1)[0].decode(errors="replace")))
            while pos < len(raw) and not raw[pos : pos + 1].isspace() and raw[pos : pos + 1] not in b'();"':
                pos += 1
            continue
        pos += 1
    return forms, opened[-1] if opened else None


def _where(src: RuleSource, raw: bytes, offset: int) -> str:
    """'FILE:LINE:COL' of a byte offset."""
    line_start = raw.rfind(b"\n", 0, offset) + 1
    return f"{src.origin}:{raw.count(b'\n', 0, offset) + 1}:{offset - line_start + 1}"


def rule_names(src: RuleSource) -> list[str]:
    """The names of a source's rules, in file order."""
    return [name for rule in rules_in(src) for name in rule.names]


def real_rules(sources: list[RuleSource], marks: tuple[str, ...] = (REAL_MARK, ROUNDING_MARK)) -> frozenset[str]:
    """The names of the rules marked `; @real` (re-association, distributivity, folding a scale into weights) or
    `; @rounding` (a sum's terms in another order): they hold for real numbers, and in floating point change
    rounding. With marks=(REAL_MARK,): those whose new intermediates may leave the range, which the overflow watch
    watches."""
    return frozenset(name for src in sources for rule in rules_in(src) if rule.mark in marks for name in rule.names)


_CHECKED: set[tuple[tuple[str, str], ...]] = set()  # rule sets that passed check_syntax in this process


def check_syntax(sources: list[RuleSource]) -> None:
    """Parse and declare the rule sources, in order, on an empty e-graph with the prelude; errors (a malformed rule,
    a rule name used twice) name file and line. A set that passed once is not parsed again (0.5 s per optimize())."""
    key = tuple((src.origin, src.text) for src in sources)
    if key in _CHECKED:
        return
    graph = egg.EGraph()
    graph.run_program(*graph.parse_program(prelude()))
    for src in sources:
        try:
            graph.run_program(*graph.parse_program(src.text, filename=src.origin))
        except egg.EggSmolError as error:
            raise RuleError(located_message(error, src)) from None
    _CHECKED.add(key)


_LOCATION = re.compile(r"In (\d+):(\d+)(?:-\d+)? of ([^:]+): ?")


def located_message(error: Exception, src: RuleSource) -> str:
    """egglog's 'In L:C-C of FILE: text' turned into 'FILE:L:C: text', the usual compiler form."""
    text = str(error).strip()
    match = _LOCATION.search(text)
    if not match:
        return f"{src.origin}: invalid rule: {text}"
    line, col = match.group(1), match.group(2)
    detail = " ".join(part.strip() for part in _LOCATION.sub("", text).splitlines() if part.strip())
    return f"{src.origin}:{line}:{col}: invalid rule: {detail}"


def describe(command: object) -> str:
    """'FILE:LINE:COL: (rule text)' for a parsed rule command, to name a rule in an error."""
    inner = next((getattr(command, k) for k in ("rewrite", "rule") if hasattr(command, k)), command)
    span = str(getattr(inner, "span", ""))
    match = _LOCATION.search(span)
    rule_text = " ".join(_LOCATION.sub("", span).split()) or " ".join(str(command).split())
    where = f"{match.group(3)}:{match.group(1)}:{match.group(2)}" if match else "<rule>"
    return f"{where}: {rule_text[:300]}"
