"""Which axis of each value of a program carries the rows of a bucketed input, decided from the jaxpr.

Buckets pad a batch axis with zero rows, which is harmless only where every row of a result depends on that row
of the inputs alone. `row_axes` walks the program traced at the padded length and, in step with it, the same
program traced one row longer: a rule per primitive (`RULES`, as jax's own jaxpr interpreters dispatch) says where
an equation's results carry the axis given where its operands do. An equation that reduces, contracts, sorts,
scans, cumulates, slices, gathers or scatters across the axis, merges it with another axis, or whose primitive has
no rule, mixes rows; so does a value whose shape follows the length without carrying the rows (a random draw of
the batch's shape) and a literal, parameter or constant that differs between the two traces (the length used as
a number). Call, loop and branch bodies are walked with the axes of their operands.
"""

from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import numpy as np
from jax._src import linear_util as lu  # WrappedFun: custom_jvp's rule, a parameter that differs per trace
from jax._src import source_info_util  # user_frame: the user's line that made an equation
from jax.extend import core as jcore

Axis = int | None  # where a value carries the rows, or None where it does not depend on them


class RowsMixed(Exception):
    """An equation makes one row of a result depend on other rows of the bucketed input (or on their count)."""


def _named(eqn: jcore.JaxprEqn | None, why: str) -> RowsMixed:
    """The error naming the equation (its primitive and the user's line that made it)."""
    if eqn is None:
        return RowsMixed(f"the program {why}")
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    where = "" if frame is None else f" at {frame.file_name}:{frame.start_line} ({frame.function_name})"
    return RowsMixed(f"{eqn.primitive.name}{where} {why}")


class _Mixes(Exception):
    """Raised by a rule; the walk names the equation."""


Rule = Callable[[jcore.JaxprEqn, jcore.JaxprEqn, list[Axis], int], list[Axis]]


def row_axes(small: jcore.ClosedJaxpr, large: jcore.ClosedJaxpr, in_axes: Sequence[Axis], size: int) -> list[Axis]:
    """Where each result of `small` (traced with the bucketed axis `size` long) carries the rows, given where its
    inputs do; `large` is the same program traced with one row more. Raises RowsMixed naming the first equation
    that mixes rows."""
    if len(small.consts) != len(large.consts):
        raise _changed(small.jaxpr, "captures other constants one row longer")
    consts = [_const_axis(a, b, size) for a, b in zip(small.consts, large.consts, strict=True)]
    return _walk(small.jaxpr, large.jaxpr, [*consts, *in_axes], size)


def _walk(small: jcore.Jaxpr, large: jcore.Jaxpr, axes: Sequence[Axis], size: int) -> list[Axis]:
    if [e.primitive for e in small.eqns] != [e.primitive for e in large.eqns]:
        raise _changed(small, "traces to other equations one row longer")
    env: dict[jcore.Var, Axis] = dict(zip([*small.constvars, *small.invars], axes, strict=True))

    def read(v: Any) -> Axis:
        return None if isinstance(v, jcore.Literal) else env[v]

    for a, b in zip(small.eqns, large.eqns, strict=True):
        operands = [read(v) for v in a.invars]
        rule, carried = RULES.get(a.primitive.name), any(x is not None for x in operands)
        try:
            if rule is not None and (carried or rule in _WALKS_BODIES):  # bodies may make values of the batch's length
                results = rule(a, b, operands, size)
            elif carried:
                raise _Mixes("has no rule saying how it treats the rows")
            else:
                results = [None] * len(a.outvars)
            _same_values(a, b, size, walked=rule in _WALKS_BODIES)
            results = [_checked_axis(a, u, v, r, size) for u, v, r in zip(a.outvars, b.outvars, results, strict=True)]
        except _Mixes as mixes:
            raise _named(a, str(mixes)) from None
        env.update(zip(a.outvars, results, strict=True))
    return [read(v) for v in small.outvars]


def _changed(jaxpr: jcore.Jaxpr, why: str) -> RowsMixed:
    return _named(jaxpr.eqns[0] if jaxpr.eqns else None, why)


