"""optimize()'s options, each declared once (`Options`: its type, default and one-line doc), checked where they are
given and frozen: every later stage reads them, none changes them.

`Options(...)` checks what does not need the function (so that `@optimize(extractor="x")` fails where it is
written); `resolve(fun, options)` then resolves argument numbers and names against the function, as jax.jit does,
loads the device profile and collects the rules. optimize's signature, the command line's flags and the guide's
table of options are held to these declarations by tests/test_options_once.py.
"""

import dataclasses
import inspect
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jax
from jax._src import api_util  # jax.jit's own argnums resolution

from eqsat.backends.memory import MEMORY_OPTIMIZED
from eqsat.egraph.rule_sources import RuleSource, collect
from eqsat.egraph.saturate import Saturation
from eqsat.extract.cost import Profile, load_profile
from eqsat.extract.extractors import EXTRACT_SECONDS
from eqsat.extract.widen import GROUP as WIDEN_GROUP
from eqsat.numerics import guard
from eqsat.plans.buckets import Buckets
from eqsat.support.background import ON_BY_DEFAULT

EXTRACTORS = ("greedy", "ilp", "auto")


@dataclass(frozen=True)
class Limits:
    """The budgets of optimize(), each under the name it keeps down to the layer that spends it: saturation's
    (iterations, nodes, seconds: when one stops it, the best plan so far is used and the plan says which),
    extraction's (extract_seconds), the kernel timings' (measure_seconds, timing_transfer), validation's
    (blame_seconds) and the guard's (guard_seconds)."""

    iterations: int = Saturation.iterations
    nodes: int = Saturation.nodes
    seconds: float = Saturation.seconds
    extract_seconds: float = EXTRACT_SECONDS  # the ILP's (and the sharing pass's) budget when extractor="auto" or "ilp"
    # measuring kernels the timing cache lacks (extract/timing.py), per signature; 0 prices them by roofline alone
    measure_seconds: float = 10.0
    # a kernel measured at another shape within this factor of its roofline is priced from there, not measured
    # again (extract/timing.py); 0 measures every new shape
    timing_transfer: float = 4.0
    blame_seconds: float = 20.0  # after a failed validation, the search for the rules the mismatch depends on
    # after validation, timing the plan against the original (eqsat/numerics/guard.py); 0 keeps plans unmeasured
    guard_seconds: float = field(default_factory=lambda: guard.DEFAULT_SECONDS)

    def __post_init__(self) -> None:
        """Counts are whole numbers, times and factors numbers, none negative: a wrong limit is refused here,
        not found in the middle of planning (where eqsat's own failures fall back to the original)."""
        for name, value in vars(self).items():
            whole = name in ("iterations", "nodes")
            if isinstance(value, bool) or not isinstance(value, numbers.Integral if whole else numbers.Real):
                kind = "a whole number" if whole else "a number"
                raise TypeError(f"eqsat.Limits({name}={value!r}): {name} must be {kind}")
            if not value >= 0:  # NaN too
                raise ValueError(f"eqsat.Limits({name}={value!r}): {name} must be 0 or more")
        if 0 < self.timing_transfer < 1:
            raise ValueError(
                f"eqsat.Limits(timing_transfer={self.timing_transfer!r}): a factor of 1 or more between the "
                "rooflines of two shapes, or 0 to measure every shape"
            )

    @property
    def saturation(self) -> Saturation:
        """Saturation's budgets, what eqsat.egraph.saturate receives."""
        return Saturation(self.iterations, self.nodes, self.seconds)


def about(doc: str, check: Callable[[str, Any], Any] | None = None, plans: str = "") -> dict[str, Any]:
    """An option's declaration besides its field's name, type and default (dataclass field metadata): its one-line
    doc (optimize's help, the command line's flags and the guide's table show it); `check`, a function of the
    option's name and a given value that returns the value kept or raises a TypeError or ValueError saying what the
    option takes; and `plans`: "shared" where two optimize() of one function share their plans only if the option
    agrees, "stored" where the plans kept across processes are keyed by it too."""
    return {"doc": doc, "check": check, "plans": plans}


