"""Dynamic shapes by buckets: a declared axis (a batch axis whose rows are independent) is padded with zeros up to
the smallest bucket size that holds it and the results are sliced back, so every size between two buckets runs
one plan and one executable, as inference compilers' shape buckets do.

`optimize(f, buckets=Buckets((8, 16, 32), argnums=(1,)))`: every array leaf of argument 1 (passed by position or
by keyword) carries the axis (axis 0 unless told). Sizes above the largest bucket run at their own size. Whether
padding is harmless is decided once per bucket from the program (eqsat/capture/rows.py), never from a call's values:
where it keeps the rows apart, each result carrying them is sliced back along the axis the walk found; where an
op mixes them (a reduction over the batch, a contraction, a sort...), eqsat warns once, naming the op and the
line, and that bucket's sizes run unpadded.
"""

import inspect
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import api_util  # fun_signature: the parameters jax.jit resolves argument numbers against

from eqsat.capture.rows import Axis, RowsMixed, row_axes
from eqsat.support.errors import EqsatWarning

if TYPE_CHECKING:
    from eqsat.plans.options import ResolvedOptions

_NOT_THE_CALLER = (os.path.dirname(jax.__file__), os.path.dirname(__file__))


@dataclass(frozen=True)
class Buckets:
    """The sizes a batch axis is padded up to, and which arguments (positional numbers) carry that axis."""

    sizes: tuple[int, ...]
    argnums: tuple[int, ...] = (0,)
    axis: int = 0

    def __post_init__(self) -> None:
        sizes = (self.sizes,) if isinstance(self.sizes, int) else tuple(self.sizes)
        if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
            raise ValueError(f"Buckets.sizes takes positive ints such as (8, 16, 32), got {self.sizes!r:.80}")
        argnums = (self.argnums,) if isinstance(self.argnums, int) else tuple(self.argnums)
        if not argnums or not all(isinstance(i, int) and not isinstance(i, bool) for i in argnums):
            raise TypeError(f"Buckets.argnums takes argument numbers (ints), got {self.argnums!r:.80}")
        if not isinstance(self.axis, int) or isinstance(self.axis, bool) or self.axis < 0:
            raise ValueError(f"Buckets.axis takes a non-negative int, got {self.axis!r:.80}")
        object.__setattr__(self, "sizes", tuple(sorted(set(sizes))))
        object.__setattr__(self, "argnums", argnums)

    def bucket(self, n: int) -> int:
        """The smallest size that holds n; n itself above the largest."""
        return next((s for s in self.sizes if s >= n), n)


@dataclass(frozen=True)
class PaddedCall:
    """A call padded to its bucket: the padded arguments, the rows the call has, and where each result leaf carries
    them (None: a leaf without the rows)."""

    args: tuple
    kwargs: dict[str, Any]
    rows: int
    row_axes: list[Axis]

    def cut(self, out: Any) -> Any:
        """The padded call's results sliced back to the call's rows."""
        leaves, tree = jax.tree_util.tree_flatten(out)
        cut = [x if q is None else _cut(x, self.rows, q) for x, q in zip(leaves, self.row_axes, strict=True)]
        return jax.tree_util.tree_unflatten(tree, cut)


def _cut(x: Any, n: int, axis: int) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):  # eval_shape's results
        return jax.ShapeDtypeStruct((*x.shape[:axis], n, *x.shape[axis + 1 :]), x.dtype, weak_type=x.weak_type)
    return jax.lax.slice_in_dim(x, 0, n, axis=axis)