_BORN = {"iota", "broadcast_in_dim"}  # may make a value of the batch's length whose rows are all alike


def _checked_axis(eqn: jcore.JaxprEqn, small: Any, large: Any, axis: Axis, size: int) -> Axis:
    """The result's axis, checked against how its shape changes one row longer: exactly that axis grows."""
    grown = _grown(getattr(small.aval, "shape", ()), getattr(large.aval, "shape", ()), size)
    if axis is None and grown is not None and eqn.primitive.name in _BORN:
        return grown
    if grown != axis:
        raise _Mixes("makes a value whose shape follows the batch length but not its rows")
    return axis


def _grown(small: tuple, large: tuple, size: int) -> Axis:
    """The one axis that is `size` long in `small` and one longer in `large`, None where the shapes are equal."""
    changed = [i for i, (s, t) in enumerate(zip(small, large, strict=False)) if s != t]
    if len(small) != len(large) or len(changed) > 1 or any(small[i] != size or large[i] != size + 1 for i in changed):
        raise _Mixes("makes a value whose shape follows the batch length but not its rows")
    return changed[0] if changed else None


def _const_axis(small: Any, large: Any, size: int) -> Axis:
    """A captured constant carries the rows where it grows one row longer and its first rows are unchanged."""
    if small is large:
        return None
    try:
        a, b = np.asarray(small), np.asarray(large)
        axis = _grown(a.shape, b.shape, size)
        same = _equal(a, b if axis is None else np.take(b, range(size), axis=axis))
    except (_Mixes, TypeError, ValueError):  # a traced constant, or one whose shape follows the length otherwise
        same = False
    if not same:
        raise RowsMixed("a constant of the program changes with the batch length")
    return axis


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
    except TypeError:  # equal_nan on a dtype without NaN
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _same_values(small: jcore.JaxprEqn, large: jcore.JaxprEqn, size: int, walked: bool) -> None:
    """Literals and parameters equal in both traces, but for shape entries (ints in tuples) that grow by the row;
    bodies not walked (walked: its rule walked them) print the same."""
    for u, v in zip(small.invars, large.invars, strict=True):
        if isinstance(u, jcore.Literal) != isinstance(v, jcore.Literal) or (
            isinstance(u, jcore.Literal) and not _equal(u.val, v.val)
        ):
            raise _Mixes("takes the batch length as a number")
    if small.params.keys() != large.params.keys() or not all(
        _same_param(small.params[k], large.params[k], size, walked, False) for k in small.params
    ):
        raise _Mixes("takes the batch length as a number")


def _same_param(a: Any, b: Any, size: int, walked: bool, in_tuple: bool) -> bool:
    if isinstance(a, jcore.ClosedJaxpr | jcore.Jaxpr):
        return walked or str(a) == str(b)
    if callable(a) or isinstance(a, lu.WrappedFun):  # a rule's Python function: another object per trace
        return True
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same_param(x, y, size, walked, True) for x, y in zip(a, b, strict=True))
    if in_tuple and isinstance(a, int) and a == size and b == size + 1:
        return True  # a shape entry: the values' shapes are checked where they are made
    try:
        if a == b:
            return True
    except ValueError:  # an array-valued parameter
        pass
    return _equal(a, b)  # arrays, NaN fill values


# rules: (the equation, its trace one row longer, its operands' axes, the padded length) -> its results' axes


def _agreed(axes: Sequence[Axis]) -> int:
    """The one axis every operand that carries the rows carries them on."""
    carried = {x for x in axes if x is not None}
    if len(carried) != 1:
        raise _Mixes("combines rows of one operand with another axis of another")
    return carried.pop()