def _flag(name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} takes True or False, got {value!r:.80}")
    return value


def _count(least: int, what: str, optional: bool = False) -> Callable[[str, Any], Any]:
    """The check of a whole number of at least `least` (or None, where optional)."""

    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            took = f"{what} (an int >= {least}){' or None' if optional else ''}"
            raise ValueError(f"{name} takes {took}, got {value!r:.80}")
        return value

    return check


def _instance(kind: type, expected: str) -> Callable[[str, Any], Any]:
    """The check of a value of this kind, or None; else a TypeError that names the option and what it takes."""

    def check(name: str, value: Any) -> Any:
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name} takes {expected}, got {type(value).__name__}: {value!r:.80}")
        return value

    return check


def _extractor(name: str, value: Any) -> Any:
    if value not in EXTRACTORS:
        raise ValueError(f"{name} must be 'greedy', 'ilp' or 'auto', got {value!r:.80}")
    return value


def _group_names(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} takes a sequence of rule group names such as ('algebra', 'fold'), got {value!r:.80}")
    return tuple(value)


def _checked_rules(name: str, rules: Any) -> Any:
    """rules= as given, once it is of a kind collect() reads: a path, egglog text, or a sequence of them."""
    items = [rules] if isinstance(rules, str | Path) else rules
    if rules is not None and not (isinstance(items, Sequence) and all(isinstance(r, str | Path) for r in items)):
        raise TypeError(
            f"rules takes rule file paths or egglog text (a str, a Path, or a list of them), got {rules!r:.80}"
        )
    if any(isinstance(r, str) and not r.strip() for r in items or ()):
        raise ValueError(
            "rules has an empty string; it takes rule file paths or egglog text such as "
            "'(rewrite (Add a b) (Add b a) :name \"add-swap\")'"
        )
    return rules


def as_tuple(option: str, argnums: int | Sequence[int]) -> tuple[int, ...]:
    """Argument numbers as a tuple: one given alone, or a sequence of them."""
    argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not all(isinstance(i, int) for i in argnums):
        raise TypeError(f"{option} takes an int or a sequence of ints, got {argnums!r:.80}")
    return argnums


