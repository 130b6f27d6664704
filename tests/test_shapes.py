"""Shapes have one semantics: every op's egglog shape rule accepts exactly the inputs its lowering accepts
(jax.eval_shape), with the same output shape, so extraction's type check never has to ban a node."""

import jax
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eqsat.capture.ir import Graph, Node
from eqsat.capture.jaxpr import capture
from eqsat.egraph.saturate import Saturation, saturate
from eqsat.ops.table import OPS, infer
from eqsat.tools.generators import programs
from eqsat.tools.program import Program


def _cases(graph: Graph, draw: st.DrawFn) -> list[tuple[str, tuple, tuple]]:
    """Each table op of the captured program with its inputs' shapes as captured, and again with one dimension of
    one input changed (which the lowering may or may not accept)."""
    cases = []
    for node in graph.nodes:
        spec = OPS.get(node.op)
        if spec is None or spec.structural or not node.inputs:
            continue
        avals = tuple((graph.nodes[i].shape, graph.nodes[i].dtype) for i in node.inputs)
        if any(shape is None for shape, _ in avals):
            continue
        cases.append((node.op, node.attrs, avals))
        k = draw(st.integers(0, len(avals) - 1))
        shape, dtype = avals[k]
        if shape:
            axis = draw(st.integers(0, len(shape) - 1))
            changed = (*shape[:axis], shape[axis] + draw(st.sampled_from([-1, 1, 2])), *shape[axis + 1 :])
            if min(changed) >= 1:
                cases.append((node.op, node.attrs, (*avals[:k], (changed, dtype), *avals[k + 1 :])))
    return cases


def _egglog_shapes(cases: list[tuple[str, tuple, tuple]]) -> list[tuple | None]:
    """The shape the e-graph's analysis derives for each case's node (None: the shape rules reject it), all in one
    e-graph of independent nodes over fresh inputs."""
    graph = Graph()
    nodes = []
    for op, attrs, avals in cases:
        inputs = []
        for shape, dtype in avals:
            inputs.append(graph.add(Node("Var", (), (f"v{len(graph.nodes)}",), shape, dtype)))
            graph.inputs.append(inputs[-1])
        nodes.append(graph.add(Node(op, tuple(inputs), attrs)))  # no shape given: the analysis derives it
    graph.outputs = nodes
    snapshot = saturate(graph, [], Saturation(iterations=1, seconds=60))
    return [snapshot.shape.get(snapshot.orig[i]) for i in nodes]


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(programs(max_steps=4), st.data())
def test_egglog_shape_rules_agree_with_the_lowerings(prog: Program, data: st.DataObject):
    with jax.enable_x64(prog.dtype.endswith("64")):
        structs = [jax.ShapeDtypeStruct(s, prog.dtype) for s in prog.input_shapes]
        graph = capture(jax.make_jaxpr(prog)(*structs))
    cases = _cases(graph, data.draw)
    if not cases:
        return
    for (op, attrs, avals), derived in zip(cases, _egglog_shapes(cases), strict=True):
        traced = infer(op, attrs, avals)
        want = None if traced is None else traced[0]
        assert (None if derived is None else tuple(derived)) == want, (op, attrs, avals)


def test_no_rank_limit():
    # shapes built axis by axis: rank 8 as rank 1
    shape, perm = (2, 1, 3, 1, 2, 1, 2, 3), (7, 6, 5, 4, 3, 2, 1, 0)
    ones = (1,) * 8
    cases = [
        ("Transpose", (perm,), ((shape, "float32"),)),
        ("Pad", (ones, (0, 2, 0, 0, 1, 0, 0, 0)), ((shape, "float32"),)),
        ("PoolMax", ((1, 1, 2, 1, 1, 1, 2, 1), ones, (0,) * 8, (0,) * 8), ((shape, "float32"),)),
        ("Transpose", ((0, 1),), (((3,), "float32"),)),  # a permutation of another rank: rejected by both
    ]
    derived = _egglog_shapes(cases)
    assert [None if d is None else tuple(d) for d in derived] == [
        None if (t := infer(op, attrs, avals)) is None else t[0] for op, attrs, avals in cases
    ]
    assert derived[0] is not None and len(derived[0]) == 8


def test_a_transpose_whose_axes_repeat_gets_no_shape():
    """A permutation names each axis once: (0, 0, 2) is in range but no permutation, and lax.transpose refuses it."""
    shape = ((2, 3, 4), "float32")
    cases = [("Transpose", ((p),), (shape,)) for p in [(2, 0, 1), (0, 0, 2), (1, 2, 1), (0, 1, 2, 3), (0,)]]
    assert _egglog_shapes(cases) == [(4, 2, 3), None, None, None, None]
    assert _egglog_shapes([("Transpose", ((),), (((), "float32"),))]) == [()]
