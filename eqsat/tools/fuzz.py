"""Differential fuzzing of the whole pipeline: random JAX programs through optimize(), under random
transformations and calling contexts, against jax.jit of the same program: jax.jit in eqsat's place under the same
transformation (a user's swap; jax.grad of a jitted function rounds otherwise than jax.jit of the whole gradient).

The programs are those `rules check` draws (eqsat/tools/generators.py: one generator per op of the table and per rule
pattern, the kernel-selection alternatives, convolution gradients and pools included), over float32, bfloat16,
float16 and int32, with their inputs packed as pytrees, their results as a dict or tuple, and the program placed
in a scan, cond, fori_loop or remat body or left straight. Each is optimized with random options (target,
extractor, parameters declared) and run under one transformation: eagerly, under jit, vmap or grad, inside a scan
body, with its parameters prepared, as the gradient program optimize(jax.grad(loss)), or eagerly with the plan left
to the background (eqsat/support/background.py) and the call after it is ready checked, or vmapped over rows through
`Buckets` at batch sizes that are padded and one that is not (half the programs mixing rows, which must run
unpadded); the first call is eager or transformed, and the other kind of call follows; then both again, the plans in
place, on the arguments with NaN, infinities, signed zeros and subnormals written over a few elements (a later call
validation does not see). A case fails when a result differs beyond the tolerance
validation uses (`mismatch`), when eqsat raises where jax.jit did not (`crash`), or when eqsat's own machinery
failed and warned (`internal`). Fallbacks (validation caught a wrong plan and the original ran) are counted.

`python -m eqsat fuzz --n N --seed S` runs N cases (`--first F`: from case F on, a long run in parts); `--only I`
re-runs case I of that seed. Deterministic: each
case is drawn from its seed and index (eqsat/tools/fuzz_cases.py).
"""

import collections
import dataclasses
import functools
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat.api import optimize
from eqsat.numerics.tolerance import beyond_conditioning, comparable, less_accurate, mismatch
from eqsat.plans.buckets import Buckets
from eqsat.plans.options import Limits
from eqsat.support.errors import EqsatWarning
from eqsat.tools.fuzz_cases import Case, case_arguments, case_function, draw_case, special_values

# small: a case must take well under a second; validation's blame search is what a failure costs, so it is short
FUZZ_LIMITS = Limits(
    iterations=4,
    nodes=2_000,
    seconds=2.0,
    extract_seconds=0.2,
    measure_seconds=0.0,
    blame_seconds=2.0,
    guard_seconds=0.0,
)

BUCKET_SIZES = (4, 8)
BUCKET_ROWS = (3, 6, 9)  # padded to 4 and 8, and above the largest bucket


@dataclass
class Outcome:
    case: Case
    status: str  # "ok" | "mismatch" | "crash" | "internal" | "invalid" (jax.jit itself refused the case)
    detail: str = ""
    fallback: bool = False  # validation found the plan wrong and ran the original
    rewritten: dict[str, int] = field(default_factory=dict)  # ops the plans introduced
    seconds: float = 0.0


FAILURES = ("mismatch", "crash", "internal")


@dataclass
class Summary:
    seed: int
    outcomes: list[Outcome]
    seconds: float

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in FAILURES]

    def _span(self) -> str:
        indices = [o.case.index for o in self.outcomes]
        return f" ({min(indices)} to {max(indices)})" if indices and min(indices) > 0 else ""

    def table(self) -> str:
        ran = [o for o in self.outcomes if o.status != "invalid"]
        rewritten = collections.Counter()
        for o in ran:
            rewritten.update(o.rewritten)
        by_transform = collections.Counter(o.case.transform for o in ran)
        lines = [
            f"seed {self.seed}: {len(self.outcomes)} cases{self._span()}, {len(ran)} run ({self.count('invalid')} "
            f"that jax.jit itself refused skipped), {self.seconds:.0f} s",
            f"  mismatches {self.count('mismatch')}, crashes {self.count('crash')}, internal failures "
            f"{self.count('internal')}, fallbacks after validation {sum(o.fallback for o in ran)}",
            f"  plans rewritten in {sum(bool(o.rewritten) for o in ran)} cases; ops introduced: "
            + ", ".join(f"{op} {n}" for op, n in rewritten.most_common()),
            "  transformations: " + ", ".join(f"{t} {n}" for t, n in sorted(by_transform.items())),
        ]
        for o in self.failures:
            lines.append(f"\n{o.status.upper()} {o.case.describe()}\n  {o.detail}".replace("\n", "\n  "))
        return "\n".join(lines)


