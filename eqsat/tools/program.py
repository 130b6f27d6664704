"""Random JAX programs for `rules check`: inputs of random shapes and steps over earlier values, drawn by the
generators of eqsat/tools/gen_algebra.py and eqsat/tools/gen_conv.py (hypothesis strategies)."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from hypothesis import strategies as st
from jax import lax

from eqsat.numerics.sample import example_array

Shape = tuple[int, ...]

DrawFn = Callable[[st.SearchStrategy[Any]], Any]


@dataclass(frozen=True)
class _Step:
    label: str
    fn: Callable[..., Any]  # the JAX computation of this value from its arguments' values
    args: tuple[int, ...]


@dataclass
class Program:
    """A random JAX program: values are inputs (a shape) or steps over earlier values; results are the sinks."""

    dtype: str
    values: list[Shape | _Step] = field(default_factory=list)
    shapes: list[Shape] = field(default_factory=list)

    def fresh(self, shape: Shape) -> int:
        self.values.append(tuple(shape))
        self.shapes.append(tuple(shape))
        return len(self.values) - 1

    def apply(self, label: str, fn: Callable[..., Any], *args: int) -> int:
        """Append a step; its shape comes from tracing fn, so generators need not compute shapes."""
        structs = [jax.ShapeDtypeStruct(self.shapes[a], self.dtype) for a in args]
        with jax.enable_x64(self.dtype.endswith("64")):
            out = jax.eval_shape(fn, *structs)
        self.values.append(_Step(label, fn, tuple(args)))
        self.shapes.append(tuple(out.shape))
        return len(self.values) - 1

    def pick(self, draw: DrawFn, ok: Callable[[Shape], bool], fresh: Shape) -> int:
        """An earlier value whose shape is ok (sharing operands is what many rules need), or a fresh input."""
        candidates = [i for i, s in enumerate(self.shapes) if ok(s)]
        if candidates and draw(st.booleans()):
            return draw(st.sampled_from(candidates))
        return self.fresh(fresh)

    @property
    def input_shapes(self) -> list[Shape]:
        return [v for v in self.values if not isinstance(v, _Step)]

    def outputs(self) -> list[int]:
        used = {a for v in self.values if isinstance(v, _Step) for a in v.args}
        return [i for i, v in enumerate(self.values) if isinstance(v, _Step) and i not in used]

    def __call__(self, *inputs: Any) -> list[Any]:
        it = iter(inputs)
        vals: list[Any] = []
        for v in self.values:
            vals.append(v.fn(*[vals[a] for a in v.args]) if isinstance(v, _Step) else next(it))
        return [vals[i] for i in self.outputs()]

    def random_inputs(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [example_array(s, self.dtype, rng) for s in self.input_shapes]

    def __repr__(self) -> str:
        lines, k = [f"dtype {self.dtype}"], 0
        for i, v in enumerate(self.values):
            if isinstance(v, _Step):
                lines.append(f"v{i} = {v.label}({', '.join(f'v{a}' for a in v.args)}) : {self.shapes[i]}")
            else:
                lines.append(f"v{i} = input x{k} : {v}")
                k += 1
        return "\n".join(lines)


def dims(draw: DrawFn, n: int, lo: int = 1, hi: int = 8) -> Shape:
    return tuple(draw(st.integers(lo, hi)) for _ in range(n))


def positive(prog: Program, x: int) -> int:
    """exp(tanh(x)) lies in [1/e, e]: a safe argument for log, sqrt, rsqrt and division."""
    return prog.apply("exp", lax.exp, prog.apply("tanh", lax.tanh, x))


def any_value(draw: DrawFn, prog: Program) -> int:
    """Any earlier non-scalar value (conv outputs included), or a fresh rank 1-3 input."""
    return prog.pick(draw, lambda s: len(s) >= 1, dims(draw, draw(st.integers(1, 3))))
