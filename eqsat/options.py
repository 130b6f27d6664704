"""What optimize() was asked for, checked once and frozen: every later stage reads this value, none changes it.

`checked(...)` checks what does not need the function (so that `@optimize(extractor="x")` fails where it is
written); `resolve(fun, ...)` then resolves argument numbers and names against the function, as jax.jit does, loads
the device profile and collects the rules.
"""

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jax
from jax._src import api_util  # jax.jit's own argnums resolution

from eqsat import guard, rule_sources
from eqsat.backends.memory import MEMORY_OPTIMIZED
from eqsat.background import ON_BY_DEFAULT
from eqsat.extract.cost import Profile, load_profile
from eqsat.extract.extractors import EXTRACT_SECONDS
from eqsat.extract.widen import GROUP as WIDEN_GROUP
from eqsat.rule_sources import RuleSource
from eqsat.saturate import Saturation

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
    # after validation, timing the plan against the original (eqsat/guard.py); 0 keeps plans unmeasured
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
        """Saturation's budgets, what eqsat.saturate receives."""
        return Saturation(self.iterations, self.nodes, self.seconds)


@dataclass(frozen=True)
class Options:
    """One optimize()'s settings, resolved against its function."""

    target: str
    profile: Profile
    rules: tuple[RuleSource, ...]  # the built-in groups in use, then the user's, each checked
    static_argnums: tuple[int, ...]
    static_argnames: tuple[str, ...]
    donate_argnums: tuple[int, ...]
    donate_argnames: tuple[str, ...]
    params_argnums: tuple[int, ...]
    validate: bool
    limits: Limits
    extractor: str
    autotune: int
    memory_budget: int | None
    cache_size: int
    background: bool  # a call's first trace leaves its plan to the planning thread (eqsat/background.py)
    named: bool  # fun has a signature, which jax.jit resolves argument names against
    jit_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # passed to jax.jit

    @property
    def rule_texts(self) -> tuple[tuple[str, str], ...]:
        return tuple((r.origin, r.text) for r in self.rules)

    @property
    def settings(self) -> tuple:
        """What makes two optimize() of one function share their plans."""
        return (
            self.target, self.rule_texts, self.static_argnums, self.static_argnames, self.params_argnums, self.validate,
            self.limits, self.extractor, self.autotune, self.memory_budget, self.cache_size,
        )  # fmt: skip

    @property
    def store_settings(self) -> tuple:
        """What decides a plan besides the program: part of the key plans are kept by across processes."""
        return (repr(self.profile), self.rule_texts, self.limits, self.extractor, self.autotune, self.memory_budget)

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


def checked(
    *,
    target: str,
    rules: Sequence[str | Path] | str | Path | None,
    disabled_rules: Sequence[str],
    params_argnums: int | Sequence[int],
    limits: Limits | None,
    extractor: str,
    autotune: int,
    cache_size: int,
    background: bool | None,
    validate: bool,
    memory_budget: int | None,
    **rest: Any,
) -> dict[str, Any]:
    """optimize()'s keyword arguments, those that can be checked without the function checked."""
    if extractor not in EXTRACTORS:
        raise ValueError(f"extractor must be 'greedy', 'ilp' or 'auto', got {extractor!r}")
    if not isinstance(autotune, int) or isinstance(autotune, bool) or autotune < 0:
        raise ValueError(f"autotune takes a number of candidate plans to measure (an int >= 0), got {autotune!r}")
    if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 1:
        raise ValueError(f"cache_size takes how many signatures' plans to keep (an int >= 1), got {cache_size!r}")
    for name, flag in (("background", background), ("validate", validate)):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"{name} takes True or False, got {flag!r:.80}")
    if memory_budget is not None and (
        isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Integral) or memory_budget < 1
    ):
        raise ValueError(f"memory_budget takes a number of bytes (an int >= 1) or None, got {memory_budget!r:.80}")
    return dict(
        target=target,
        rules=_checked_rules(rules),
        disabled_rules=_names(disabled_rules, "disabled_rules", "rule group names such as ('algebra', 'fold')"),
        params_argnums=as_tuple(params_argnums, "params_argnums"),
        limits=checked_option(limits, Limits, "limits", "eqsat.Limits(iterations=..., nodes=..., seconds=...)"),
        extractor=extractor,
        autotune=autotune,
        cache_size=cache_size,
        background=ON_BY_DEFAULT if background is None else background,
        validate=validate,
        memory_budget=memory_budget,
        **rest,
    )


def resolve(
    fun: Callable[..., Any],
    *,
    target: str,
    rules: Sequence[str | Path] | str | Path | None,
    disabled_rules: tuple[str, ...],
    static_argnums: int | Sequence[int] | None,
    static_argnames: str | Sequence[str] | None,
    donate_argnums: int | Sequence[int] | None,
    donate_argnames: str | Sequence[str] | None,
    params_argnums: tuple[int, ...],
    validate: bool,
    limits: Limits | None,
    extractor: str,
    autotune: int,
    memory_budget: int | None,
    cache_size: int,
    background: bool,
    jit_options: dict[str, Any],
) -> Options:
    """The options of optimize(fun, ...) (checked by `checked` first), resolved against fun."""
    profile = load_profile(target)
    if WIDEN_GROUP in disabled_rules:  # extract/widen.py widens nothing where no rounding is priced
        profile = dataclasses.replace(profile, narrow_rounding=0.0)
    groups = tuple(name for name in (*disabled_rules, *profile.disabled_rules) if name != WIDEN_GROUP)
    collected = rule_sources.collect(rules, groups)
    # jax.jit's own resolution: names for numbers and numbers for names, checked against the signature
    signature = api_util.fun_signature(fun)
    donate_argnums, donate_argnames, static_argnums, static_argnames = api_util.resolve_argnums(
        fun, signature, donate_argnums, donate_argnames, static_argnums, static_argnames
    )
    params_argnums = _checked_argnums(fun, params_argnums, "params_argnums")
    if set(params_argnums) & set(static_argnums):
        raise ValueError(f"an argument cannot be both static and a parameter: {params_argnums}")
    return Options(
        target=target,
        profile=profile,
        rules=tuple(collected),
        static_argnums=tuple(static_argnums),
        static_argnames=tuple(static_argnames),
        donate_argnums=tuple(donate_argnums),
        donate_argnames=tuple(donate_argnames),
        params_argnums=params_argnums,
        validate=validate,
        limits=limits or Limits(),
        extractor=extractor,
        autotune=autotune,
        memory_budget=memory_budget,
        cache_size=cache_size,
        background=background,
        named=signature is not None,
        jit_options=MappingProxyType(dict(jit_options)),
    )


def _checked_rules(rules: Any) -> Any:
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


def _names(value: Any, option: str, expected: str) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{option} takes a sequence of {expected}, got {value!r:.80}")
    return tuple(value)


def checked_option(value: Any, kind: type, option: str, expected: str) -> Any:
    """value, where it is None or of this kind; else a TypeError that names the option and what it takes."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{option} takes {expected}, got {type(value).__name__}: {value!r:.80}")
    return value


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


def as_tuple(argnums: int | Sequence[int], option: str = "argnums") -> tuple[int, ...]:
    argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not all(isinstance(i, int) for i in argnums):
        raise TypeError(f"{option} takes an int or a sequence of ints, got {argnums!r:.80}")
    return argnums
