"""A program evaluated in a wider float type: the reference validation judges accuracy against (eqsat/tolerance.py).

Binding a float32 jaxpr to float64 inputs fails at its first float32 constant or literal (a model's epsilon, a
cast, a dot's preferred element type), so the program is interpreted equation by equation instead: each narrower
float input widened, each float32 element type in the parameters made the wide one, and the bodies of calls
(jit, custom derivatives, remat) interpreted the same way; the bodies other primitives hold (a scatter's combiner,
a loop's body, a branch) are traced again through it on wide values. Conversions to bfloat16 or float16 stay: they
are the program's own quantization. Where a primitive refuses the wide values the program is not widened (None).
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


def widened(fun: Callable[..., Any], flat: list[Any], wide: np.dtype, rounded_up: bool = False) -> list[Any] | None:
    """fun's results on flat with every float narrower than `wide` (bfloat16 and float16 conversions aside)
    computed in `wide`; None where the program cannot be evaluated so. `rounded_up`: every operation's float result
    moved an ulp of `wide` up, so that the difference from the plain evaluation shows how far `wide`'s own rounding
    blurs each result (log(sum(exp(x))) of x = 1e-31 is 0 in float64: exp(x) rounds to 1)."""
    try:
        closed = jax.make_jaxpr(fun)(*flat)
        after = _rounded_up if rounded_up else None
        results = _evaluate(closed.jaxpr, closed.consts, [_widen(x, wide) for x in flat], wide, after)
    except Exception:  # a primitive that refuses the wide values
        return None
    # a result of another shape or of another non-float type is not the program's (a float read bit for bit)
    same = all(
        np.shape(r) == v.aval.shape and (_is_float(v.aval.dtype) or np.dtype(r.dtype) == v.aval.dtype)
        for r, v in zip(results, closed.jaxpr.outvars, strict=True)
    )
    return results if same else None


def _rounded_up(outs: list[Any]) -> list[Any]:
    """Each float result times 1 + eps of its own type: rounded an ulp up (the rest as they are)."""
    floats = [getattr(x, "dtype", None) is not None and jnp.issubdtype(x.dtype, jnp.floating) for x in outs]
    return [x * jnp.asarray(1 + jnp.finfo(x.dtype).eps, x.dtype) if f else x for x, f in zip(outs, floats, strict=True)]


def _is_float(dtype: Any) -> bool:
    return dtype is not None and np.issubdtype(np.dtype(dtype), np.floating)


def _widen(x: Any, wide: np.dtype) -> Any:
    dtype = getattr(x, "dtype", None)
    if dtype is None and isinstance(x, float):
        return np.asarray(x, wide)
    return x.astype(wide) if _is_float(dtype) and np.dtype(dtype).itemsize < wide.itemsize else x


def _param(value: Any, wide: np.dtype) -> Any:
    """An element-type parameter made wide where it names a narrower float type than float32's quantizations."""
    narrow = _is_float(value) and np.dtype(value).itemsize < wide.itemsize
    return wide if narrow and np.dtype(value).name not in ("bfloat16", "float16") else value


def _is_body(value: Any) -> bool:
    bodies = value if isinstance(value, tuple) else (value,)
    return bool(bodies) and all(isinstance(b, core.Jaxpr | core.ClosedJaxpr) for b in bodies)


def _typed(name: str, value: Any) -> bool:
    """Whether a parameter names an element type or holds a body (what _retyped remakes)."""
    return name in _TYPE_PARAMS or _is_body(value)


def _retyped(value: Any, wide: np.dtype, after: Callable[[list[Any]], list[Any]] | None) -> Any:
    """A parameter for the wide values: an element type made wide (_param); a body (a scatter's or reduction's
    combiner, a loop's or branch's body) traced again through this interpreter on wide values of its inputs."""
    if not _is_body(value):
        return _param(value, wide)
    if isinstance(value, tuple):
        return tuple(_retyped(b, wide, after) for b in value)
    closed = value if isinstance(value, core.ClosedJaxpr) else core.ClosedJaxpr(value, ())
    avals = [jax.ShapeDtypeStruct(v.aval.shape, _param(v.aval.dtype, wide)) for v in closed.jaxpr.invars]
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
    after: Callable[[list[Any]], list[Any]] | None = None,
) -> list[Any]:
    """jaxpr's results on args, each float narrower than `wide` widened, and `after` applied to the results of every
    primitive bound (a call's body inlined, the bodies other primitives hold traced again)."""
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
            outs = outs if after is None else after(outs)
        for var, value in zip(eqn.outvars, outs, strict=True):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]
