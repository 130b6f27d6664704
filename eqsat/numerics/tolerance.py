"""The one tolerance model: how far an optimized result may be from the original's and still count as equal.

Two uses, two scales. Validation (eqsat/api.py, memory budgets) compares whole programs' results: an element may
differ by VALIDATION_RTOL of its own magnitude, and by what the original's own sensitivity leaves undetermined
(beyond_conditioning); a small share of the result's scale only where the original does not determine the element to
its own magnitude (a sum whose terms cancel), not where it does (gelu's tail, 1e-9 beside values of 10). Rule checking
(eqsat/egraph/check.py, `rules check`) compares one e-node with its e-class, far more tightly (rule_tolerance).
"""

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from eqsat.numerics.widening import widened

# relative tolerance per dtype kind: float32 re-association changes rounding by about this much
VALIDATION_RTOL = {"float64": 1e-7, "float32": 2e-3, "float16": 5e-2, "bfloat16": 5e-2}
# the share of a result's largest magnitude added to each element's own (see differs): 1e-5 of the scale for
# float32, about 10x what re-associating sums of 4,096 to 16,384 terms measured, 200x below the old bound
_SCALE_SHARE = 5e-3
# ... and never less than a few roundings of the scale: for bfloat16 and float16 the share above is under one
# rounding (2.5e-4 of the scale, a sixteenth of bfloat16's eps), so re-associating two terms that cancel failed
# (the fuzzer, seed 2026: case 692, -0.0029 where the original summed to 0 on a scale of 7.9; case 1137, a
# gradient through such a sum, -0.078 for -0.094 on a scale of 0.34)
_SCALE_ROUNDINGS = 8


def _subnormal_floor(dtype: Any) -> float:
    """A difference below the smallest normal number: XLA:CPU flushes subnormals to zero in some kernels (a dot)
    and not in others (a gather), so jax.jit itself gives 0 or the subnormal for one value by context."""
    return float(jnp.finfo(dtype).tiny)


def comparable(values: list[Any]) -> list[np.ndarray]:
    """Results as arrays mismatch compares: a key as its data, a complex array as its real and imaginary
    parts (a float array, so that it gets its float tolerance), a token as nothing."""
    out = []
    for value in values:
        if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        elif not hasattr(value, "dtype"):  # a token
            value = np.zeros(0)
        value = np.asarray(value)
        out.append(np.stack([value.real, value.imag]) if np.iscomplexobj(value) else value)
    return out


def mismatch(expected: list[Any], got: list[Any]) -> str | None:
    """None if every result agrees within the dtype's tolerance, every element allowed a share of its result's scale
    (no original here to tell which elements it determines to their own magnitude), else what differed (the first
    that did)."""
    found = (differs(k, w, h, by_scale=True) for k, (w, h) in enumerate(zip(expected, got, strict=False)))
    return next(filter(None, found), None)


def beyond_conditioning(
    original: Callable[..., list[Any]], flat: list[Any], expected: list[Any], got: list[Any]
) -> tuple[int, str] | None:
    """The first result that differs by more than the original's own sensitivity allows, with what differed.

    An element that sums terms which cancel is not determined by the original to better than those terms'
    rounding, which re-association changes: the original is run on its float inputs perturbed by a few ulps, and
    an element may differ by CONDITIONING times as much as the original's own result moved under any of up to
    _PERTURBATIONS perturbations."""
    global _last_moved
    moved: list[np.ndarray | None] = [None] * len(expected)
    for moved in _movements(original, flat, expected):  # the spread only grows: the first that explains got decides
        if _first_beyond(expected, got, moved) is None:
            return None
    _last_moved = (expected, moved)
    return _first_beyond(expected, got, moved)


# beyond_conditioning's last measure, with the results it was taken for: validation calls less_accurate next on the
# same results, which judges each element by the same measure
_last_moved: tuple[list[Any], list[np.ndarray | None]] | None = None


