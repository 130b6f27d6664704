"""Capture: trace a JAX function to a jaxpr and turn it into eqsat's graph IR.

One dispatch loop over the equations. Call-like primitives (nested jit, custom_jvp/custom_vjp) are inlined;
a primitive the op table models is captured as the one entry that names it (eqsat/table.captured_as), by that
entry's capture_params or by the capture function registered below for it; everything else becomes an opaque
node that lowering re-binds with its original parameters, so no program jax can trace is refused.
"""

import functools
import os
from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import jax
import numpy as np
from jax._src import source_info_util  # user_frame: the first frame outside jax, as jax's own errors name it
from jax.core import ShapedArray
from jax.extend import core as jcore

from eqsat.capture.ir import Graph, Node, Opaque, Role, Variable, Where
from eqsat.ops import table
from eqsat.ops.cumulative import PRIMITIVES as CUMULATIVE
from eqsat.ops.kernels import PICK_FILLS, along_last_axis, conv_dimension_numbers
from eqsat.ops.table import ConvAttrs, OpSpec, captured_as

INLINED = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call"}
_INLINED_BODY_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")

NodeCapture = tuple[str, tuple, list[int]]  # one equation as a graph node: the op, its attributes, its inputs
# (graph, equation, its inputs' nodes) -> the equation as an op of the table (with helper nodes added before it), or
# None to keep it opaque
Capture = Callable[[Graph, jcore.JaxprEqn, list[int]], NodeCapture | None]
# op name -> how the primitives its table entry names are captured, where its capture_params cannot say it
CAPTURES: dict[str, Capture] = {}


def _captures(op: str) -> Callable[[Capture], Capture]:
    """Registers the decorated function as the capture of the primitives `op`'s table entry names."""

    def register(capture: Capture) -> Capture:
        CAPTURES[op] = capture
        return capture

    return register


def capture(closed: jcore.ClosedJaxpr, inputs: Sequence[Variable] = ()) -> Graph:
    """The graph of a closed jaxpr; inputs: each flat input's role and path (by default arguments)."""
    graph = Graph()
    for i, var in enumerate(closed.jaxpr.invars):
        graph.inputs.append(graph.add(Node(table.VAR, (), (f"x{i}",), _shape(var), _dtype(var))))
        graph.variables[f"x{i}"] = inputs[i] if inputs else Variable()
    const_ids = [_const(graph, value) for value in closed.consts]
    graph.outputs = _capture_jaxpr(graph, closed.jaxpr, const_ids, graph.inputs)
    return graph


def _capture_jaxpr(graph: Graph, jaxpr: jcore.Jaxpr, consts: list[int], args: list[int], scope: str = "") -> list[int]:
    """scope: the name stack of the call whose body this is (a body's equations carry theirs relative to it)."""
    env: dict[Any, int] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(atom: Any) -> int:
        if isinstance(atom, jcore.Literal):
            return _const(graph, np.asarray(atom.val, dtype=atom.aval.dtype))
        return env[atom]

    for eqn in jaxpr.eqns:
        inputs = [read(v) for v in eqn.invars]
        first = len(graph.nodes)
        where = _where(eqn, scope)
        if eqn.primitive.name in INLINED and (body := _body(eqn.params)) is not None:
            body_consts = [_const(graph, value) for value in body.consts]
            outs = _capture_jaxpr(graph, body.jaxpr, body_consts, inputs, where.scope)
        else:
            outs = _capture_eqn(graph, eqn, inputs)
        for node in range(first, len(graph.nodes)):  # helper nodes (broadcasts, transposes) share the equation's
            graph.where.setdefault(node, where)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def _where(eqn: jcore.JaxprEqn, scope: str) -> Where:
    """The equation's name stack under `scope`, and the user's line that made it (the innermost frame outside jax)."""
    own = str(eqn.source_info.name_stack)
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    source = "" if frame is None else f"{_short_path(frame.file_name)}:{frame.start_line} ({frame.function_name})"
    return Where("/".join(s for s in (scope, own) if s), source)


@functools.cache  # once per file: os.path.relpath per equation cost 0.15 s on a 32-layer gradient
def _short_path(file_name: str) -> str:
    """A path under the working directory relative to it (plans move between machines), others as they are."""
    relative = os.path.relpath(file_name) if os.path.isabs(file_name) else file_name
    return file_name if relative.startswith("..") else relative


