"""Each option of eqsat.optimize is declared once, in eqsat.plans.options.Options (its name, type, default and one-line
doc): optimize's signatures, the command line's flags and the guide's table are held to the declarations here, and each
option keeps its name from the user down to the layer that spends it."""

import argparse
import ast
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import eqsat
from eqsat.backends import memory
from eqsat.checks import budget
from eqsat.extract.cost import load_profile, profile_names
from eqsat.extract.plan import build_plan
from eqsat.plans import plan_cache
from eqsat.plans.options import OPTIONS, Options, ResolvedOptions, described, resolve
from eqsat.plans.signature import inputs_of, signature_of
from eqsat.tools.cli import optimize_options
from eqsat.tools.main import command_line

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide" / "optimize.md"
TABLE_BEGIN = "<!-- the options: generated from eqsat.plans.options.Options, tests/test_options_once.py checks it -->"
TABLE_END = "<!-- end of the options -->"


def options_table() -> str:
    """The guide's table of the options, as the declarations make it."""
    rows = ["| option | type | default | what it does |", "|---|---|---|---|"]
    rows += [f"| `{name}` | `{kind}` | `{default}` | {doc} |" for name, kind, default, doc in map(described, OPTIONS)]
    return "\n".join(rows)


def test_every_option_has_a_one_line_doc_and_says_what_keys_plans():
    for name, declared in OPTIONS.items():
        doc = declared.metadata["doc"]
        assert doc and "\n" not in doc and len(doc) <= 110, name
        assert declared.metadata["plans"] in ("", "shared", "stored"), name
    assert set(profile_names()) <= set(described("target")[3].replace(",", " ").split()), "name every profile"


def test_optimize_signatures_are_the_options_field_for_field():
    """The implementation (what help() and inspect show) and both typed forms (what IDEs show)."""
    hints = typing.get_type_hints(Options)
    forms = [*typing.get_overloads(eqsat.optimize), eqsat.optimize]
    assert len(forms) == 3
    for form in forms:
        fun, *keywords, rest = inspect.signature(form).parameters.values()
        assert fun.name == "fun" and fun.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert [p.name for p in keywords] == [name for name in OPTIONS if name != "jit_options"]
        for p in keywords:
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, p.name
            assert p.default == OPTIONS[p.name].default, p.name
            assert p.annotation == hints[p.name], p.name
        assert (rest.name, rest.kind) == ("jit_options", inspect.Parameter.VAR_KEYWORD)
    direct, decorator, _ = (typing.get_type_hints(form)["return"] for form in forms)
    assert direct is eqsat.Optimized and decorator == Callable[[Callable[..., Any]], eqsat.Optimized]
    assert all(described(name)[3] in eqsat.optimize.__doc__ for name in OPTIONS)  # help(eqsat.optimize)


def test_both_forms_make_an_optimized():
    def f(x):
        return jnp.sin(x) * 2

    assert isinstance(eqsat.optimize(f, background=False), eqsat.Optimized)
    made = eqsat.optimize(cache_size=3, in_shardings=None)(f)
    assert isinstance(made, eqsat.Optimized) and made.options.cache_size == 3
    assert made.options.jit_options == {"in_shardings": None}


def test_the_guides_table_is_the_options():
    text = GUIDE.read_text()
    assert TABLE_BEGIN in text and TABLE_END in text
    written = text.split(TABLE_BEGIN)[1].split(TABLE_END)[0].strip()
    assert written == options_table(), f"paste this table into {GUIDE.relative_to(REPO)}:\n{options_table()}"


def _commands() -> dict[str, argparse.ArgumentParser]:
    found = command_line()._subparsers._group_actions[0].choices  # argparse keeps its subcommands there
    return {name: found[name] for name in ("optimize", "tune", "census", "tpu-check", "demo")}