def _movements(original: Callable[..., list[Any]], flat: list[Any], expected: list[Any]) -> Iterator[list[Any]]:
    """How far each float result of the original moves, at most, under its first 1, 2, ... _PERTURBATIONS
    perturbations of the inputs (None for the others); none where it does not run on perturbed inputs."""
    rng = np.random.default_rng(0)
    moved: list[np.ndarray | None] = [None] * len(expected)
    for _ in range(_PERTURBATIONS):
        perturbed = [_perturbed(x, rng) for x in flat]
        try:
            values = comparable(original(*perturbed))
        except Exception:  # an input the program reads exactly (a table index as float): no sensitivity known
            return
        for k, value in enumerate(values):
            if np.asarray(value).dtype.name in VALIDATION_RTOL:
                delta = np.abs(np.asarray(value, np.float64) - np.asarray(expected[k], np.float64))
                moved[k] = delta if moved[k] is None else np.maximum(moved[k], delta)
        yield moved


def _spread(moved: np.ndarray | None) -> np.ndarray | None:
    """What the original leaves undetermined at each element: CONDITIONING times how far it moved."""
    return None if moved is None else _CONDITIONING * np.nan_to_num(moved, nan=0.0, posinf=0.0)


def _first_beyond(expected: list[Any], got: list[Any], moved: list[np.ndarray | None]) -> tuple[int, str] | None:
    for k, (want, have) in enumerate(zip(expected, got, strict=True)):
        # no measure (a result the perturbed program did not give): each element by the result's scale, as before
        problem = differs(k, want, have, _spread(moved[k]), by_scale=moved[k] is None)
        if problem:
            return k, problem
    return None


def less_accurate(
    original: Callable[..., list[Any]],
    flat: list[Any],
    expected: list[Any],
    got: list[Any],
    unjudged: tuple[int, str] | None,
) -> tuple[int, str] | None:
    """The first result the plan computes less accurately than the original, judged against the original
    evaluated in float64 on these inputs, which neither program's rounding blurs; None where every result that
    differs is about as accurate as the original's own (its largest error against the float64 reference within
    ACCURACY_FACTOR of the original's, plus a few roundings of the result's scale, plus what the program's own
    rounding leaves undetermined at each element: BLUR_SIGMAS times the spread of the reference evaluated again with
    every operation's results moved by up to half an ulp of the program's type at random (_rounded_at_random); at
    an element the original determines to its own magnitude, the same by that magnitude: relative errors). Where
    the program does not run in float64 (an input it reads bit for bit), `unjudged`: what the caller found without
    the reference."""
    global _last_moved
    last, _last_moved = _last_moved, None
    moved = last[1] if last is not None and last[0] is expected else None
    reference, blurred = _in_float64(original, flat), {}
    for k, (want, have) in enumerate(zip(expected, got, strict=True)):
        problem = differs(k, want, have)
        if problem is None:
            continue
        exact = None if reference is None else np.asarray(reference[k])
        dtype = np.asarray(want).dtype
        if exact is None or exact.shape != np.shape(want) or dtype.name not in VALIDATION_RTOL:
            return unjudged
        if dtype.name not in blurred:
            blurred[dtype.name] = _rounded_at_random(original, flat, float(jnp.finfo(dtype).eps) / 2)
        runs = blurred[dtype.name]
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, no blur
            deviations = [np.asarray(run[k], np.float64) - exact for run in runs]
            blur = BLUR_SIGMAS * np.sqrt(np.mean(np.square(deviations), axis=0)) if runs else np.zeros(exact.shape)
        if moved is None:  # called on its own: the measure beyond_conditioning takes
            moved = list(_movements(original, flat, expected))[-1:] or [[None] * len(expected)]
            moved = moved[0]
        spread = _spread(moved[k])
        problem = _accuracy_problem(k, np.asarray(want), np.asarray(have), exact.astype(np.float64), blur, spread)
        if problem:
            return k, problem
    return None


# The plan's largest error against the float64 reference may be this many times the original's own: two
# summation orders of the same terms err by amounts of the same size, either one up to a few times the other.
ACCURACY_FACTOR = 4.0


