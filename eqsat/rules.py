"""Rule sources: the built-in groups under rules/ and the user's files or strings, checked at load."""

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import egglog.bindings as egg

from eqsat.encode import prelude
from eqsat.errors import RuleError


@dataclass(frozen=True)
class RuleSource:
    name: str  # group name (file stem) or "<rules string N>"
    origin: str  # file path or the same "<rules string N>", used in messages
    text: str


def builtin_groups() -> dict[str, RuleSource]:
    folder = resources.files("rules")
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
        raise RuleError(f"unknown rule group(s) {unknown} in disabled_rules; the groups are {sorted(groups)}")
    sources = [src for name, src in groups.items() if name not in disabled]  # a target may disable one too
    if extra is None:
        extra = []
    elif isinstance(extra, str | Path):
        extra = [extra]
    loaded = {str(Path(src.origin).resolve()) for src in sources}
    for i, item in enumerate(extra):
        src = _user_source(item, i)
        if src.origin.startswith("<") or str(Path(src.origin).resolve()) not in loaded:
            sources.append(src)  # a built-in group named by its file is loaded once, even where a target disabled it
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


REAL_MARK = "; @real"  # a comment line right above a rule: it holds for real numbers, not in floating point


@dataclass(frozen=True)
class Rule:
    """One rule of a source: the names saturation reports its matches under ("=>" / "<=" for a birewrite's two
    directions; egglog's text of the rule where it has no :name), whether the line above it is the REAL_MARK,
    and where it stands in the source's text (byte offsets)."""

    names: tuple[str, ...]
    real: bool
    start: int
    stop: int


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
        above = raw[: inner.span.i].decode().rstrip().rsplit("\n", 1)[-1].strip()
        out.append(Rule(names, above.startswith(REAL_MARK), inner.span.i, inner.span.j))
    return out


def rule_names(src: RuleSource) -> list[str]:
    """The names of a source's rules, in file order."""
    return [name for rule in rules_in(src) for name in rule.names]


def real_rules(sources: list[RuleSource]) -> frozenset[str]:
    """The names of the rules marked `; @real` (re-association, distributivity, folding a scale into weights): they
    hold for real numbers, and in floating point change rounding."""
    return frozenset(name for src in sources for rule in rules_in(src) if rule.real for name in rule.names)


def check_syntax(sources: list[RuleSource]) -> None:
    """Parse and declare the rule sources, in order, on an empty e-graph with the prelude; errors (a malformed rule,
    a rule name used twice) name file and line."""
    graph = egg.EGraph()
    graph.run_program(*graph.parse_program(prelude()))
    for src in sources:
        try:
            graph.run_program(*graph.parse_program(src.text, filename=src.origin))
        except egg.EggSmolError as error:
            raise RuleError(located_message(error, src)) from None


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