def test_the_command_lines_flags_are_the_options():
    """A flag that sets an option is named after it (`--no-NAME` for one on by default), defaults to its default
    (or to the command's own, here tpu-check's target) and shows its doc."""
    own_defaults = {("tpu-check", "target"): "tpu-v5e"}
    seen = set()
    for command, parser in _commands().items():
        for action in parser._actions:
            named = {flag.removeprefix("--no-").removeprefix("--").replace("-", "_") for flag in action.option_strings}
            if not named & set(OPTIONS):
                continue
            assert action.dest in named, f"{command} {action.option_strings} sets {action.dest}"
            name = action.dest
            seen.add(name)
            flag = f"--{'no-' if OPTIONS[name].default is True else ''}{name.replace('_', '-')}"
            assert action.option_strings[0] == flag, (command, action.option_strings)
            assert action.default == own_defaults.get((command, name), OPTIONS[name].default), (command, name)
            assert described(name)[3] in action.help, (command, name)
    assert {"target", "rules", "disabled_rules", "params_argnums", "extractor", "validate", "memory_budget"} <= seen


def test_the_command_line_passes_the_options_under_their_names():
    parser = command_line()
    args = parser.parse_args(["optimize", "m:f", "--disable", "fold", "--no-validate", "--params-argnums", "0"])
    given = optimize_options(args)
    assert given == {
        "target": "cpu", "rules": None, "disabled_rules": ["fold"], "params_argnums": [0], "validate": False,
        "extractor": "auto",
    }  # fmt: skip
    Options(**given)  # every value of a kind optimize takes
    args = parser.parse_args(["tpu-check", "m:f", "--memory-budget", "1000"])
    assert optimize_options(args) == {"target": "tpu-v5e", "memory_budget": 1000}


def _options_read() -> dict[str, set[str]]:
    """Each attribute read off a resolved options object (`x.options.NAME`, or `options.NAME` where a module
    imports eqsat.plans.options), with the modules that read it; options.py itself left out."""
    found: dict[str, set[str]] = {}
    for path in sorted(p for folder in ("eqsat", "extract", "backends") for p in (REPO / folder).rglob("*.py")):
        source = path.read_text()
        if path.name == "options.py":
            continue
        by_name = "eqsat.plans.options import" in source
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            if (isinstance(value, ast.Attribute) and value.attr == "options") or (
                by_name and isinstance(value, ast.Name) and value.id == "options"
            ):
                found.setdefault(node.attr, set()).add(path.relative_to(REPO).as_posix())
    return found


def test_every_option_keeps_its_name_down_to_its_consumer():
    """Every name read off the options is one they have (a renamed option leaves no reader behind), and each option
    is read under its own name, passed to jax.jit under it, or resolved into a value of its own (a field of
    ResolvedOptions that names it in `from`) that is read in turn."""
    read = _options_read()
    members = {name for name, _ in inspect.getmembers(ResolvedOptions)} | set(ResolvedOptions.__dataclass_fields__)
    assert not set(read) - members, f"read but not an option: {sorted(set(read) - members)}"

    def f(x, y):
        return x + y

    resolved = resolve(f, Options(static_argnames="y", jit_options={"keep_unused": True}))
    to_jit = set(resolved.dispatch_options()) & set(inspect.signature(jax.jit).parameters)
    derived = {
        source: name
        for name, declared in ResolvedOptions.__dataclass_fields__.items()
        for source in declared.metadata.get("from", ())
        if name in read
    }
    unread = [name for name in OPTIONS if name not in read and name not in to_jit and name not in derived]
    assert unread == ["jit_options"] and "keep_unused" in to_jit, unread


def test_the_layers_that_spend_an_option_take_it_under_its_name():
    spenders = {
        "memory_budget": [budget.check_budget, budget.warn_over_budget, memory.fit_budget, eqsat.fit_budget],
        "donate_argnums": [budget.check_budget],
        "cache_size": [plan_cache.shared_plans],
        "extractor": [build_plan],
        "static_argnums": [signature_of],
        "static_argnames": [signature_of],
        "params_argnums": [inputs_of],
        "target": [load_profile],
    }
    for name, functions in spenders.items():
        for function in functions:
            assert name in inspect.signature(function).parameters, (name, function.__qualname__)