@dataclass(frozen=True, kw_only=True)
class Options:
    """optimize()'s options, each declared here once: its name, type, default and one-line doc (the metadata). A
    value given is checked where it is given and kept in the form its check returns (numbers as a tuple)."""

    target: str = field(
        default="cpu",
        metadata=about("the device profile the plan is chosen for: cpu, a100, h100, h200, tpu-v5e", plans="shared"),
    )
    rules: Sequence[str | Path] | str | Path | None = field(
        default=None,
        metadata=about("extra rule files (paths) or egglog text, added to the built-in groups", _checked_rules),
    )
    disabled_rules: Sequence[str] = field(
        default=(),
        metadata=about(
            'built-in rule groups to switch off (file stems under rules/); "low-precision" keeps every narrow rounding',
            _group_names,
        ),
    )
    static_argnums: int | Sequence[int] | None = field(
        default=None, metadata=about("as in jax.jit: arguments traced as constants", plans="shared")
    )
    static_argnames: str | Sequence[str] | None = field(
        default=None, metadata=about("as in jax.jit: static arguments by name", plans="shared")
    )
    params_argnums: int | Sequence[int] = field(
        default=(),
        metadata=about(
            "the parameters (weights), fixed across calls: work on them alone is free, done once by `prepare`",
            as_tuple,
            plans="shared",
        ),
    )
    validate: bool = field(
        default=True,
        metadata=about(
            "compare each signature's first call with the original; on a mismatch warn and run the original",
            _flag,
            plans="shared",
        ),
    )
    limits: Limits | None = field(
        default=None,
        metadata=about(
            "eqsat.Limits: the budgets of saturation, extraction, measuring, blame and the guard (None: the defaults)",
            _instance(Limits, "eqsat.Limits(iterations=..., nodes=..., seconds=...)"),
            plans="stored",
        ),
    )
    extractor: str = field(
        default="auto",
        metadata=about(
            '"greedy", "ilp" or "auto" (both, the ILP within its budget, the cheaper kept)', _extractor, plans="stored"
        ),
    )
    autotune: int = field(
        default=0,
        metadata=about(
            "compile and measure this many candidate plans and the original on this machine, keep the fastest",
            _count(0, "a number of candidate plans to measure"),
            plans="stored",
        ),
    )
    memory_budget: int | None = field(
        default=None,
        metadata=about(
            "bytes: a cost term in extraction, XLA:CPU's memory-optimized schedule, a gradient over it rematerialized",
            _count(1, "a number of bytes", optional=True),
            plans="stored",
        ),
    )
    cache_size: int = field(
        default=64,
        metadata=about(
            "how many signatures' plans are kept, the least recently used dropped first",
            _count(1, "how many signatures' plans to keep"),
            plans="shared",
        ),
    )
    buckets: Buckets | None = field(
        default=None,
        metadata=about(
            "eqsat.Buckets: dynamic shapes, padded up to shared sizes",
            _instance(Buckets, "eqsat.Buckets(sizes=(8, 16, 32), argnums=(1,))"),
        ),
    )
    background: bool | None = field(
        default=None,
        metadata=about("plan on a thread while jax.jit's program runs (None: on, unless EQSAT_BACKGROUND=0)", _flag),
    )
    donate_argnums: int | Sequence[int] | None = field(
        default=None, metadata=about("as in jax.jit: arguments whose buffers a call may reuse")
    )
    donate_argnames: str | Sequence[str] | None = field(
        default=None, metadata=about("as in jax.jit: donated arguments by name")
    )
    jit_options: Mapping[str, Any] = field(
        default=MappingProxyType({}),
        metadata=about(
            "jax.jit's other options, each a keyword of its own (in_shardings=..., ...), passed to jax.jit",
            lambda _, given: MappingProxyType(dict(given)),
        ),
    )

    def __post_init__(self) -> None:
        """Each value checked by its option's own check, and kept as the check returns it."""
        for declared in dataclasses.fields(Options):
            check = declared.metadata["check"]
            if check is not None:
                object.__setattr__(self, declared.name, check(declared.name, getattr(self, declared.name)))


OPTIONS = {declared.name: declared for declared in dataclasses.fields(Options)}


@dataclass(frozen=True, kw_only=True)
class ResolvedOptions(Options):
    """One optimize()'s options resolved against its function, as every later stage reads them: argument numbers and
    names as jax.jit resolves them (tuples), `limits` and `background` filled in where None, and what options lead
    to where that is a thing of its own, under a name of its own (`from`: the options it comes from)."""

    # the device profile `target` names, loaded (with no widening where disabled_rules says so): the prices planning
    # spends, where the name is what plans are shared by
    target_profile: Profile = field(metadata={"from": ("target", "disabled_rules")})
    # the built-in groups in use (less disabled_rules and those the profile disables), then `rules`, each checked
    rule_sources: tuple[RuleSource, ...] = field(metadata={"from": ("rules", "disabled_rules")})
    named: bool  # fun has a signature, which jax.jit resolves argument names against

    @property
    def rule_texts(self) -> tuple[tuple[str, str], ...]:
        return tuple((r.origin, r.text) for r in self.rule_sources)

    @property
    def settings(self) -> tuple:
        """What makes two optimize() of one function share their plans: the rules and the options declared so."""
        return (self.rule_texts, *self._keyed("shared", "stored"))

    @property
    def store_settings(self) -> tuple:
        """What decides a plan besides the program: part of the key plans are kept by across processes."""
        return (repr(self.target_profile), self.rule_texts, *self._keyed("stored"))

    def _keyed(self, *plans: str) -> tuple:
        return tuple(getattr(self, name) for name, declared in OPTIONS.items() if declared.metadata["plans"] in plans)

    def dispatch_options(self) -> dict[str, Any]:
        """The options of the jax.jit that runs the plans: the user's, the argument numbers and names resolved,
        and under a memory budget XLA:CPU's memory-optimized schedule (an option other backends do not take)."""
        options = dict(self.jit_options, static_argnums=self.static_argnums, donate_argnums=self.donate_argnums)
        if self.memory_budget is not None and jax.default_backend() == "cpu":
            options["compiler_options"] = {**MEMORY_OPTIMIZED, **(options.get("compiler_options") or {})}
        # the names as resolved, even () given explicitly (else jax.jit would take them from the numbers again);
        # none for a function without a signature, where jax.jit refuses any, even ()
        if self.named:
            options.update(static_argnames=self.static_argnames, donate_argnames=self.donate_argnames)
        return options


