"""A program evaluated in a wider float type: the reference validation judges accuracy against
(eqsat/numerics/tolerance.py).

Binding a float32 jaxpr to float64 inputs fails at its first float32 constant or literal (a model's epsilon, a
cast, a dot's preferred element type), so the program is interpreted equation by equation instead: each narrower
float input widened, each float32 element type in the parameters made the wide one, and the bodies of calls
(jit, custom derivatives, remat) interpreted the same way; the bodies other primitives hold (a scatter's combiner,
a loop's body, a branch) are traced again through it on wide values. Conversions to bfloat16 or float16 stay: they
are the program's own quantization. Where a primitive refuses the wide values the program is not widened (None).

A sum whose terms' magnitudes add up beyond the largest finite value of the program's own type is not determined
by the program: the order of its additions, which XLA chooses per context (the same reduce_window gives -7984 at
the top level and -inf in a while body; a small dot's FMA chain keeps its first overflowing term's sign), decides
between a finite value and an overflow. Such elements are NaN in the wide evaluation: no order is the right one.
So is every element such a sum decides through a comparison (relu's derivative, x > 0, is false for NaN; a small
dot's FMA chain gives +inf where the float64 sum is negative): where a sum was undetermined, the program is evaluated
again with those sums left as float64 computes them, then +inf, then -inf, and each element that differs between the
evaluations is NaN.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

# the parameter that holds the called jaxpr, by primitive: their bodies are interpreted inline
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",  # jax.checkpoint's primitive
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}
_TYPE_PARAMS = ("new_dtype", "preferred_element_type", "dtype")  # element types a primitive's parameters name
# sums of many terms in one primitive, linear in each operand: bound on |inputs|, they bound every partial sum
_SUMS = ("dot_general", "conv_general_dilated", "reduce_sum", "reduce_window_sum", "cumsum")
Hook = Callable[[core.JaxprEqn, list[Any], dict[str, Any], list[Any]], list[Any]]


def widened(
    fun: Callable[..., Any], flat: list[Any], wide: np.dtype, rounding: float = 0.0, seed: int = 0
) -> list[Any] | None:
    """fun's results on flat with every float narrower than `wide` (bfloat16 and float16 conversions aside)
    computed in `wide`, a sum undetermined by the program's own type NaN; None where the program cannot be evaluated
    so. `rounding`: every operation's float results moved by up to that share of themselves, up or down, at random
    element by element (`seed`), as random rounding (CESTAC) estimates how far rounding at that precision blurs each
    result (uniform, not an ulp up or down: a sum of equal moves of both signs would cancel as exactly as the terms):
    two compilations of one float32 program round differently (XLA contracts a product and a sum into one FMA in one
    fusion and not in another, so a*b - a*b is 0 in one and a*b's rounding error in the other)."""
    try:
        closed = jax.make_jaxpr(fun)(*flat)
        args = [_widen(x, wide) for x in flat]
        marks: list[Any] = []
        results = _evaluate(closed.jaxpr, closed.consts, args, wide, _after(rounding, seed, jnp.nan, marks))
        if any(isinstance(m, jax.core.Tracer) or bool(m) for m in marks):  # a sum was undetermined (or in a body)
            for fill in (None, jnp.inf, -jnp.inf):
                other = _evaluate(closed.jaxpr, closed.consts, args, wide, _after(rounding, seed, fill, []))
                results = [_where_equal(a, b) for a, b in zip(results, other, strict=True)]
    except Exception:  # a primitive that refuses the wide values
        return None
    # a result of another shape or of another non-float type is not the program's (a float read bit for bit)
    same = all(
        np.shape(r) == v.aval.shape and (_is_float(v.aval.dtype) or np.dtype(r.dtype) == v.aval.dtype)
        for r, v in zip(results, closed.jaxpr.outvars, strict=True)
    )
    return results if same else None


def _undetermined(
    eqn: core.JaxprEqn, inputs: list[Any], params: dict[str, Any], outs: list[Any], fill: float | None, marks: list[Any]
) -> list[Any]:
    """A sum's result `fill` (None: left as computed) where its terms' magnitudes add up beyond the program's type's
    largest finite value; whether any did appended to `marks`."""
    dtype = eqn.outvars[0].aval.dtype
    if eqn.primitive.name not in _SUMS or not _is_float(dtype):
        return outs
    # an infinite term (log(0), or beyond even float64) decides the sum whatever the order: only finite ones count
    finite = [jnp.where(jnp.isfinite(x), abs(x), 0) if _is_float(getattr(x, "dtype", None)) else x for x in inputs]
    over = eqn.primitive.bind(*finite, **params) > float(jnp.finfo(dtype).max)
    marks.append(jnp.any(over))
    return outs if fill is None else [jnp.where(over, jnp.asarray(fill, outs[0].dtype), outs[0])]


# the primitives whose float results round (a max, a select, a gather or a reshape moves no value: a max moved
# would make x - max(x) positive, and exp of it overflow)
_ROUNDING = frozenset(
    {
        *("add", "add_any", "sub", "mul", "div", "rem", "pow", "integer_pow", "sqrt", "rsqrt", "cbrt"),
        *("exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "erf", "erfc", "erf_inv", "lgamma", "digamma"),
        *("sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh"),
        *(*_SUMS, "reduce_prod", "cumprod", "cumlogsumexp", "logaddexp", "scatter-add", "scatter_add"),
    }
)


def _after(rounding: float, seed: int, fill: float | None, marks: list[Any]) -> Hook:
    """What follows every primitive: its sums undetermined by the program's type `fill` (_undetermined), then, if
    `rounding`, each float result of a primitive that rounds (_ROUNDING) times 1 + r, r drawn uniformly in
    [-rounding, rounding] per element (the same draws for one seed, whatever the fill)."""
    rng = np.random.default_rng(seed)

    def after(eqn: core.JaxprEqn, inputs: list[Any], params: dict[str, Any], outs: list[Any]) -> list[Any]:
        outs = _undetermined(eqn, inputs, params, outs, fill, marks)
        if not rounding or eqn.primitive.name not in _ROUNDING:
            return outs
        return [
            x * jnp.asarray(1 + rounding * rng.uniform(-1.0, 1.0, np.shape(x)), x.dtype)
            if _is_float(getattr(x, "dtype", None))
            else x
            for x in outs
        ]

    return after


def _where_equal(marked: Any, kept: Any) -> Any:
    """The marked evaluation's result, NaN where another fill of the undetermined sums gives another value."""
    if not _is_float(getattr(marked, "dtype", None)):
        return marked
    same = (marked == kept) | (jnp.isnan(marked) & jnp.isnan(kept))
    return jnp.where(same, marked, jnp.nan)


def _is_float(dtype: Any) -> bool:
    return dtype is not None and jnp.issubdtype(np.dtype(dtype), jnp.floating)  # numpy's says no to bfloat16


def _narrower(dtype: Any, wide: np.dtype) -> bool:
    return _is_float(dtype) and np.dtype(dtype).itemsize < wide.itemsize


def _widen(x: Any, wide: np.dtype) -> Any:
    dtype = getattr(x, "dtype", None)
    if dtype is None and isinstance(x, float):
        return np.asarray(x, wide)
    return x.astype(wide) if _narrower(dtype, wide) else x


def _param(value: Any, wide: np.dtype) -> Any:
    """An element-type parameter made wide where it names a narrower float type than float32's quantizations."""
    return wide if _narrower(value, wide) and np.dtype(value).name not in ("bfloat16", "float16") else value


def _is_body(value: Any) -> bool:
    bodies = value if isinstance(value, tuple) else (value,)
    return bool(bodies) and all(isinstance(b, core.Jaxpr | core.ClosedJaxpr) for b in bodies)


def _typed(name: str, value: Any) -> bool:
    """Whether a parameter names an element type or holds a body (what _retyped remakes)."""
    return name in _TYPE_PARAMS or _is_body(value)


def _retyped(value: Any, wide: np.dtype, after: Hook) -> Any:
    """A parameter for the wide values: an element type made wide (_param); a body (a scatter's or reduction's
    combiner, a loop's or branch's body) traced again through this interpreter on wide values of its inputs."""
    if not _is_body(value):
        return _param(value, wide)
    if isinstance(value, tuple):
        return tuple(_retyped(b, wide, after) for b in value)
    closed = value if isinstance(value, core.ClosedJaxpr) else core.ClosedJaxpr(value, ())
    avals = [
        jax.ShapeDtypeStruct(v.aval.shape, wide if _narrower(v.aval.dtype, wide) else v.aval.dtype)
        for v in closed.jaxpr.invars
    ]
    traced = jax.make_jaxpr(lambda *xs: _evaluate(closed.jaxpr, closed.consts, list(xs), wide, after))(*avals)
    if isinstance(value, core.ClosedJaxpr):
        return traced
    if traced.consts:  # an open body has nowhere to hold constants
        raise TypeError("a widened body needs constants")
    return traced.jaxpr


def _evaluate(
    jaxpr: core.Jaxpr,
    consts: list[Any],
    args: list[Any],
    wide: np.dtype,
    after: Hook,
) -> list[Any]:
    """jaxpr's results on args, each float narrower than `wide` widened, and `after` applied to the results of every
    primitive bound, with its equation, inputs and parameters (a call's body inlined, the bodies other primitives
    hold traced again)."""
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return _widen(v.val, wide) if isinstance(v, core.Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = _widen(value, wide)
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = value
    for eqn in jaxpr.eqns:
        inputs = [_widen(read(v), wide) for v in eqn.invars]
        body = eqn.params.get(_CALLS.get(eqn.primitive.name, ""))
        if body is not None:
            inner, inner_consts = (body.jaxpr, body.consts) if hasattr(body, "consts") else (body, [])
            outs = _evaluate(inner, inner_consts, inputs, wide, after)
        else:
            params = {k: _retyped(v, wide, after) if _typed(k, v) else v for k, v in eqn.params.items()}
            outs = eqn.primitive.bind(*inputs, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            outs = after(eqn, inputs, params, outs)
        for var, value in zip(eqn.outvars, outs, strict=True):
            env[var] = value
    return [_widen(read(v), wide) for v in jaxpr.outvars]  # a loop body's carry stays wide through its conversions