def _loss(fun: Callable[..., Any]) -> Callable[..., Any]:
    """A scalar of fun's float results, weighted so that no two results' gradients coincide."""

    def loss(*args: Any) -> Any:
        out = jax.tree_util.tree_leaves(fun(*args))
        return sum(jnp.sum(jnp.cos(v.astype(jnp.float32)) * (k + 1)) for k, v in enumerate(out))

    return loss


def _float_args(args: tuple) -> tuple[int, ...]:
    """The positional arguments whose leaves are all floats (what grad may differentiate)."""
    return tuple(
        i
        for i, a in enumerate(args)
        if jax.tree_util.tree_leaves(a)
        and all(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree_util.tree_leaves(a))
    )


def _under(transform: str, fun: Callable[..., Any], args: tuple) -> Callable[..., Any]:
    """fun under the transformation, as a function of the case's arguments."""
    if transform == "jit":
        return jax.jit(fun)
    if transform == "vmap":  # over a new leading axis of every leaf
        return jax.vmap(fun)
    if transform == "grad":
        return jax.grad(_loss(fun), argnums=_float_args(args))
    if transform == "scan":  # called in a scan body, the arguments closed over
        return lambda *a: lax.scan(lambda c, _: (c, fun(*a)), 0, None, length=2)[1]
    if transform == "buckets":  # batches of several sizes under jax.jit (fun is a function of rows)
        return jax.jit(lambda *a: tuple(fun(*_rows(a, n)) for n in BUCKET_ROWS))
    return fun


def _batched(args: tuple) -> tuple:
    return jax.tree_util.tree_map(lambda x: jnp.stack([x, x[::-1] if x.ndim else -x]), args)


def _rows(args: tuple, n: int) -> tuple:
    """n rows of a batch: its rows, then negated (rows of both signs: zero padding wins a max of negative rows)."""
    return jax.tree_util.tree_map(lambda x: jnp.concatenate([x, -x] * n)[:n], args)


def _rowwise(fun: Callable[..., Any], mixed: bool) -> Callable[..., Any]:
    """fun over a batch of rows; mixed: each result less its maximum over the rows (a program buckets must not
    pad)."""
    batched = jax.vmap(fun)
    if not mixed:
        return batched
    less_max = lambda y: y - jnp.max(y, 0) if jnp.issubdtype(y.dtype, jnp.number) else y  # noqa: E731
    return lambda *a: jax.tree_util.tree_map(less_max, batched(*a))


def run_case(case: Case) -> Outcome:
    """Run one case against jax.jit; never raises."""
    start = time.perf_counter()
    fun, args, transform, options = _setup(case)
    try:
        if transform == "optimize-grad":
            reference_fn = jax.jit(jax.grad(_loss(fun), argnums=_float_args(args)))
        else:  # jax.jit in eqsat's place under the same transformation: what a user who swaps them compares
            reference_fn = _under(transform, jax.jit(fun), args)
        expected = reference_fn(*args)
        eager = expected if transform in ("eager", "jit", "background") else jax.jit(fun)(*_unbatched(args, transform))
    except Exception as error:  # the transformation does not apply to this program (jax.jit's own refusal)
        return Outcome(case, "invalid", f"{type(error).__name__}: {error}"[:300])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EqsatWarning)
        try:
            fast, calls = _optimized_calls(fun, args, transform, options)
            got: dict[str, Any] = {}
            order = calls if case.first == "transformed" else calls[::-1]
            for name, call in order:
                got[name] = call(args)
        except Exception as error:
            detail = "".join(traceback.format_exception_only(error)).strip()
            where = traceback.extract_tb(error.__traceback__)[-1]
            return Outcome(case, "crash", f"{detail[:600]} (at {where.filename}:{where.lineno})", seconds=_since(start))
    messages = [str(w.message) for w in caught if issubclass(w.category, EqsatWarning)]
    fallback = any("differed from the original" in m for m in messages)
    internal = [m for m in messages if "could not plan" in m]
    rewritten = collections.Counter()
    entries = list(fast._calls.cache.values())
    for entry in entries:
        # a plan that runs, or one the guard is still timing (its live calls run it in turn: seed 2050, case 6292)
        ran_plan = entry.plan.fallback is None or (entry.undecided and entry.plan_program is not None)
        rewritten.update(entry.plan.rewritten_ops() if ran_plan else {})
    outcome = Outcome(case, "ok", fallback=fallback, rewritten=dict(rewritten), seconds=0.0)
    plain_reference = jax.jit(fun)
    problems = [
        _compare(reference_fn, args, expected, got["transformed"], "transformed call"),
        _compare(plain_reference, _unbatched(args, transform), eager, got["eager"], "eager call"),
    ]
    again = functools.partial(
        _called_again, calls=calls, references=(reference_fn, plain_reference), transform=transform
    )
    # watched plans only (a body re-planned with @real rules watches its call too): other rewrites keep each
    # element's operations, and where a sum overflows midway its order decides inf or NaN for jax.jit's too
    if case.program.dtype != "int32" and any(e.plan.overflow_watch for e in entries):
        problems += again("scaled", _at_extreme_magnitudes(case, args))
    if case.program.dtype != "int32":  # a later call validation does not see, with special values
        problems += again("special values", special_values(args, case.data_seed))
    problem = next(filter(None, problems), None)
    if internal:
        outcome.status, outcome.detail = "internal", internal[0][:600]
    elif problem:
        outcome.status, outcome.detail = "mismatch", problem
    outcome.seconds = _since(start)
    return outcome