def _accuracy_problem(
    k: int, want: np.ndarray, have: np.ndarray, exact: np.ndarray, blur: np.ndarray, spread: np.ndarray | None
) -> str | None:
    w, h = want.astype(np.float64), have.astype(np.float64)
    finite = np.isfinite(exact) & np.isfinite(w)
    if not np.all(np.isfinite(h)[finite]):
        return f"result {k}: inf or NaN where the original and its float64 evaluation are finite"
    plan_error, own_error = np.abs(h - exact)[finite], np.abs(w - exact)[finite]
    if plan_error.size == 0:
        return None
    eps, magnitude = float(jnp.finfo(want.dtype).eps), np.abs(exact[finite])
    floor = _SCALE_ROUNDINGS * eps * float(np.max(magnitude)) + _subnormal_floor(want.dtype)
    # where rounding at the program's own precision blurs the result, an error within that blur is none
    blur = np.nan_to_num(blur[finite], nan=0.0, posinf=0.0)
    allowed = ACCURACY_FACTOR * float(np.max(own_error)) + blur + floor
    # an element the original determines to its own magnitude (gelu's tail): the same judgment in relative terms,
    # against the original's largest relative error over such elements, never more than the scale allows
    own = _own_scale(want.dtype, w[finite], None if spread is None else np.broadcast_to(spread, finite.shape)[finite])
    own &= (magnitude > 0) & (spread is not None)
    relative = float(np.max(own_error[own] / magnitude[own], initial=0.0))
    by_own = ACCURACY_FACTOR * relative * magnitude + blur + _SCALE_ROUNDINGS * eps * magnitude
    if spread is not None:
        by_own = by_own + np.broadcast_to(spread, finite.shape)[finite]
    allowed = np.where(own, np.minimum(by_own, allowed), allowed)
    if np.all(plan_error <= allowed):
        return None
    i = int(np.argmax((plan_error - allowed) / np.maximum(np.where(own, magnitude, np.max(magnitude)), 1e-300)))
    how = (
        f"an element it determines to its own magnitude: {ACCURACY_FACTOR:g}x its largest relative error over such "
        f"elements, {relative:.3g}, plus {_SCALE_ROUNDINGS} roundings of the element, {allowed[i]:.3g} in all"
        if own[i]
        else f"at most {np.max(own_error):.3g} over the result, and {ACCURACY_FACTOR:g}x that plus {floor:.3g} is "
        f"allowed, and what rounding each operation at random moves it by there, {blur[i]:.3g}"
    )
    return (
        f"result {k}: less accurate than the original, e.g. {h[finite][i]:.6g} where the float64 evaluation gives "
        f"{exact[finite][i]:.6g} (error {plan_error[i]:.3g}; the original's {w[finite][i]:.6g} errs by "
        f"{own_error[i]:.3g}, {how})"
    )


def _in_float64(
    original: Callable[..., list[Any]], flat: list[Any], rounding: float = 0.0, seed: int = 0
) -> list[np.ndarray] | None:
    """The original's results with its floats computed in float64 and jax's x64 mode on (eqsat/numerics/widening.py: its
    float32 constants and element types too; `rounding`: every operation's results moved by that share, up or down at
    random, `seed`); None where it does not run so."""
    with jax.enable_x64(True):
        results = widened(original, flat, np.dtype(np.float64), rounding, seed)
    return None if results is None else comparable(results)


# CESTAC's number of evaluations rounded at random: their spread estimates what rounding leaves of each result
_ROUNDING_RUNS = 3
# An element's error within this many of those runs' root-mean-square deviations is rounding: another compilation's
# roundings are one more draw, and the largest of three runs is only about 1.3 of them (seed 2050, case 4987: terms
# near 1e12 that cancel to 0 left 262144 in the plan's fusion, 1.4x the largest run and 2.3x their root-mean-square)
BLUR_SIGMAS = 3.0


def _rounded_at_random(original: Callable[..., list[Any]], flat: list[Any], unit: float) -> list[list[np.ndarray]]:
    """The original evaluated in float64 _ROUNDING_RUNS times with every operation's results moved by up to `unit`
    (half an ulp of the program's own type: round to nearest), up or down at random: how far that type's rounding
    moves each result, whichever way a compilation rounds (an element that cancels two products of 6e31 to 0 is
    undetermined by about 5e24 in float32: XLA contracts one product into an FMA in one fusion and not in another)."""
    runs = [_in_float64(original, flat, unit, seed) for seed in range(_ROUNDING_RUNS)]
    return [run for run in runs if run is not None]