class Padding:
    """How optimize(f, buckets=...) pads a call to its bucket, where the program keeps rows apart
    (eqsat/capture/rows.py): every method of the optimized function (call, plan, lower, trace, eval_shape, prepare,
    memory, profile) runs the padded call, and a call's results are sliced back."""

    def __init__(self, fun: Any, options: "ResolvedOptions") -> None:
        self.fun, self.options, self.buckets = fun, options, options.buckets
        static = set(self.buckets.argnums) & set(options.static_argnums)
        if static:
            raise ValueError(f"buckets name argument(s) {sorted(static)}, which static_argnums makes static")
        signature = api_util.fun_signature(fun)
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = [] if signature is None else [p for p in signature.parameters.values() if p.kind in positional]
        self._names = [p.name for p in params]  # a bucketed argument may come by keyword, or be named in errors
        self._keywords = {p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}
        self._rows: dict[Any, list[Axis] | None] = {}  # padded call -> each result's row axis; None: rows mix
        self._warned: set[str] = set()

    def clear(self) -> None:
        self._rows.clear()

    def padded(self, args: tuple, kwargs: dict[str, Any]) -> PaddedCall | None:
        """The call padded to its bucket; None where it runs unpadded (a size that is a bucket's or above them all,
        or rows that the program mixes)."""
        where = self._where(args, kwargs)
        n = self._size(args, kwargs, where)
        size = self.buckets.bucket(n)
        rows = None if size == n else self._row_axes(args, kwargs, where, size)
        if rows is None:
            return None
        padded_args = tuple(self._pad(a, size) if i in where else a for i, a in enumerate(args))
        return PaddedCall(padded_args, {k: self._pad(v, size) if k in where else v for k, v in kwargs.items()}, n, rows)

    def _where(self, args: tuple, kwargs: dict[str, Any]) -> list[int | str]:
        """Each bucketed argument's place in this call: its position, or its name where it comes by keyword."""
        n, places = len(args), []
        for i in self.buckets.argnums:
            name = self._names[i] if 0 <= i < len(self._names) else None
            if -n <= i < n:
                places.append(i % n)
            elif name in self._keywords and name in kwargs:
                places.append(name)
            else:
                raise ValueError(
                    f"buckets name argument {i}{f' ({name})' if name else ''}, but the call passes {n} positional "
                    f"argument(s) and {'no' if name in self._keywords else 'cannot pass it as a'} keyword argument "
                    f"{name or ''}".rstrip()
                )
        return places

    def _size(self, args: tuple, kwargs: dict[str, Any], where: list[int | str]) -> int:
        """The length of the bucketed axis, which every leaf of the bucketed arguments must share."""
        axis, lengths = self.buckets.axis, {}
        for place in where:
            value = args[place] if isinstance(place, int) else kwargs[place]
            for path, leaf in jax.tree_util.tree_leaves_with_path(value):
                label = f"argument {place}{self._named(place)}{jax.tree_util.keystr(path)}"
                if np.ndim(leaf) <= axis:
                    raise ValueError(
                        f"buckets: {label} has shape {np.shape(leaf)}, which has no axis {axis} to pad "
                        f"(Buckets(axis={axis}) names the batch axis of every array of the bucketed arguments)"
                    )
                lengths.setdefault(np.shape(leaf)[axis], label)
        if len(lengths) != 1:
            found = ", ".join(f"{length} ({label})" for length, label in lengths.items()) or "no array"
            raise ValueError(
                f"buckets: every array of argument(s) {self.buckets.argnums} must have one length along axis {axis} "
                f"(the batch axis), found {found}"
            )
        return next(iter(lengths))

    def _named(self, place: int | str) -> str:
        name = self._names[place] if isinstance(place, int) and place < len(self._names) else None
        return f" ({name})" if name else ""

    def _pad(self, value: Any, size: int) -> Any:
        axis = self.buckets.axis

        def pad(leaf: Any) -> Any:
            widths = [(0, 0)] * np.ndim(leaf)
            widths[axis] = (0, size - np.shape(leaf)[axis])
            return jnp.pad(leaf, widths)

        return jax.tree_util.tree_map(pad, value)

    def _row_axes(self, args: tuple, kwargs: dict[str, Any], where: list[int | str], size: int) -> list[Axis] | None:
        """Where each result leaf of the call padded to `size` carries the rows, or None where the program mixes
        rows (warned once per reason): decided from the program traced at the padded length and one row longer."""
        options = self.options
        static = {i % len(args) for i in options.static_argnums if -len(args) <= i < len(args)}
        dynamic = (
            [None if i in static else a for i, a in enumerate(args)],
            {k: v for k, v in kwargs.items() if k not in options.static_argnames},
        )
        leaves, tree = jax.tree_util.tree_flatten(dynamic)
        tops = [*enumerate(dynamic[0]), *sorted(dynamic[1].items())]  # in the order jax flattens them
        marks = [place in where for place, value in tops for _ in jax.tree_util.tree_leaves(value)]
        avals = [jax.typeof(x) for x in leaves]
        key = (  # the padded call's: sizes of one bucket share it
            tree,
            tuple(
                (self._length(a.shape, size) if m else a.shape, a.dtype, a.weak_type)
                for a, m in zip(avals, marks, strict=True)
            ),
            tuple((type(args[i]), args[i]) for i in sorted(static)),  # f(x, 1) and f(x, True) trace apart
            tuple((k, type(kwargs[k]), kwargs[k]) for k in options.static_argnames if k in kwargs),
            size,
        )
        if key not in self._rows:
            self._rows[key] = self._decided(args, kwargs, static, tree, avals, marks, size)
        return self._rows[key]

    def _length(self, shape: tuple[int, ...], length: int) -> tuple[int, ...]:
        """The shape with the bucketed axis `length` long."""
        axis = self.buckets.axis
        return (*shape[:axis], length, *shape[axis + 1 :])

    def _decided(
        self, args: tuple, kwargs: dict, static: set[int], tree: Any, avals: list, marks: list[bool], size: int
    ) -> list[Axis] | None:
        axis = self.buckets.axis

        def flat(*leaves: Any) -> Any:
            dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(tree, leaves)
            full = [args[i] if i in static else a for i, a in enumerate(dyn_args)]
            return self.fun(*full, **{**kwargs, **dyn_kwargs})

        def traced(length: int) -> Any:
            shapes = [
                jax.ShapeDtypeStruct(self._length(a.shape, length) if m else a.shape, a.dtype, weak_type=a.weak_type)
                for a, m in zip(avals, marks, strict=True)
            ]
            return jax.make_jaxpr(flat)(*shapes)

        try:
            small = traced(size)
            rows = row_axes(small, traced(size + 1), [axis if m else None for m in marks], size)
        except RowsMixed as mixed:
            reason = str(mixed)
        except Exception as error:  # the function does not trace padded (its own shape checks)
            reason = (
                f"it does not trace at the bucket's length, {size}, or one longer ({type(error).__name__}: {error})"
            )
        else:
            return rows
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(
                f"eqsat: {getattr(self.fun, '__name__', 'the function')} runs unpadded: its rows along axis "
                f"{axis} of argument(s) {self.buckets.argnums} are not independent ({reason})",
                EqsatWarning,
                skip_file_prefixes=_NOT_THE_CALLER,  # the user's call, under jax's transformations too
            )
        return None