def _setup(case: Case) -> tuple[Callable[..., Any], tuple, str, dict[str, Any]]:
    """The case's function and arguments as its transform takes them, the transform (jit where grad has no float
    argument to differentiate) and optimize()'s options."""
    fun, args = case_function(case), case_arguments(case)
    transform = case.transform
    if transform == "grad" and not _float_args(args):
        transform = "jit"
    if transform in ("vmap", "buckets"):
        args = _batched(args)
    if transform == "buckets":  # through Buckets, on rows kept apart or mixed (data_seed's parity)
        fun = _rowwise(fun, mixed=case.data_seed % 2 == 1)
    limits = dataclasses.replace(FUZZ_LIMITS, guard_seconds=0.02) if case.guard else FUZZ_LIMITS
    # a first call runs its plan, except in the "background" transform
    options: dict[str, Any] = dict(
        target=case.target, extractor=case.extractor, limits=limits, background=transform == "background"
    )
    if transform == "buckets":
        options["buckets"] = Buckets(BUCKET_SIZES, argnums=tuple(range(len(args))))
    return fun, args, transform, options


def _at_extreme_magnitudes(case: Case, args: tuple) -> tuple:
    """The arguments each scaled by a large or tiny magnitude (1e30, 1e11, 1e-30 in float32): a plan that relies on
    rules marked `; @real` (re-association, distributivity) must not overflow where jax.jit does not."""
    top = float(jnp.finfo(case.program.dtype).max)
    leaves, tree = jax.tree.flatten(args)
    factors = np.random.default_rng(case.data_seed).choice([top**0.8, top**0.3, top**-0.8], len(leaves))
    return jax.tree.unflatten(tree, [x * jnp.asarray(f, x.dtype) for x, f in zip(leaves, factors, strict=True)])


def _called_again(
    label: str, values: tuple, calls: list[tuple[str, Callable[[tuple], Any]]], references: tuple, transform: str
) -> list[str | None]:
    """Both calls again on other values, the plans made on the first call in place (the same optimized function and
    transformation: no new trace), each against its jax.jit reference on the same values."""
    reference_fn, plain_reference = references
    got = {name: call(values) for name, call in calls}
    plain = _unbatched(values, transform)
    return [
        _compare(reference_fn, values, reference_fn(*values), got["transformed"], f"transformed call, {label}"),
        _compare(plain_reference, plain, plain_reference(*plain), got["eager"], f"eager call, {label}"),
    ]


def _unbatched(args: tuple, transform: str) -> tuple:
    """The arguments of a plain call: under vmap, the first example of the batch."""
    return jax.tree_util.tree_map(lambda x: x[0], args) if transform == "vmap" else args