def _widened(original: Callable[..., list[Any]], flat: list[Any], wide: np.dtype) -> list[np.ndarray] | None:
    """The original's results with its narrower float inputs widened to `wide` (its bfloat16 and float16
    operations kept: the reference a narrow plan is judged against); None where it does not run so."""

    def widen(x: Any) -> Any:
        narrower = _dtype_name(x) in VALIDATION_RTOL and np.dtype(x.dtype).itemsize < wide.itemsize
        return np.asarray(x, wide) if narrower else x

    try:
        return comparable(original(*map(widen, flat)))
    except Exception:  # an input read bit for bit, a dtype-specific op: the wider program is not the original's
        return None


# How far a bfloat16 or float16 element may be from the original evaluated in float32, in units of the narrow type's
# last place at that value, beyond the original's own distance: computing a chain in float32 and rounding it once
# moves an element by the original's own rounding (towards the float32 value) and half a unit at most
NARROW_ULPS = 2.0
_NARROW = ("bfloat16", "float16")


def narrow_less_accurate(
    original: Callable[..., list[Any]], flat: list[Any], expected: list[Any], got: list[Any]
) -> tuple[int, str] | None:
    """The first bfloat16 or float16 result the plan computes less accurately than the original, judged against
    the original evaluated in float32 on these inputs. An element may be NARROW_ULPS units of the narrow type's last
    place farther from that reference than the original's element; more only at as many elements as the original
    itself leaves that far from it: where a contraction sums terms that cancel, the narrow type does not determine
    an element to a few of its own units, and another rounding of its inputs moves it by more."""
    narrow = [k for k, want in enumerate(expected) if np.asarray(want).dtype.name in _NARROW]
    reference = _widened(original, flat, np.dtype(np.float32)) if narrow else None
    for k in narrow:
        want = np.asarray(expected[k])
        exact = None if reference is None else np.asarray(reference[k])
        if exact is None or exact.shape != want.shape:
            return k, f"result {k}: computed in float32, but the original does not run on float32 inputs to judge it"
        problem = _narrow_problem(k, want, np.asarray(got[k]), exact.astype(np.float64))
        if problem:
            return k, problem
    return None


def ulps(values: Any, reference: Any, dtype: Any) -> np.ndarray:
    """Each element's distance from the reference in units of dtype's last place at the reference's value."""
    finfo = jnp.finfo(dtype)
    exact = np.asarray(reference, np.float64)
    ulp = float(finfo.eps) * np.exp2(np.floor(np.log2(np.maximum(np.abs(exact), float(finfo.tiny)))))
    return np.abs(np.asarray(values, np.float64) - exact) / ulp


def _narrow_problem(k: int, want: np.ndarray, have: np.ndarray, exact: np.ndarray) -> str | None:
    w, h = want.astype(np.float64), have.astype(np.float64)
    finite = np.isfinite(exact) & np.isfinite(w) & np.isfinite(h)  # inf and NaN: differs judged them
    exact, w, h = exact[finite], w[finite], h[finite]
    plan, own = ulps(h, exact, want.dtype), ulps(w, exact, want.dtype)
    excess = plan - own - NARROW_ULPS
    worse, undetermined = int(np.sum(excess > 0)), int(np.sum(own > NARROW_ULPS))
    if worse <= undetermined:
        return None
    i = int(np.argmax(excess))
    return (
        f"result {k}: {worse} of {exact.size} elements less accurate than the original by more than "
        f"{NARROW_ULPS:g} units of {want.dtype.name}'s last place (the original is that far from the float32 "
        f"evaluation at {undetermined}), e.g. {h[i]:.6g} where the float32 evaluation gives {exact[i]:.6g} and the "
        f"original {w[i]:.6g}"
    )


def _dtype_name(x: Any) -> str | None:
    return getattr(getattr(x, "dtype", None), "name", None)


# How many times the original's own movement under a few-ulp perturbation of its inputs an element may move. The
# perturbation enters once, at the inputs; a deep program rounds again at every layer, so its re-associated
# results move further: 22x measured on a MobileNetV2 training step's vanishing weight gradients (max 2.5e-13).
_CONDITIONING = 32.0
_PERTURBATION_ULPS = 4
# At most this many perturbations, until one explains the plan's results: a value at a kink (relu's pre-activation
# within rounding of 0) flips under a perturbation about half the time, and a plan whose rounding flipped it computes
# the gradient the original gives for inputs an ulp away (2 tries refused 4 of 20 such flips; 8 miss 1 in 256)
_PERTURBATIONS = 8