def _elementwise(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    return [_agreed(axes)] * len(eqn.outvars)


def _passed(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    return list(axes)


def _along(param: str, what: str) -> Rule:
    """An op along one axis (a cumulative sum, a sort, a split): it mixes rows where that axis is theirs."""

    def rule(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
        axis = _agreed(axes)
        if eqn.params[param] == axis:
            raise _Mixes(what)
        return [axis] * len(eqn.outvars)

    return rule


def _reduce(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis, reduced = _agreed(axes), eqn.params["axes"]
    if axis in reduced:
        raise _Mixes("reduces over the batch axis")
    return [axis - sum(r < axis for r in reduced)] * len(eqn.outvars)


def _broadcast_in_dim(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    return [eqn.params["broadcast_dimensions"][_agreed(axes[:1])]]


def _reshape(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    """A reshape keeps the rows where the axis stays whole, with the same number of elements before it."""
    axis, shape, new = _agreed(axes[:1]), eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
    if eqn.params.get("dimensions") is None:
        before = prod(shape[:axis])
        for q in range(len(new)):
            if prod(new[:q]) == before and new[q] == shape[axis]:
                return [q]
    raise _Mixes("reshapes the batch axis together with another")


def _squeeze(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis = _agreed(axes)
    return [axis - sum(d < axis for d in eqn.params["dimensions"])]


def _transpose(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    return [list(eqn.params["permutation"]).index(_agreed(axes))]


def _rev(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis = _agreed(axes)
    if axis in eqn.params["dimensions"]:
        raise _Mixes("reverses the batch axis")
    return [axis]


def _whole(eqn: jcore.JaxprEqn, axis: int, kept: bool) -> list[Axis]:
    if not kept:
        raise _Mixes("takes part of the batch axis")
    return [axis] * len(eqn.outvars)


def _slice(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis, p = _agreed(axes), eqn.params
    step = 1 if p["strides"] is None else p["strides"][axis]
    length = eqn.invars[0].aval.shape[axis]
    return _whole(eqn, axis, p["start_indices"][axis] == 0 and p["limit_indices"][axis] == length and step == 1)


def _pad(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis = _agreed(axes[:1])
    if axes[1] is not None:
        raise _Mixes("pads with a value of the rows")
    return _whole(eqn, axis, tuple(eqn.params["padding_config"][axis]) == (0, 0, 0))


def _reduce_window(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    """A window of one row, unpadded, undilated, stepping one row: each row alone."""
    axis, p = _agreed(axes), eqn.params
    alone = (p["window_dimensions"][axis], p["window_strides"][axis], p["base_dilation"][axis]) == (1, 1, 1)
    return _whole(eqn, axis, alone and p["window_dilation"][axis] == 1 and tuple(p["padding"][axis]) == (0, 0))


def _dynamic_slice(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis = _agreed(axes[:1])
    if any(x is not None for x in axes[1:]):
        raise _Mixes("slices at a position read from the rows")
    return _whole(eqn, axis, eqn.params["slice_sizes"][axis] == eqn.invars[0].aval.shape[axis])


def _dynamic_update_slice(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis = _agreed(axes[:2])
    if any(x is not None for x in axes[2:]):
        raise _Mixes("writes at a position read from the rows")
    return _whole(eqn, axis, axes[0] == axes[1] == axis)


def _concatenate(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis = _agreed(axes)
    if eqn.params["dimension"] == axis or None in axes:
        raise _Mixes("concatenates along the batch axis")
    return [axis]


def _top_k(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    axis = _agreed(axes)
    if eqn.params.get("axis", eqn.invars[0].aval.ndim - 1) == axis:
        raise _Mixes("selects across the batch axis")
    return [axis] * len(eqn.outvars)


def _dot_general(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    """Rows survive as a batch dimension (in the order of the batch dimensions) or a free one (lhs's free dims,
    then rhs's, after the batch dimensions); a contracted batch axis mixes them."""
    (contract_l, contract_r), (batch_l, batch_r) = eqn.params["dimension_numbers"]
    ranks = [v.aval.ndim for v in eqn.invars]
    free = [
        [d for d in range(r) if d not in c and d not in b]
        for r, c, b in zip(ranks, (contract_l, contract_r), (batch_l, batch_r), strict=True)
    ]
    places = set()
    for side, axis in enumerate(axes):
        if axis is None:
            continue
        contracted, batch = (contract_l, contract_r)[side], (batch_l, batch_r)[side]
        if axis in contracted:
            raise _Mixes("contracts the batch axis")
        if axis in batch:
            places.add(list(batch).index(axis))
        else:
            places.add(len(batch_l) + (len(free[0]) if side else 0) + free[side].index(axis))
    if len(places) != 1:
        raise _Mixes("pairs every row of one operand with every row of the other")
    return [places.pop()]


def _conv(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    lhs_spec, _, out_spec = eqn.params["dimension_numbers"]
    groups = eqn.params["feature_group_count"] == 1 and eqn.params["batch_group_count"] == 1
    if axes[1] is not None or axes[0] != lhs_spec[0] or not groups:
        raise _Mixes("convolves across the batch axis")
    return [out_spec[0]]


def _gather(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    """Rows survive a gather as a whole offset dimension of the operand (not indexed) or a batch dimension of the
    indices (the index vector is their last dimension); a batching dimension pairs the two."""
    dims, operand, indices = eqn.params["dimension_numbers"], axes[0], axes[1]
    out_rank, shape = eqn.outvars[0].aval.ndim, eqn.invars[0].aval.shape
    batch_out = [d for d in range(out_rank) if d not in dims.offset_dims]
    places = set()
    if indices is not None:
        if indices == eqn.invars[1].aval.ndim - 1:
            raise _Mixes("indexes with the rows as the index vector")
        places.add(batch_out[indices])
    if operand is not None and operand in dims.operand_batching_dims:
        paired = dims.start_indices_batching_dims[list(dims.operand_batching_dims).index(operand)]
        if indices != paired:
            raise _Mixes("gathers across the batch axis")
    elif operand is not None:
        if operand in dims.collapsed_slice_dims or operand in dims.start_index_map:
            raise _Mixes("gathers across the batch axis")
        if eqn.params["slice_sizes"][operand] != shape[operand]:
            raise _Mixes("takes part of the batch axis")
        offsets = [
            d for d in range(len(shape)) if d not in dims.collapsed_slice_dims and d not in dims.operand_batching_dims
        ]
        places.add(dims.offset_dims[offsets.index(operand)])
    if len(places) != 1:
        raise _Mixes("gathers across the batch axis")
    return [places.pop()]


def _scatter(eqn: jcore.JaxprEqn, _b: jcore.JaxprEqn, axes: list[Axis], _size: int) -> list[Axis]:
    """Rows survive a scatter into whole rows: the axis a window dimension of the operand, not indexed, and the
    same window dimension of the updates."""
    dims, (operand, indices, updates) = eqn.params["dimension_numbers"], axes
    indexed = (*dims.inserted_window_dims, *dims.scatter_dims_to_operand_dims, *dims.operand_batching_dims)
    if operand is None or indices is not None or operand in indexed:
        raise _Mixes("scatters across the batch axis")
    window = [d for d in range(eqn.invars[0].aval.ndim) if d not in dims.inserted_window_dims]
    window = [d for d in window if d not in dims.operand_batching_dims]
    if updates != dims.update_window_dims[window.index(operand)]:
        raise _Mixes("writes some rows of the batch axis")
    return [operand]


def _body(eqn: jcore.JaxprEqn) -> jcore.ClosedJaxpr | jcore.Jaxpr:
    return next(eqn.params[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in eqn.params)


def _closed(small: Any, large: Any, axes: Sequence[Axis], size: int) -> list[Axis]:
    if isinstance(small, jcore.ClosedJaxpr):
        return row_axes(small, large, axes, size)
    return _walk(small, large, axes, size)


def _call(eqn: jcore.JaxprEqn, large: jcore.JaxprEqn, axes: list[Axis], size: int) -> list[Axis]:
    return _closed(_body(eqn), _body(large), axes, size)


def _cond(eqn: jcore.JaxprEqn, large: jcore.JaxprEqn, axes: list[Axis], size: int) -> list[Axis]:
    branches = zip(eqn.params["branches"], large.params["branches"], strict=True)
    if axes[0] is not None:
        raise _Mixes("branches on a value of the rows")
    outs = [_closed(a, b, axes[1:], size) for a, b in branches]
    return [None if all(x is None for x in column) else _agreed(column) for column in zip(*outs, strict=True)]


def _loop(body: Callable[[list[Axis]], list[Axis]], carry: list[Axis]) -> list[Axis]:
    """Where a loop's carry holds the rows: grown from the initial carry until the body keeps it (a fixed point)."""
    while True:
        out = body(carry)[: len(carry)]
        grown = [c if c is not None else o for c, o in zip(carry, out, strict=True)]
        if any(c is not None and o is not None and c != o for c, o in zip(carry, out, strict=True)):
            raise _Mixes("moves the rows to another axis from one iteration to the next")
        if grown == carry:
            return carry
        carry = grown


def _scan(eqn: jcore.JaxprEqn, large: jcore.JaxprEqn, axes: list[Axis], size: int) -> list[Axis]:
    consts, carry, xs = map(list, eqn.params["ft_in"].update(axes).unpack())
    if 0 in xs:
        raise _Mixes("scans along the batch axis")
    xs = [None if x is None else x - 1 for x in xs]

    def body(c: list[Axis]) -> list[Axis]:
        return _closed(eqn.params["jaxpr"], large.params["jaxpr"], [*consts, *c, *xs], size)

    carry = _loop(body, carry)
    ys = body(carry)[len(carry) :]
    return [*carry, *(None if y is None else y + 1 for y in ys)]


def _while(eqn: jcore.JaxprEqn, large: jcore.JaxprEqn, axes: list[Axis], size: int) -> list[Axis]:
    p, q = eqn.params, large.params
    cond_consts, rest = axes[: p["cond_nconsts"]], axes[p["cond_nconsts"] :]
    body_consts, carry = rest[: p["body_nconsts"]], rest[p["body_nconsts"] :]
    carry = _loop(lambda c: _closed(p["body_jaxpr"], q["body_jaxpr"], [*body_consts, *c], size), carry)
    if _closed(p["cond_jaxpr"], q["cond_jaxpr"], [*cond_consts, *carry], size) != [None]:
        raise _Mixes("stops on a value of the rows")
    return carry


_ELEMENTWISE = (
    "abs", "acos", "acosh", "add", "and", "asin", "asinh", "atan", "atan2", "atanh", "bitcast_convert_type", "cbrt",
    "ceil", "clamp", "clz", "complex", "conj", "convert_element_type", "copy", "copy_p", "cos", "cosh", "digamma",
    "div", "eq", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "ge", "gt", "igamma", "igammac", "imag",
    "integer_pow", "is_finite", "le", "lgamma", "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg",
    "nextafter", "not", "or", "polygamma", "population_count", "pow", "real", "reduce_precision", "rem", "round",
    "rsqrt", "select_n", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "sqrt",
    "square", "stop_gradient", "sub", "tan", "tanh", "xor", "zeta",
)  # fmt: skip
_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
               "argmax", "argmin")  # fmt: skip
_CUMULATIVE = ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
_SCATTERS = ("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max")
_CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat2", "checkpoint")

RULES: dict[str, Rule] = {
    **dict.fromkeys(_ELEMENTWISE, _elementwise),
    **dict.fromkeys(_REDUCTIONS, _reduce),
    **dict.fromkeys(_CUMULATIVE, _along("axis", "cumulates along the batch axis")),
    "sort": _along("dimension", "sorts along the batch axis"),
    "split": _along("axis", "splits the batch axis"),
    "top_k": _top_k,
    "optimization_barrier": _passed,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "transpose": _transpose,
    "rev": _rev,
    "slice": _slice,
    "pad": _pad,
    **dict.fromkeys(("reduce_window_sum", "reduce_window_max", "reduce_window_min"), _reduce_window),
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "concatenate": _concatenate,
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "gather": _gather,
    **dict.fromkeys(_SCATTERS, _scatter),
    **dict.fromkeys(_CALLS, _call),
    "cond": _cond,
    "scan": _scan,
    "while": _while,
}
_WALKS_BODIES = (_call, _cond, _scan, _while)