def _optimized_calls(
    fun: Callable[..., Any], args: tuple, transform: str, options: dict[str, Any]
) -> tuple[Any, list[tuple[str, Callable[[tuple], Any]]]]:
    """The optimized function and its two calls, each a function of the case's arguments: under the transformation,
    and eagerly on the plain arguments."""

    def eager(f: Callable[..., Any]) -> Callable[[tuple], Any]:
        return lambda a: f(*_unbatched(a, transform))

    if transform == "optimize-grad":
        grad_fn = optimize(jax.grad(_loss(fun), argnums=_float_args(args)), **options)
        return grad_fn, [("transformed", lambda a: grad_fn(*a)), ("eager", eager(optimize(fun, **options)))]
    if transform == "prepare":
        fast = optimize(fun, params_argnums=0, **options)
        return fast, [("transformed", lambda a: fast.prepare(a[0])(*a[1:])), ("eager", eager(fast))]
    fast = optimize(fun, **options)
    if transform == "background":  # the first call may run the original; the one after the plan is ready runs it
        return fast, [("transformed", lambda a: (fast(*a), fast.plan(*a), fast(*a))[-1]), ("eager", eager(fast))]
    under = _under(transform, fast, args)
    return fast, [("transformed", lambda a: under(*a)), ("eager", eager(fast))]


def _compare(reference_fn: Callable[..., Any], args: tuple, expected: Any, got: Any, what: str) -> str | None:
    """What differs between expected and got beyond validation's tolerance (and the original's own sensitivity to
    its inputs' rounding, and its own error against its float64 evaluation), or None."""
    want_tree, have_tree = jax.tree_util.tree_structure(expected), jax.tree_util.tree_structure(got)
    if want_tree != have_tree:
        return f"{what}: result tree {have_tree} instead of {want_tree}"
    want = comparable(jax.tree_util.tree_leaves(expected))
    have = comparable(jax.tree_util.tree_leaves(got))
    if mismatch(want, have) is None:
        return None
    leaves, tree = jax.tree_util.tree_flatten(args)

    def flat_reference(*xs: Any) -> list[Any]:
        return jax.tree_util.tree_leaves(reference_fn(*jax.tree_util.tree_unflatten(tree, xs)))

    wrong = beyond_conditioning(flat_reference, leaves, want, have)
    if wrong is not None:  # judged as validation judges: against the original in float64
        wrong = less_accurate(flat_reference, leaves, want, have, wrong)
    return None if wrong is None else f"{what}: {wrong[1]}"


def _since(start: float) -> float:
    return time.perf_counter() - start


def _run_index(seed_and_index: tuple[int, int]) -> tuple[int, str, str, bool, dict[str, int], float]:
    """Case `index` of `seed`, run in a worker process; its outcome as plain values (the parent draws the case
    again: drawing is deterministic and cheap, and a program does not cross processes)."""
    seed_value, index = seed_and_index
    o = run_case(draw_case(seed_value, index))
    if index % 200 == 199:  # executables of finished cases: jax keeps them in caches of its own
        jax.clear_caches()
    return index, o.status, o.detail, o.fallback, o.rewritten, o.seconds


def fuzz(
    n: int,
    seed_value: int = 0,
    only: int | None = None,
    progress: Callable[[Outcome], None] | None = None,
    jobs: int = 1,
    first: int = 0,
) -> Summary:
    """Run cases first..first+n-1 of this seed (or only case `only`), each against jax.jit, in `jobs` processes;
    returns what happened, in case order."""
    start = time.perf_counter()
    indices = range(first, first + n) if only is None else [only]
    outcomes = []
    try:
        if jobs <= 1:
            results = map(_run_index, ((seed_value, i) for i in indices))
            _collect(seed_value, results, progress, outcomes)
        else:
            import multiprocessing

            with multiprocessing.get_context("spawn").Pool(jobs) as pool:
                results = pool.imap_unordered(_run_index, [(seed_value, i) for i in indices])
                _collect(seed_value, results, progress, outcomes)
    except KeyboardInterrupt:  # stopped early: the summary of the cases that ran
        pass
    return Summary(seed_value, sorted(outcomes, key=lambda o: o.case.index), time.perf_counter() - start)


def _collect(
    seed_value: int, results: Any, progress: Callable[[Outcome], None] | None, outcomes: list[Outcome]
) -> None:
    """Append each result to outcomes as it arrives (what ran stays there when the run is stopped)."""
    for index, status, detail, fallback, rewritten, seconds in results:
        outcomes.append(Outcome(draw_case(seed_value, index), status, detail, fallback, rewritten, seconds))
        if progress is not None:
            progress(outcomes[-1])