def _perturbed(x: Any, rng: np.random.Generator) -> Any:
    """A float or complex input with each element moved by a few ulps (sign at random); other inputs as they are."""
    array = np.asarray(x) if hasattr(x, "dtype") else x
    if not hasattr(array, "dtype") or (array.dtype.name not in VALIDATION_RTOL and array.dtype.kind != "c"):
        return x
    eps = float(jax.numpy.finfo(array.dtype).eps)
    signs = rng.choice(np.array([-1.0, 1.0]), array.shape)
    wide = np.complex128 if np.iscomplexobj(array) else np.float64  # (a complex input keeps its imaginary part)
    return (array.astype(wide) * (1 + _PERTURBATION_ULPS * eps * signs)).astype(array.dtype)


def _own_scale(dtype: np.dtype, want: np.ndarray, spread: np.ndarray | None) -> np.ndarray:
    """The elements judged by their own magnitude: in the normal range, and moved by the original's own sensitivity
    (`spread`, where measured) by at most rtol of it. Not zeros, nor what a sum cancels to (its rounding moves it);
    in bfloat16 and float16 none: a perturbation of a few of their ulps, CONDITIONING times, is beyond rtol itself."""
    magnitude, rtol, finfo = np.abs(want), VALIDATION_RTOL[np.dtype(dtype).name], jnp.finfo(dtype)
    if _CONDITIONING * _PERTURBATION_ULPS * float(finfo.eps) > rtol:
        return np.zeros(magnitude.shape, bool)
    own = magnitude >= float(finfo.tiny)
    return own if spread is None else own & (spread <= rtol * magnitude)


def differs(k: int, want: Any, have: Any, spread: np.ndarray | None = None, by_scale: bool = False) -> str | None:
    """What is wrong with result k, or None. Each element must be within rtol of its own magnitude, plus `spread`
    (what the original's own sensitivity leaves undetermined there), plus, where the original does not determine it
    to that magnitude (_own_scale; with no spread measured, only zeros and values below the normal range), a small
    share of the result's scale: re-association changes an element by a few roundings of the largest terms it sums
    (about 1e-6 of the scale for float32 sums of 4,096 terms), which an element near zero cannot absorb itself.
    `by_scale`: every element gets that share (mismatch: no original to measure the spread with).

    With no spread, an element near zero that differs from its own value by more than rtol is a difference to
    explain (beyond_conditioning measures the spread): an exact gelu's tail computed as 1 - erf (-1.1e-6 for
    -3.6e-7 beside values of 10) was within the share and accepted."""
    want, have = np.asarray(want), np.asarray(have)
    if want.shape != have.shape or want.dtype != have.dtype:
        return f"result {k}: {have.shape} {have.dtype} instead of {want.shape} {want.dtype}"
    rtol = VALIDATION_RTOL.get(want.dtype.name)
    if rtol is None:
        return None if np.array_equal(want, have) else f"result {k}: {np.sum(want != have)} elements differ"
    w, h = want.astype(np.float64), have.astype(np.float64)
    # Where the original overflowed (inf or NaN) a finite result is accepted: the stable forms do this on
    # purpose. The reverse, an inf or NaN the original did not produce, is a mismatch.
    if np.any(~np.isfinite(h) & ~((h == w) | (np.isnan(h) & np.isnan(w)))):
        return f"result {k}: inf or NaN where the original has a different value"
    finite = np.isfinite(w) & np.isfinite(h)
    w, h = w[finite], h[finite]  # only finite values are subtracted: no numpy warnings leak
    scale = float(np.max(np.abs(w), initial=0.0))
    share = max(rtol * _SCALE_SHARE, _SCALE_ROUNDINGS * float(jnp.finfo(want.dtype).eps))
    spread = None if spread is None else np.broadcast_to(spread, finite.shape)[finite]
    own = np.zeros(w.shape, bool) if by_scale else _own_scale(want.dtype, w, spread)
    allowed = rtol * np.abs(w) + np.where(own, 0.0, share * scale) + _subnormal_floor(want.dtype)
    if spread is not None:  # what the original's own sensitivity leaves undetermined (beyond_conditioning)
        allowed = allowed + spread
    bad = np.abs(w - h) > allowed
    if not np.any(bad):
        return None
    i = int(np.argmax((np.abs(w - h) - allowed) / np.where(own, np.abs(w), max(scale, 1e-300))))
    how = "its own scale" if own[i] else f"{share:.3g} x max |value| {scale:.3g}"
    return (
        f"result {k}: {int(bad.sum())} of {w.size} elements differ, e.g. {h[i]:.6g} instead of {w[i]:.6g} "
        f"(allowed {rtol:g} x |value| + {how}{'' if spread is None else f' + the spread {spread[i]:.3g}'})"
    )


