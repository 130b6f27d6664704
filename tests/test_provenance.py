"""Provenance: every plan node says where in the user's program it came from (name stack, source line), rewritten
nodes the union of what they replaced, inputs their pytree path; the diff speaks in those names."""

import inspect
import os
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.extract import changes

HERE = os.path.relpath(__file__)


def _line(fn, text: str) -> int:
    """The line number of the line of fn's source that contains text."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(k for k, line in enumerate(lines) if text in line)


def two_heads(params: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    with jax.named_scope("proj"):
        with jax.named_scope("a"):
            a = x @ params["a"]  # head a
        with jax.named_scope("b"):
            b = x @ params["b"]  # head b
    return jnp.tanh(a), jnp.tanh(b)


@pytest.fixture(scope="module")
def merged():
    """Two GEMMs of one input, merged on h100 with the weights prepared (shared-input-merge)."""
    rng = np.random.default_rng(0)
    params = {k: rng.normal(size=(256, 256)).astype(np.float32) for k in "ab"}
    x = rng.normal(size=(64, 256)).astype(np.float32)
    return eqsat.optimize(two_heads, target="h100", params_argnums=0).plan(params, x)


def test_kept_nodes_carry_their_own_scope_and_line(merged):
    tanh = [n for n in merged.nodes if n.op == "Tanh"]
    assert len(tanh) == 2 and not any(n.rewritten for n in tanh)
    assert all(n.scopes == () for n in tanh)  # outside any named scope
    assert {n.sources for n in tanh} == {(f"{HERE}:{_line(two_heads, 'return jnp.tanh')} (two_heads)",)}


def test_rewritten_nodes_carry_the_union_of_what_they_replaced(merged):
    line_a, line_b = _line(two_heads, "# head a"), _line(two_heads, "# head b")
    (dot,) = [n for n in merged.nodes if n.op == "Dot"]
    assert dot.rewritten and dot.scopes == ("proj/a", "proj/b")
    assert dot.sources == (f"{HERE}:{line_a} (two_heads)", f"{HERE}:{line_b} (two_heads)")
    slices = [n for n in merged.nodes if n.op == "Slice"]
    assert sorted(n.scopes for n in slices) == [("proj/a",), ("proj/b",)]  # each stands for one head


def test_inputs_carry_their_pytree_path_and_whether_they_are_parameters(merged):
    inputs = {n.path: n.parameter for n in merged.nodes if n.op == "Var"}
    assert inputs == {"x": False, "params.a": True, "params.b": True}


def test_paths_of_nested_pytrees_keywords_and_static_arguments():
    def f(scale, params, *, bias):
        return params["layers"][0]["w"] * scale + params["layers"][1]["w"] + bias[0]

    fast = eqsat.optimize(f, static_argnums=0, params_argnums=1)
    one = np.ones(3, np.float32)
    plan = fast.plan(2.0, {"layers": [{"w": one}, {"w": one}]}, bias=(one,))
    paths = sorted(n.path for n in plan.nodes if n.op == "Var" and n.path)
    assert paths == ["bias[0]", "params.layers[0].w", "params.layers[1].w"]


def test_scopes_of_inlined_jit_bodies_nest_under_the_caller():
    @jax.jit
    def inner(x):
        with jax.named_scope("inner"):
            return jnp.sin(x)

    def outer(x):
        with jax.named_scope("outer"):
            return inner(x) * 2

    plan = eqsat.optimize(outer).plan(np.ones(4, np.float32))
    scopes = {n.op: n.scopes for n in plan.nodes if n.op != "Var"}
    assert scopes == {"Op": ("outer/inner",), "Mul": ("outer",)}  # sin (opaque) inside the jit, the product outside


def test_diff_names_the_region_the_rule_and_the_lines(merged):
    (region,) = changes.diff_regions(merged)
    assert region.name == "proj/{a,b}" and region.scope == "proj"
    assert region.before == Counter({"Dot": 2}) and region.after == Counter({"Dot": 1, "Slice": 2, "Concat": 1})
    assert region.rules == ["shared-input-merge"]
    assert region.speedup > 1.5  # one GEMM of twice the width on an H100 costs about one
    line = region.line()
    assert line.startswith("proj/{a,b}: 2 Dot -> 1 Dot, 2 Slice, 1 Concat (rule shared-input-merge), ")
    assert f"{HERE}:{_line(two_heads, '# head a')} (two_heads)" in line
    assert "changed regions  1" in merged.summary() and line in merged.summary()
