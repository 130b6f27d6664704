"""Generators of random programs over contractions, elementwise ops, layout and the stable composites: one
entry of ALGEBRA per op or rule pattern (eqsat/tools/generators.py joins them with the other tables)."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

from eqsat.tools.program import DrawFn, Program, Shape, any_value, dims, positive


def _unary(fn: Callable[..., Any], domain: str = "") -> Callable[[DrawFn, Program], int]:
    def gen(draw: DrawFn, prog: Program) -> int:
        x = any_value(draw, prog)
        if domain == "positive":
            x = positive(prog, x)
        elif domain == "bounded":  # keeps exp from overflowing to inf, which re-association turns into NaN
            x = prog.apply("tanh", lax.tanh, x)
        return prog.apply(fn.__name__, fn, x)

    return gen


def _binary(fn: Callable[..., Any], positive_right: bool = False) -> Callable[[DrawFn, Program], int]:
    def gen(draw: DrawFn, prog: Program) -> int:
        a = any_value(draw, prog)
        shape = prog.shapes[a]
        how = draw(st.sampled_from(["same", "scalar", "row"]))
        if how == "scalar":  # a literal: captured as a scalar constant
            c = draw(st.sampled_from([0.5, 2.0, -1.5]))
            return prog.apply(f"{fn.__name__}_{c}", lambda x: fn(x, np.asarray(c, x.dtype)), a)
        b = row(prog, shape) if how == "row" else prog.pick(draw, lambda s: s == shape, shape)
        if positive_right:
            b = positive(prog, b)
        return prog.apply(fn.__name__, fn, a, b)

    return gen


def _dot_operands(draw: DrawFn, prog: Program) -> tuple[int, int]:
    a = prog.pick(draw, lambda s: 1 <= len(s) <= 3, dims(draw, draw(st.integers(1, 3))))
    ra, k = len(prog.shapes[a]), prog.shapes[a][-1]
    ok_rank = range(max(1, 2 - ra + 1), 5 - ra)  # result rank ra + rb - 2 in 1..3
    rb = draw(st.sampled_from(list(ok_rank)))
    b = prog.pick(draw, lambda s: len(s) in ok_rank and s[0] == k, (k, *dims(draw, rb - 1)))
    return a, b


def dot(a: Any, b: Any) -> Any:
    return lax.dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())))


def _dot_t(a: Any, b: Any) -> Any:
    """a @ b.T with b a matrix: captured as (Dot a (MT b))."""
    return lax.dot_general(a, b, (((a.ndim - 1,), (1,)), ((), ())))


def _bdot(a: Any, b: Any) -> Any:
    return lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))))


def _bdot_t(a: Any, b: Any) -> Any:
    """Batched a @ b^T: captured as (BatchDot a (MT b))."""
    return lax.dot_general(a, b, (((2,), (2,)), ((0,), (0,))))


def _gen_dot(draw: DrawFn, prog: Program) -> int:
    return prog.apply("dot", dot, *_dot_operands(draw, prog))


def _gen_dot_t(draw: DrawFn, prog: Program) -> int:
    a = any_value(draw, prog)
    k = prog.shapes[a][-1]
    b = prog.pick(draw, lambda s: len(s) == 2 and s[1] == k, (draw(st.integers(1, 8)), k))
    return prog.apply("dot_t", _dot_t, a, b)


def _gen_batch_dot(draw: DrawFn, prog: Program) -> int:
    a = prog.pick(draw, lambda s: len(s) == 3, dims(draw, 3))
    bsz, _, k = prog.shapes[a]
    if draw(st.booleans()):
        b = prog.pick(draw, lambda s: len(s) == 3 and s[0] == bsz and s[2] == k, (bsz, draw(st.integers(1, 8)), k))
        return prog.apply("batch_dot_t", _bdot_t, a, b)
    b = prog.pick(draw, lambda s: len(s) == 3 and s[:2] == (bsz, k), (bsz, k, draw(st.integers(1, 8))))
    return prog.apply("batch_dot", _bdot, a, b)


def _matrices(draw: DrawFn, prog: Program, batched: bool, n: int) -> list[Shape]:
    """n chainable shapes: [B,] d0 x d1, d1 x d2, ..."""
    d = dims(draw, n + 1)
    lead = dims(draw, 1) if batched else ()
    return [(*lead, d[i], d[i + 1]) for i in range(n)]


def _gen_chain(draw: DrawFn, prog: Program) -> int:
    """A three-operand product in a random association: what re-association and transposition rules match."""
    batched = draw(st.booleans())
    mul = _bdot if batched else dot
    a, b, c = (prog.fresh(s) for s in _matrices(draw, prog, batched, 3))
    if draw(st.booleans()):
        return prog.apply("dot", mul, prog.apply("dot", mul, a, b), c)
    return prog.apply("dot", mul, a, prog.apply("dot", mul, b, c))


def _dot_sum(batched: bool, share: str) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_dot_sum(draw, prog, batched, share)


def _gen_dot_sum(draw: DrawFn, prog: Program, batched: bool, share: str) -> int:
    """x@w1 + y@w2 sharing the left operand, the right one, or neither: factoring and GEMM-merge patterns."""
    mul = _bdot if batched else dot
    xs, ws = _matrices(draw, prog, batched, 2)
    x, w = prog.fresh(xs), prog.fresh(ws)
    y = x if share == "left" else prog.fresh(xs if share == "right" else (*xs[:-1], draw(st.integers(1, 8))))
    v = w if share == "right" else prog.fresh((*prog.shapes[y][:-2], prog.shapes[y][-1], ws[-1]))
    return prog.apply("add", lax.add, prog.apply("dot", mul, x, w), prog.apply("dot", mul, y, v))


def _gen_dot_of_sum(draw: DrawFn, prog: Program) -> int:
    """x@(w1 + w2) or (x1 + x2)@w: what the expanding distributivity rules match."""
    batched = draw(st.booleans())
    mul = _bdot if batched else dot
    xs, ws = _matrices(draw, prog, batched, 2)
    if draw(st.booleans()):
        return prog.apply("dot", mul, prog.fresh(xs), prog.apply("add", lax.add, prog.fresh(ws), prog.fresh(ws)))
    return prog.apply("dot", mul, prog.apply("add", lax.add, prog.fresh(xs), prog.fresh(xs)), prog.fresh(ws))


def _gen_transposed(draw: DrawFn, prog: Program) -> int:
    """y @ t^T for t a product, a product with a transposed operand or a sum: (MT (Dot ..)), (MT (MT ..)) etc.,
    what the transpose rules match."""
    kind = draw(st.sampled_from(["dot", "dot_t", "add"]))
    batched = draw(st.booleans()) and kind != "dot_t"
    lead = dims(draw, 1) if batched else ()
    p, q, r, m = dims(draw, 4)
    a = prog.fresh((*lead, p, q))
    if kind == "add":
        t = prog.apply("add", lax.add, prog.pick(draw, lambda s: s == (*lead, p, q), (*lead, p, q)), a)
        r = q
    elif kind == "dot_t":
        t = prog.apply("dot_t", _dot_t, a, prog.fresh((r, q)))
    else:
        t = prog.apply("dot", _bdot if batched else dot, a, prog.fresh((*lead, q, r)))
    y = prog.fresh((*lead, m, r))
    return prog.apply("batch_dot_t" if batched else "dot_t", _bdot_t if batched else _dot_t, y, t)


def _gen_shared_dots(draw: DrawFn, prog: Program) -> int:
    """Two products of one input kept as separate results: what merging GEMMs that share an input matches."""
    x = prog.fresh(dims(draw, draw(st.integers(1, 3))))
    k = prog.shapes[x][-1]
    prog.apply("dot", dot, x, prog.fresh((k, draw(st.integers(1, 8)))))
    return prog.apply("dot", dot, x, prog.fresh((k, draw(st.integers(1, 8)))))


def _gen_step_projections(draw: DrawFn, prog: Program) -> int:
    """xs[t] @ W1 and xs[t] @ W2 for every step t of a sequence (an unrolled RNN's input projections): what batching
    a GEMM over the steps and merging GEMMs in program order match."""
    steps, batch, k = draw(st.integers(2, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 8))
    xs = prog.fresh((steps, batch, k))
    w1, w2 = prog.fresh((k, draw(st.integers(1, 8)))), prog.fresh((k, draw(st.integers(1, 8))))
    for t in range(steps):
        x = prog.apply(f"xs[{t}]", lambda v, t=t: v[t], xs)
        prog.apply("dot", dot, x, w1)
        out = prog.apply("dot", dot, x, w2)
    return out


_ACTIVATION_FNS = {"none": lambda y: y, "relu": jax.nn.relu, "tanh": jnp.tanh, "logistic": jax.nn.sigmoid}


def _dense(act: str) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_dense(draw, prog, act)


def _gen_dense(draw: DrawFn, prog: Program, act: str) -> int:
    """act(x @ W + b), b along the last axis, one or two such layers of one input: what grouping a GEMM with its
    bias and activation, and merging the groups, match. One generator entry per activation, so each leads some."""
    x = prog.fresh(dims(draw, draw(st.integers(2, 3))))
    out = x
    for _ in range(draw(st.integers(1, 2))):
        n = draw(st.integers(1, 8))
        w, b = prog.fresh((prog.shapes[x][-1], n)), prog.fresh((n,))
        fn = _ACTIVATION_FNS[act]
        out = prog.apply(f"dense_{act}", lambda v, w, b, fn=fn: fn(v @ w + b), x, w, b)
    return out


def _gen_concat(draw: DrawFn, prog: Program) -> int:
    a = any_value(draw, prog)
    shape = prog.shapes[a]
    axis = draw(st.integers(0, len(shape) - 1))
    other = (*shape[:axis], draw(st.integers(1, 8)), *shape[axis + 1 :])
    b = prog.pick(
        draw, lambda s: len(s) == len(shape) and s[:axis] + s[axis + 1 :] == shape[:axis] + shape[axis + 1 :], other
    )
    return prog.apply(f"concat{axis}", lambda x, y: lax.concatenate([x, y], axis), a, b)


def _gen_slice(draw: DrawFn, prog: Program) -> int:
    a = any_value(draw, prog)
    shape = prog.shapes[a]
    axis = draw(st.integers(0, len(shape) - 1))
    start = draw(st.integers(0, shape[axis] - 1))
    stop = draw(st.integers(start + 1, shape[axis]))
    return prog.apply(f"slice{axis}[{start}:{stop}]", lambda x: lax.slice_in_dim(x, start, stop, axis=axis), a)


def _gen_bcast(draw: DrawFn, prog: Program) -> int:
    """broadcast_in_dim adding a leading axis."""
    a = prog.pick(draw, lambda s: 1 <= len(s) <= 2, dims(draw, draw(st.integers(1, 2))))
    out = (draw(st.integers(1, 4)), *prog.shapes[a])
    return prog.apply("bcast", lambda x: lax.broadcast_in_dim(x, out, tuple(range(1, len(out)))), a)


def row(prog: Program, shape: Shape) -> int:
    """A fresh vector along the last axis broadcast to `shape`: a per-channel scale or bias."""
    return prog.apply("bcast_row", lambda v: lax.broadcast_in_dim(v, shape, (len(shape) - 1,)), prog.fresh(shape[-1:]))


_TRANSPOSE_INNER = ("", "add", "mul", "tanh", "exp")


def _transpose(inner: str, rank: int | None = None) -> Callable[[DrawFn, Program], int]:
    return lambda draw, prog: _gen_transpose(draw, prog, inner, rank)


def _gen_transpose(draw: DrawFn, prog: Program, inner: str, rank: int | None = None) -> int:
    """A permutation of the axes (often a swap of the last two), of a value or of an elementwise op; of a given
    rank or of rank 2-4."""
    ranks = (rank, rank) if rank else (2, 4)
    a = prog.pick(draw, lambda s: ranks[0] <= len(s) <= ranks[1], dims(draw, draw(st.integers(*ranks))))
    if inner in ("add", "mul"):
        b = prog.pick(draw, lambda s: s == prog.shapes[a], prog.shapes[a])
        a = prog.apply(inner, lax.add if inner == "add" else lax.mul, a, b)
    elif inner:
        a = prog.apply(inner, lax.tanh if inner == "tanh" else lambda x: lax.exp(lax.tanh(x)), a)
    n = len(prog.shapes[a])
    swap = (*range(n - 2), n - 1, n - 2)
    perm = swap if draw(st.booleans()) else tuple(draw(st.permutations(range(n))))
    return prog.apply(f"transpose{perm}", lambda x: lax.transpose(x, perm), a)


def _gen_reshape(draw: DrawFn, prog: Program) -> int:
    """Two reshapes in a row (flatten, then back or to another factorization)."""
    a = any_value(draw, prog)
    shape = prog.shapes[a]
    flat = prog.apply("reshape", lambda x: lax.reshape(x, (int(np.prod(shape)),)), a)
    back = shape if draw(st.booleans()) else (int(np.prod(shape[:-1])), shape[-1])
    return prog.apply(f"reshape{back}", lambda x: lax.reshape(x, back), flat)


def _gen_pad(draw: DrawFn, prog: Program) -> int:
    a = any_value(draw, prog)
    config = [(draw(st.integers(0, 2)), draw(st.integers(0, 2)), 0) for _ in prog.shapes[a]]
    return prog.apply(f"pad{config}", lambda x: lax.pad(x, np.asarray(0, x.dtype), config), a)


def _reduce(fn: Callable[..., Any]) -> Callable[[DrawFn, Program], int]:
    def gen(draw: DrawFn, prog: Program) -> int:
        a = prog.pick(draw, lambda s: len(s) >= 2, dims(draw, draw(st.integers(2, 3))))
        axis = draw(st.integers(0, len(prog.shapes[a]) - 1))
        return prog.apply(f"{fn.__name__}{axis}", lambda x: fn(x, axis=axis), a)

    return gen


_CONCAT_KINDS = ("slice", "adjacent", "assoc", "add", "mul", "tanh", "logistic", "exp", "dot")


def _concat_ops(kind: str) -> Callable[[DrawFn, Program], int]:
    """Concats taken apart, re-associated, or under elementwise ops and contractions: the concat rules."""
    return lambda draw, prog: _gen_concat_ops(draw, prog, kind)


def _gen_concat_ops(draw: DrawFn, prog: Program, kind: str) -> int:
    rows, k, n = dims(draw, 3)
    axis = draw(st.integers(0, 1))
    part = (rows, k)
    a, b = prog.fresh(part), prog.fresh(part)

    def cat(p: int, q: int, ax: int = axis) -> int:
        return prog.apply(f"concat{ax}", lambda x, y: lax.concatenate([x, y], ax), p, q)

    z = cat(a, b)
    if kind == "slice":
        lo, hi = (0, part[axis]) if draw(st.booleans()) else (part[axis], 2 * part[axis])
        return prog.apply(f"slice{axis}[{lo}:{hi}]", lambda x: lax.slice_in_dim(x, lo, hi, axis=axis), z)
    if kind == "adjacent":
        mid = part[axis]
        p = prog.apply(f"slice{axis}[0:{mid}]", lambda x: lax.slice_in_dim(x, 0, mid, axis=axis), z)
        q = prog.apply(f"slice{axis}[{mid}:]", lambda x: lax.slice_in_dim(x, mid, 2 * mid, axis=axis), z)
        return cat(p, q)
    if kind == "assoc":
        return cat(z, prog.fresh(part))
    if kind in ("add", "mul"):
        return prog.apply(kind, lax.add if kind == "add" else lax.mul, z, cat(prog.fresh(part), prog.fresh(part)))
    if kind in ("tanh", "logistic", "exp"):  # the pieces are fresh normal inputs: exp cannot overflow
        return prog.apply(kind, {"tanh": lax.tanh, "logistic": lax.logistic, "exp": lax.exp}[kind], z)
    if axis == 0:  # rows concatenated, then contracted over the columns
        return prog.apply("dot", dot, z, prog.fresh((k, n)))
    return prog.apply("dot", dot, prog.fresh((n, rows)), cat(prog.fresh(part), prog.fresh(part), 1))


def _gen_opaque(draw: DrawFn, prog: Program) -> int:
    """Primitives the table does not model: an opaque call, and a multi-result one projected with Get."""
    a = any_value(draw, prog)
    if draw(st.booleans()):
        return prog.apply("sin", lax.sin, a)
    b = prog.pick(draw, lambda s: s == prog.shapes[a], prog.shapes[a])
    return prog.apply("sort_by", lambda x, y: lax.sort((x, y), num_keys=1)[1], a, b)


def _gen_arg_reduce(draw: DrawFn, prog: Program) -> int:
    """argmax or argmin along an axis, of the input or of its floor (ties: the first position counts), the index
    as a float so that later steps can use it."""
    x = prog.pick(draw, lambda s: len(s) >= 1, dims(draw, draw(st.integers(1, 3))))
    axis = draw(st.integers(0, len(prog.shapes[x]) - 1))
    reduce = draw(st.sampled_from([jnp.argmax, jnp.argmin]))
    tied = draw(st.booleans())

    def index(v: Any) -> Any:
        return reduce(jnp.floor(v) if tied else v, axis=axis).astype(v.dtype)

    return prog.apply(f"{reduce.__name__}{axis}{'_of_floor' if tied else ''}", index, x)


def _naive_softmax(rank: int) -> Callable[[DrawFn, Program], int]:
    """exp(x) / sum(exp(x)) over the last axis of a rank-`rank` input, as people write it: what the stable-softmax
    rule of that rank matches (one entry per rank, so that each rank leads programs of its own)."""

    def gen(draw: DrawFn, prog: Program) -> int:
        x = prog.fresh(dims(draw, rank))
        return prog.apply("naive_softmax", lambda v: jnp.exp(v) / jnp.sum(jnp.exp(v), axis=-1, keepdims=True), x)

    return gen


def _gen_naive_logsumexp(draw: DrawFn, prog: Program) -> int:
    """log(sum(exp(x))) over an axis, or log-softmax x - log(sum(exp(x), keepdims)): the stable-logsumexp rule."""
    x = prog.fresh(dims(draw, draw(st.integers(1, 3))))
    axis = draw(st.integers(0, len(prog.shapes[x]) - 1))
    if draw(st.booleans()):
        return prog.apply("naive_lse", lambda v: jnp.log(jnp.sum(jnp.exp(v), axis=axis)), x)
    return prog.apply("naive_log_softmax", lambda v: v - jnp.log(jnp.sum(jnp.exp(v), axis=axis, keepdims=True)), x)


def _unary_of_broadcast(fn: Callable[[Any], Any]) -> Callable[[DrawFn, Program], int]:
    """fn of a broadcast value: what moving unary ops before broadcasts matches."""

    def gen(draw: DrawFn, prog: Program) -> int:
        a = prog.fresh(dims(draw, draw(st.integers(1, 2))))
        out = (draw(st.integers(1, 4)), *prog.shapes[a])
        return prog.apply(
            f"{fn.__name__}_of_bcast", lambda v: fn(lax.broadcast_in_dim(v, out, tuple(range(1, len(out))))), a
        )

    return gen


ALGEBRA: dict[str, Callable[[DrawFn, Program], int]] = {
    "Dot": _gen_dot,
    **{f"Dense-{act}": _dense(act) for act in _ACTIVATION_FNS},
    "BatchDot": _gen_batch_dot,
    "MT": _gen_dot_t,
    "Add": _binary(lax.add),
    "Sub": _binary(lax.sub),
    "Mul": _binary(lax.mul),
    "Div": _binary(lax.div, positive_right=True),
    "Max": _binary(lax.max),
    "Min": _binary(lax.min),
    "Neg": _unary(lax.neg),
    "Exp": _unary(lax.exp, "bounded"),
    "Log": _unary(lax.log, "positive"),
    "Tanh": _unary(lax.tanh),
    "Logistic": _unary(lax.logistic),
    "Sqrt": _unary(lax.sqrt, "positive"),
    "Rsqrt": _unary(lax.rsqrt, "positive"),
    "Erf": _unary(lax.erf),
    "Erfc": _unary(lax.erfc),
    "Concat": _gen_concat,
    "Slice": _gen_slice,
    "Bcast": _gen_bcast,
    "BcastBatchDot": _gen_batch_dot,
    "Op": _gen_opaque,
    "ArgReduce": _gen_arg_reduce,
    "ArgReduceMasked": _gen_arg_reduce,
    **{f"Transpose{'-' + inner if inner else ''}": _transpose(inner) for inner in _TRANSPOSE_INNER},
    "Transpose-4d": _transpose("", rank=4),
    "Reshape": _gen_reshape,
    "Pad": _gen_pad,
    "ReduceSum": _reduce(jnp.sum),
    "ReduceMax": _reduce(jnp.max),
    **{f"concat-{kind}": _concat_ops(kind) for kind in _CONCAT_KINDS},
    # rule patterns several ops make up
    "chain": _gen_chain,
    **{
        f"{kind}-sum-{share}": _dot_sum(kind == "batchdot", share)
        for kind in ("dot", "batchdot")
        for share in ("left", "right", "none")
    },
    "dot-of-sum": _gen_dot_of_sum,
    "shared-dots": _gen_shared_dots,
    "step-projections": _gen_step_projections,
    "transposed": _gen_transposed,
    **{f"Softmax-{rank}d": _naive_softmax(rank) for rank in (2, 3, 4)},
    "LogSumExp": _gen_naive_logsumexp,
    "exp-of-bcast": _unary_of_broadcast(lambda v: lax.exp(lax.tanh(v))),
    "tanh-of-bcast": _unary_of_broadcast(lax.tanh),
    "log-of-bcast": _unary_of_broadcast(lambda v: lax.log(lax.exp(lax.tanh(v)))),
}