# Largest error allowed for rules marked `; @real`, relative to the largest magnitude a node combines (see
# `rule_tolerance`). Ints: exact.
RULE_RTOL = {
    "float64": 1e-10,
    "float32": 1e-4,
    "float16": 1e-2,
    "bfloat16": 5e-2,
    "complex64": 1e-4,
    "complex128": 1e-10,
}
_ROUNDINGS = 8  # rounding errors allowed per element of the longest reduction, for rules sound in floating point


def rule_tolerance(dtype: np.dtype, scale: float, real: bool, reduction: int = 1) -> float:
    """The absolute error allowed for a value of this dtype whose computation involves magnitudes up to `scale`.

    Rules sound in floating point (layout, concat/slice, merges, batching) compute each element with the same
    operations; at most a contraction sums its terms in another order (a merged GEMM's kernel blocks differently),
    so they get _ROUNDINGS roundings per element of the longest reduction in the program (8 * eps * scale for
    programs without contractions, about 100x tighter than float32's real-number rule_tolerance), capped at that
    rule_tolerance. The rules marked real (re-association, distributivity) change the
    rounding of the whole chain a node re-associates: at most about K*eps*scale for a length-K sum,
    ~sqrt(K)*eps*scale in practice; with chains of contractions of length <= 8^3 (dims 1-8) and float32's eps of
    6e-8 that stays under 3e-5*scale, so 1e-4 (RULE_RTOL) keeps margin, while an unsound rewrite (a swapped operand, a
    dropped op) is off by a sizable fraction of the scale. Integers and booleans must agree exactly.
    """
    kind = np.dtype(dtype)
    if not jnp.issubdtype(kind, jnp.inexact):  # jnp's: it knows bfloat16 is a float
        return 0.0
    real_tolerance = RULE_RTOL.get(kind.name, 1e-4) * scale
    if real:
        return real_tolerance
    return min(_ROUNDINGS * max(reduction, 1) * float(jnp.finfo(kind).eps) * scale, real_tolerance)


def difference(
    want: Any, got: Any, allowed: float, signed_zeros: bool = False, undetermined: Any = None
) -> tuple[float, float] | None:
    """(error, allowed) if `got` disagrees with `want`, else None; shapes and dtypes already match. NaNs and
    infinities must stand where the other's do, with their signs; `signed_zeros`: where both are zero, their signs
    too (special-valued inputs, eqsat/tools/special.py); `undetermined`: a mask of elements not compared."""
    w, g = np.asarray(want), np.asarray(got)
    if undetermined is not None and np.any(undetermined):
        keep = ~np.broadcast_to(undetermined, w.shape)
        w, g = w[keep], g[keep]
    if signed_zeros and jnp.issubdtype(w.dtype, jnp.floating):
        zeros = (w == 0) & (g == 0)
        if np.any(np.signbit(w[zeros]) != np.signbit(g[zeros])):
            return float("inf"), allowed
    if allowed == 0.0:  # NaN where the other has NaN is equal (an output of NaN alone has no finite scale)
        # jnp's issubdtype: numpy's does not know bfloat16 is inexact, and two NaN-only results differed
        if np.array_equal(w, g, equal_nan=bool(jnp.issubdtype(w.dtype, jnp.inexact))):
            return None
        return float(np.max(np.abs(w.astype(float) - g.astype(float)))), 0.0
    wide = np.complex128 if np.iscomplexobj(w) else np.float64
    w, g = w.astype(wide), g.astype(wide)
    finite = np.isfinite(w) & np.isfinite(g)
    if not np.array_equal(w[~finite], g[~finite], equal_nan=True) or not np.array_equal(np.isfinite(w), np.isfinite(g)):
        return float("inf"), allowed
    error = float(np.max(np.abs(w[finite] - g[finite]), initial=0.0))  # inf - inf warns: finite ones only
    return (error, allowed) if error > allowed else None