def resolve(fun: Callable[..., Any], options: Options) -> ResolvedOptions:
    """The options of optimize(fun, ...) resolved against fun."""
    target_profile = load_profile(options.target)
    if WIDEN_GROUP in options.disabled_rules:  # extract/widen.py widens nothing where no rounding is priced
        target_profile = dataclasses.replace(target_profile, narrow_rounding=0.0)
    groups = tuple(name for name in (*options.disabled_rules, *target_profile.disabled_rules) if name != WIDEN_GROUP)
    rule_sources = tuple(collect(options.rules, groups))
    # jax.jit's own resolution: names for numbers and numbers for names, checked against the signature
    signature = api_util.fun_signature(fun)
    donate_argnums, donate_argnames, static_argnums, static_argnames = api_util.resolve_argnums(
        fun, signature, options.donate_argnums, options.donate_argnames, options.static_argnums, options.static_argnames
    )
    params_argnums = _checked_argnums(fun, options.params_argnums, "params_argnums")
    if set(params_argnums) & set(static_argnums):
        raise ValueError(f"an argument cannot be both static and a parameter: {params_argnums}")
    given = {name: getattr(options, name) for name in OPTIONS}
    return ResolvedOptions(
        **{
            **given,
            "static_argnums": tuple(static_argnums),
            "static_argnames": tuple(static_argnames),
            "donate_argnums": tuple(donate_argnums),
            "donate_argnames": tuple(donate_argnames),
            "limits": options.limits or Limits(),
            "background": ON_BY_DEFAULT if options.background is None else options.background,
        },
        target_profile=target_profile,
        rule_sources=rule_sources,
        named=signature is not None,
    )


def described(name: str) -> tuple[str, str, str, str]:
    """An option as optimize's help and the guide's table show it: its name, type, default and doc."""
    declared = OPTIONS[name]
    kind = re.sub(r"\b(?:\w+\.)+", "", inspect.formatannotation(declared.type))  # Path, not pathlib.Path
    default = declared.default
    return name, kind, repr(dict(default) if isinstance(default, Mapping) else default), declared.metadata["doc"]


def options_help() -> str:
    """Every option, two lines each, for optimize's docstring (help(eqsat.optimize)), indented as a docstring is."""
    lines = (
        f"        {name}: {kind} = {default}\n            {doc}" for name, kind, default, doc in map(described, OPTIONS)
    )
    return "\n    Options:\n\n" + "\n".join(lines) + "\n"


def _checked_argnums(fun: Callable[..., Any], argnums: tuple[int, ...], option: str) -> tuple[int, ...]:
    """Argument numbers checked against fun's positional parameters, as jax.jit checks static_argnums."""
    signature = api_util.fun_signature(fun)
    if signature is None or any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
        return argnums
    n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in signature.parameters.values())
    bad = [i for i in argnums if not -n <= i < n]
    if bad:
        raise ValueError(f"{option}={argnums} names argument(s) {bad}, but the function takes {n} positional")
    return argnums
