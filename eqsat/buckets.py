"""Dynamic shapes by buckets: a declared axis (a batch axis whose rows are independent) is padded with zeros up to
the smallest bucket size that holds it and the results are sliced back, so every size between two buckets runs
one plan and one executable, as inference compilers' shape buckets do.

`optimize(f, buckets=Buckets((8, 16, 32), argnums=(1,)))`: every array leaf of argument 1 carries the axis
(axis 0 unless told); a result carries it where its length along the axis follows the padded size. Sizes above
the largest bucket run at their own size. With validation on, the first call of each bucket compares the padded
program, sliced, with the unpadded original on that call's arguments; where they differ (the rows were not
independent) eqsat warns and that bucket's sizes run unpadded from then on.
"""

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from eqsat.errors import EqsatWarning
from eqsat.tolerance import comparable, mismatch

if TYPE_CHECKING:
    from eqsat.api import Optimized
    from eqsat.extract.plan import Plan


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


class Bucketed:
    """What optimize(f, buckets=...) returns: calls pad to a bucket, run the optimized f, and slice back."""

    def __init__(self, optimized: "Optimized", buckets: Buckets) -> None:
        self.optimized, self.buckets = optimized, buckets
        self._batched: dict[Any, list[bool]] = {}  # padded signature -> which result leaves carry the axis
        self._checked: set[int] = set()  # buckets whose padded program matched the unpadded one
        self._unpadded: set[int] = set()  # buckets that did not: their sizes run as they are
        statics: dict[str, Any] = {"static_argnums": optimized.options.static_argnums}
        if optimized.options.static_argnames:  # jax.jit refuses names, even (), for a function without a signature
            statics["static_argnames"] = optimized.options.static_argnames
        self._original = jax.jit(optimized.fun, **statics)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        n = self._size(args)
        size = self.buckets.bucket(n)
        if size == n or size in self._unpadded:
            return self.optimized(*args, **kwargs)
        padded = self._padded(args, size)
        out = self._sliced(self.optimized(*padded, **kwargs), padded, kwargs, n)
        if size not in self._checked and self.optimized.options.validate and _concrete(args):
            self._checked.add(size)
            if not self._agrees(args, kwargs, out, size):
                self._unpadded.add(size)
                return self.optimized(*args, **kwargs)
        return out

    def plan(self, *args: Any, **kwargs: Any) -> "Plan":
        """The plan calls with these arguments run: that of their bucket's padded shapes."""
        size = self.buckets.bucket(self._size(args))
        return self.optimized.plan(*(args if size in self._unpadded else self._padded(args, size)), **kwargs)

    def cache_info(self) -> dict[str, int]:
        return self.optimized.cache_info()

    def clear_cache(self) -> None:
        self.optimized.clear_cache()
        self._batched.clear()
        self._checked.clear()
        self._unpadded.clear()

    def _leaves(self, args: tuple) -> list[Any]:
        n = len(args)
        bad = [i for i in self.buckets.argnums if not -n <= i < n]
        if bad:
            raise ValueError(f"buckets name argument(s) {bad}, but the call passes {n} positional argument(s)")
        return [leaf for i in self.buckets.argnums for leaf in jax.tree_util.tree_leaves(args[i])]

    def _size(self, args: tuple) -> int:
        """The length of the bucketed axis, which every leaf of the bucketed arguments must share."""
        axis = self.buckets.axis
        sizes = {np.shape(leaf)[axis] if np.ndim(leaf) > axis else None for leaf in self._leaves(args)}
        if len(sizes) != 1 or None in sizes:
            found = sorted(str(s) for s in sizes) or ["no array"]
            raise ValueError(
                f"buckets: every array of argument(s) {self.buckets.argnums} must have one length along axis {axis} "
                f"(the batch axis), found {', '.join(found)}"
            )
        return sizes.pop()

    def _padded(self, args: tuple, size: int) -> tuple:
        axis = self.buckets.axis

        def pad(leaf: Any) -> Any:
            widths = [(0, 0)] * np.ndim(leaf)
            widths[axis] = (0, size - np.shape(leaf)[axis])
            return jnp.pad(leaf, widths)

        positions = {i % len(args) for i in self.buckets.argnums}
        return tuple(jax.tree_util.tree_map(pad, a) if i in positions else a for i, a in enumerate(args))

    def _sliced(self, out: Any, padded: tuple, kwargs: dict[str, Any], n: int) -> Any:
        leaves, tree = jax.tree_util.tree_flatten(out)
        batched = self._batched_results(padded, kwargs)
        axis = self.buckets.axis
        cut = [jax.lax.slice_in_dim(x, 0, n, axis=axis) if b else x for x, b in zip(leaves, batched, strict=True)]
        return jax.tree_util.tree_unflatten(tree, cut)

    def _batched_results(self, padded: tuple, kwargs: dict[str, Any]) -> list[bool]:
        """Which result leaves carry the axis: those whose length along it follows the padded size (traced with
        one more row to tell them from results that merely have that length)."""
        key = (
            jax.tree_util.tree_structure((padded, kwargs)),
            tuple((np.shape(x), jnp.result_type(x)) for x in jax.tree_util.tree_leaves((padded, kwargs))),
        )
        if key not in self._batched:
            size = self._size(padded)
            shapes = [
                [np.shape(x) for x in jax.tree_util.tree_leaves(jax.eval_shape(self.optimized.fun, *a, **kwargs))]
                for a in (padded, self._padded(padded, size + 1))
            ]
            axis = self.buckets.axis
            self._batched[key] = [
                len(s) > axis and s[axis] == size and t[axis] == size + 1 for s, t in zip(*shapes, strict=True)
            ]
        return self._batched[key]

    def _agrees(self, args: tuple, kwargs: dict[str, Any], got: Any, size: int) -> bool:
        expected = jax.tree_util.tree_leaves(self._original(*args, **kwargs))
        problem = mismatch(comparable(expected), comparable(jax.tree_util.tree_leaves(got)))
        if problem is None:
            return True
        warnings.warn(
            f"eqsat: {getattr(self.optimized.fun, '__name__', 'the function')} padded to bucket {size} along axis "
            f"{self.buckets.axis} differs from the unpadded original ({problem}): its rows are not independent; "
            "sizes of this bucket run unpadded",
            EqsatWarning,
            stacklevel=3,
        )
        return False


def _concrete(args: tuple) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args))