def _capture_eqn(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> list[int]:
    modeled = _model(graph, eqn, inputs) if eqn.outvars else None
    if modeled is not None:
        op, attrs, args = modeled
        out = eqn.outvars[0]
        return [graph.add(Node(op, tuple(args), attrs, _shape(out), _dtype(out)))]
    graph.opaque.append(Opaque(eqn.primitive, dict(eqn.params), eqn.primitive.multiple_results))
    index = len(graph.opaque) - 1
    if not eqn.outvars:  # an effect alone (debug.print, dce_sink): the call itself is what must stay
        call = graph.add(Node(table.OPAQUE, tuple(inputs), (index,)))
        if eqn.effects:
            graph.effects.append(call)
        return []
    if not eqn.primitive.multiple_results:
        out = eqn.outvars[0]
        node = graph.add(Node(table.OPAQUE, tuple(inputs), (index,), _shape(out), _dtype(out)))
        results = [node]
    else:
        call = graph.add(Node(table.OPAQUE, tuple(inputs), (index,)))
        results = [graph.add(Node(table.GET, (call,), (i,), _shape(v), _dtype(v))) for i, v in enumerate(eqn.outvars)]
    if eqn.effects:
        graph.effects.extend(results)
    return results


def _model(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """The IR op for an equation the op table models exactly, or None to keep it opaque."""
    if eqn.effects or not all(isinstance(v.aval, ShapedArray) for v in (*eqn.invars, *eqn.outvars)):
        return None
    op = captured_as(eqn.primitive.name)
    if op is None or (op.one_dtype and not _one_dtype(eqn)):
        return None
    capture = CAPTURES.get(op.name)
    return capture(graph, eqn, inputs) if capture is not None else _with_params(graph, op, eqn, inputs)


def _one_dtype(eqn: jcore.JaxprEqn) -> bool:
    """Whether the equation's inputs and outputs share one numpy dtype, not bool."""
    dtypes = {v.aval.dtype for v in (*eqn.invars, *eqn.outvars)}
    return len(dtypes) == 1 and dtypes != {np.dtype(bool)} and isinstance(next(iter(dtypes)), np.dtype)


def _with_params(graph: Graph, op: OpSpec, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """The op with the attributes its entry's capture_params makes of the parameters (none: a primitive without
    parameters), binary ops' operands broadcast to the output's shape."""
    if op.capture_params is not None:
        attrs = op.capture_params(dict(eqn.params))
        if attrs is None:
            return None
    elif any(value is not None for value in eqn.params.values()):
        return None
    else:
        attrs = ()
    if op.arity == 2:
        return op.name, attrs, [_broadcast_to(graph, node, eqn.outvars[0].aval.shape) for node in inputs]
    return op.name, attrs, inputs


def _broadcast_to(graph: Graph, node: int, shape: tuple[int, ...]) -> int:
    """lax's implicit broadcast of size-1 axes made explicit (scalars stay scalars), folded into a Bcast operand."""
    src = graph.nodes[node]
    if src.shape == shape or src.shape == ():
        return node
    if src.op == table.BCAST:
        dims, node = table.BcastAttrs(*src.attrs).dims, src.inputs[0]
    else:
        dims = tuple(range(len(shape)))
    attrs = (tuple(map(int, shape)), tuple(map(int, dims)))
    return graph.add(Node(table.BCAST, (node,), attrs, tuple(shape), src.dtype))


@_captures(table.CONCAT)
def _concat(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """An n-way concatenate as a left-nested chain of binary Concats."""
    axis = int(eqn.params["dimension"])
    if len(inputs) == 1:
        return None
    acc = inputs[0]
    for node in inputs[1:-1]:
        a, b = graph.nodes[acc], graph.nodes[node]
        assert a.shape is not None and b.shape is not None
        shape = tuple(x + y if d == axis else x for d, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)))
        acc = graph.add(Node(table.CONCAT, (acc, node), (axis,), shape, a.dtype))
    return table.CONCAT, (axis,), [acc, inputs[-1]]


@_captures(table.RESHAPE)
def _reshape(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """A reshape without dimensions or sharding, and a squeeze, as (Reshape new_shape x)."""
    if eqn.primitive.name == "squeeze":
        return table.RESHAPE, (tuple(int(d) for d in eqn.outvars[0].aval.shape),), inputs
    if eqn.params.get("dimensions") is not None or eqn.params.get("sharding") is not None:
        return None
    return table.RESHAPE, (tuple(int(d) for d in eqn.params["new_sizes"]),), inputs


@_captures(table.SLICE)
def _slice(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """A unit-stride slice as a chain of single-axis Slices, one per axis it narrows."""
    p = eqn.params
    if p["strides"] is not None and any(s != 1 for s in p["strides"]):
        return None
    src = graph.nodes[inputs[0]]
    assert src.shape is not None
    shape = list(src.shape)
    bounds = enumerate(zip(p["start_indices"], p["limit_indices"], strict=True))
    cuts = [(axis, int(lo), int(hi)) for axis, (lo, hi) in bounds if (lo, hi) != (0, shape[axis])]
    if not cuts:  # the whole array: a reshape to its own shape, which rules remove
        return table.RESHAPE, (tuple(shape),), inputs
    if any(lo >= hi for _, lo, hi in cuts):
        return None
    acc = inputs[0]
    for axis, lo, hi in cuts[:-1]:
        shape[axis] = hi - lo
        acc = graph.add(Node(table.SLICE, (acc,), (axis, lo, hi), tuple(shape), src.dtype))
    return table.SLICE, cuts[-1], [acc]


# conv_general_dilated's parameters, all of which Conv models; a parameter jax adds later keeps a conv opaque
_CONV_PARAMS = {
    "window_strides", "padding", "lhs_dilation", "rhs_dilation", "dimension_numbers", "feature_group_count",
    "batch_group_count", "precision", "preferred_element_type", "out_sharding",
}  # fmt: skip


@_captures(table.CONV)
def _conv(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """A conv_general_dilated of any rank and dimension numbers as a Conv in the table's channels-last layout
    (eqsat/ops/kernels.conv_dimension_numbers), with transposes around it where the layout differs (NCHW, the kernels
    of gradients, what vmap produces), which XLA folds. A precision, a preferred element type or an output sharding
    keeps it opaque: Conv would compute it otherwise."""
    p = eqn.params
    if set(p) != _CONV_PARAMS or any(p[k] is not None for k in ("precision", "preferred_element_type", "out_sharding")):
        return None
    if p["batch_group_count"] > 1 and p["feature_group_count"] > 1:
        return None
    dims = p["dimension_numbers"]
    layout = conv_dimension_numbers(len(dims.lhs_spec))
    x, w = (
        _to_spec(graph, node, tuple(spec), tuple(target))
        for node, spec, target in zip(inputs, dims[:2], layout[:2], strict=True)
    )
    attrs = ConvAttrs(
        strides=tuple(int(s) for s in p["window_strides"]),
        pad_low=tuple(int(lo) for lo, _ in p["padding"]),
        pad_high=tuple(int(hi) for _, hi in p["padding"]),
        lhs_dilation=tuple(int(d) for d in p["lhs_dilation"]),
        rhs_dilation=tuple(int(d) for d in p["rhs_dilation"]),
        feature_groups=int(p["feature_group_count"]),
        batch_groups=int(p["batch_group_count"]),
    )
    out_spec, canonical = tuple(dims.out_spec), tuple(layout.out_spec)
    if out_spec == canonical:
        return table.CONV, attrs, [x, w]
    out = eqn.outvars[0].aval
    shape = tuple(out.shape[out_spec[canonical.index(axis)]] for axis in range(len(out_spec)))
    conv = graph.add(Node(table.CONV, (x, w), attrs, shape, str(out.dtype)))
    perm = tuple(canonical[out_spec.index(axis)] for axis in range(len(out_spec)))
    return table.TRANSPOSE, (perm,), [conv]


def _to_spec(graph: Graph, node: int, spec: tuple[int, ...], target: tuple[int, ...]) -> int:
    """The array transposed so that its logical axes (batch/out-feature, feature/in-feature, spatial...) sit where
    `target` says: spec[k] is the axis holding logical axis k now, target[k] where it must go."""
    if spec == target:
        return node
    src = graph.nodes[node]
    assert src.shape is not None
    perm = tuple(spec[target.index(axis)] for axis in range(len(spec)))
    shape = tuple(src.shape[a] for a in perm)
    return graph.add(Node(table.TRANSPOSE, (node,), (perm,), shape, src.dtype))


@_captures(table.CUMULATIVE)
def _cumulative(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """lax.cumsum / cumprod / cummax / cummin / cumlogsumexp as (Cumulative kind axis reverse x)."""
    kind = CUMULATIVE[eqn.primitive.name]
    return table.CUMULATIVE, (kind, int(eqn.params["axis"]), int(eqn.params["reverse"])), inputs


@_captures(table.CONVERT)
def _convert(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """convert_element_type: the last step of jax.nn.one_hot as a OneHot, a conversion between real float dtypes as
    (Convert dtype x); to or from an integer, a bool or a weak type it stays opaque."""
    one_hot = _one_hot(graph, eqn, inputs)
    if one_hot is not None:
        return one_hot
    source, target = eqn.invars[0].aval.dtype, eqn.outvars[0].aval.dtype
    if eqn.params.get("weak_type") or eqn.params.get("sharding") is not None:
        return None
    if not all(jax.numpy.issubdtype(d, jax.numpy.floating) for d in (source, target)):
        return None
    return table.CONVERT, (np.dtype(target).name,), inputs


def _one_hot(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """jax.nn.one_hot: convert(eq(broadcast(ids)[..., None], iota along the last axis)) as (OneHot depth dtype ids);
    any other conversion stays opaque."""
    source = graph.nodes[inputs[0]]
    if source.op != table.OPAQUE or graph.opaque[source.attrs[0]].primitive.name != "eq" or len(source.inputs) != 2:
        return None
    expanded, iota = (graph.nodes[i] for i in source.inputs)
    if expanded.op == table.OPAQUE:
        expanded, iota = iota, expanded
    if iota.op != table.OPAQUE or expanded.op != table.BCAST or not expanded.shape or expanded.shape[-1] != 1:
        return None
    call = graph.opaque[iota.attrs[0]]
    rank = len(expanded.shape)
    if call.primitive.name != "iota" or call.params["dimension"] != rank - 1 or len(call.params["shape"]) != rank:
        return None
    if table.BcastAttrs(*expanded.attrs).dims != tuple(range(rank - 1)) or tuple(call.params["shape"][:-1]) != (1,) * (
        rank - 1
    ):
        return None
    ids = expanded.inputs[0]
    if graph.nodes[ids].shape != expanded.shape[:-1]:
        return None
    return table.ONE_HOT, (int(call.params["shape"][-1]), str(eqn.outvars[0].aval.dtype)), [ids]


@_captures(table.ARG_REDUCE)
def _arg_reduce(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """lax.argmax / lax.argmin along one axis as (ArgReduce "max"|"min" axis index_dtype x)."""
    (axis,) = eqn.params["axes"]
    kind = eqn.primitive.name.removeprefix("arg")
    return table.ARG_REDUCE, (kind, int(axis), np.dtype(eqn.params["index_dtype"]).name), inputs


@_captures(table.TAKE_ALONG)
@_captures(table.PUT_ALONG)
def _along_last_axis(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """jnp.take_along_axis along the last axis (a gather with the leading axes as batch axes) as (TakeAlong fill x
    ids), and its gradient's scatter-add as (PutAlong x ids updates), the trailing index axis of the ids dropped;
    out-of-range ids filled with NaN or 0 (a gather) or dropped (a scatter), as in FILL_OR_DROP mode. Any other
    gather or scatter-add stays opaque."""
    p, x, ids = eqn.params, eqn.invars[0].aval, eqn.invars[1].aval
    rank = len(x.shape)
    if not rank or len(ids.shape) != rank + 1 or ids.shape[: rank - 1] != x.shape[:-1] or ids.shape[-1] != 1:
        return None  # ids [B..., K, 1] for x [B..., V]
    if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(x.dtype, np.inexact):
        return None
    gather, scatter = along_last_axis(rank)
    if p["mode"] != jax.lax.GatherScatterMode.FILL_OR_DROP or p["indices_are_sorted"] or p["unique_indices"]:
        return None
    picks = _reshaped(graph, inputs[1], tuple(int(d) for d in ids.shape[:-1]))
    if eqn.primitive.name == "gather":
        fill = next((name for name, value in PICK_FILLS.items() if _same_value(p["fill_value"], value)), None)
        if p["dimension_numbers"] != gather or tuple(p["slice_sizes"]) != (1,) * rank or fill is None:
            return None
        return table.TAKE_ALONG, (fill,), [inputs[0], picks]
    if p["dimension_numbers"] != scatter or p["update_consts"] or eqn.invars[2].aval.dtype != x.dtype:
        return None
    return table.PUT_ALONG, (), [inputs[0], picks, inputs[2]]


def _same_value(fill: Any, value: float) -> bool:
    """A gather's fill value is this one (NaN for NaN; None is NaN for an inexact operand, as jax fills)."""
    fill = float("nan") if fill is None else float(fill)
    return fill == value or (np.isnan(fill) and np.isnan(value))


@_captures(table.DOT)
def _dot(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture | None:
    """dot_general in the forms that Dot / BatchDot express, with a matrix transpose of b where needed."""
    params = eqn.params
    if params.get("precision") is not None:
        return None
    (ca, cb), (ba, bb) = params["dimension_numbers"]
    ra, rb = (len(v.aval.shape) for v in eqn.invars)
    a, b = inputs
    if not ba and not bb and tuple(ca) == (ra - 1,):
        if tuple(cb) == (0,):
            return table.DOT, (), [a, b]
        if rb == 2 and tuple(cb) == (1,):
            return table.DOT, (), [a, _transposed(graph, b)]
    if not ba and not bb:
        return _flat_dot(graph, eqn, inputs)
    nb = len(ba)
    batch = tuple(range(nb))
    if tuple(ba) != batch or tuple(bb) != batch or ra != nb + 2 or rb != nb + 2 or tuple(ca) != (nb + 1,):
        return None
    if tuple(cb) == (nb,):
        return table.BATCH_DOT, (), [a, b]
    if tuple(cb) == (nb + 1,):
        return table.BATCH_DOT, (), [a, _transposed(graph, b)]
    return None


def _transposed(graph: Graph, node: int) -> int:
    """The node with its last two axes swapped (MT)."""
    src = graph.nodes[node]
    assert src.shape is not None
    shape = (*src.shape[:-2], src.shape[-1], src.shape[-2])
    return graph.add(Node(table.MT, (node,), (), shape, src.dtype))


def _flat_dot(graph: Graph, eqn: jcore.JaxprEqn, inputs: list[int]) -> NodeCapture:
    """Any other dot_general without batch axes as a matrix product of the operands flattened to (free, contracted)
    and (contracted, free) matrices, reshaped back. An embedding's gradient, one_hot(ids) contracted with the
    cotangent over the leading (token) axes, becomes Dot(MT(Reshape(cotangent)), Reshape(one_hot)), which
    rules/kernels.egg can see as a scatter-add."""
    (ca, cb), _ = eqn.params["dimension_numbers"]
    a, b = inputs
    (sa, sb), out = (graph.nodes[i].shape for i in inputs), eqn.outvars[0].aval
    assert sa is not None and sb is not None
    free_a = [d for d in range(len(sa)) if d not in ca]
    free_b = [d for d in range(len(sb)) if d not in cb]
    k, m, n = (prod(s[d] for d in dims) for s, dims in ((sa, ca), (sa, free_a), (sb, free_b)))
    if tuple(ca) == tuple(range(len(ca))):  # contracted axes leading, as in a weight gradient: flatten, then swap
        left = _transposed(graph, _reshaped(graph, a, (k, m)))
    else:
        left = _reshaped(graph, _permuted(graph, a, (*free_a, *ca)), (m, k))
    right = _reshaped(graph, _permuted(graph, b, (*cb, *free_b)), (k, n))
    if tuple(out.shape) == (m, n):
        return table.DOT, (), [left, right]
    product = graph.add(Node(table.DOT, (left, right), (), (m, n), str(out.dtype)))
    return table.RESHAPE, (tuple(int(d) for d in out.shape),), [product]


def _permuted(graph: Graph, node: int, perm: tuple[int, ...]) -> int:
    """The node's axes in this order (the node itself where that is its order)."""
    src = graph.nodes[node]
    assert src.shape is not None
    if perm == tuple(range(len(perm))):
        return node
    return graph.add(Node(table.TRANSPOSE, (node,), (perm,), tuple(src.shape[p] for p in perm), src.dtype))


def _reshaped(graph: Graph, node: int, shape: tuple[int, ...]) -> int:
    """The node reshaped (itself where it has that shape already)."""
    src = graph.nodes[node]
    if src.shape == shape:
        return node
    return graph.add(Node(table.RESHAPE, (node,), (shape,), shape, src.dtype))


def _body(params: dict[str, Any]) -> jcore.ClosedJaxpr | None:
    for key in _INLINED_BODY_PARAMS:
        body = params.get(key)
        if isinstance(body, jcore.ClosedJaxpr):
            return body
        if isinstance(body, jcore.Jaxpr):
            return jcore.ClosedJaxpr(body, ())
    return None


def _const(graph: Graph, value: Any) -> int:
    array = np.asarray(value)
    name = f"c{len(graph.consts)}"
    graph.consts[name] = array
    graph.variables[name] = Variable(Role.CONSTANT)
    return graph.add(Node(table.VAR, (), (name,), tuple(array.shape), str(array.dtype)))


def _shape(var: Any) -> tuple[int, ...] | None:
    return tuple(var.aval.shape) if hasattr(var.aval, "shape") else None


def _dtype(var: Any) -> str | None:
    return str(var.aval.dtype) if hasattr(var.aval, "dtype") else None
