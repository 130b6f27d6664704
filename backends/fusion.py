"""Which values of a plan a target keeps inside its fusions, with no buffer of their own: the memory model's view
of XLA's fusion (backends/memory.py), from what the device profile says the target fuses.

An elementwise value (an elementwise, layout or bitcast op's, or an opaque primitive's that is elementwise by its
shapes or splits its input: add_any, copy, a comparison, unstack) is computed again inside each consumer's fusion where
every consumer is elementwise or of a class the target fuses producers into (`Profile.fuses_producers_into`: a TPU
fuses them into its convolutions, dots, reductions and gathers; XLA:CPU calls a library for a dot, which reads a
buffer). A heavier op's value is written by its consumers' fusion where its class is one the target fuses into
its elementwise consumers (`Profile.fuses_into_consumers`: a TPU dot's output fusion) and no other heavy op reads it
through elementwise ops: there one of the two fusions must write a buffer for the other to read. `python -m eqsat
calibrate --target tpu-v5e` measures both lists with XLA's own TPU compiler (eqsat/tools/calibrate_fusion.py).
"""

from typing import TYPE_CHECKING

from eqsat.capture.ir import Graph
from eqsat.extract.cost import Profile, class_of
from eqsat.ops.table import GET, OPAQUE, VAR, CostClass
from eqsat.support.graph_walk import reachable

if TYPE_CHECKING:
    from eqsat.extract.plan import Plan

_LIGHT = frozenset({CostClass.ELEMENTWISE, CostClass.BITCAST})
# opaque primitives of one shape in and out that read more than the element they write
_NOT_ELEMENTWISE = frozenset({"sort", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "top_k"})
# opaque primitives that move data without arithmetic, whatever their shapes (a pad the table does not capture,
# keras' before its strided convs): XLA fuses them as it fuses elementwise ops
_LAYOUT = frozenset({"pad", "rev", "squeeze", "expand_dims", "broadcast_in_dim", "reshape", "transpose", "slice"})
_LAYOUT |= {"dynamic_slice", "concatenate", "convert_element_type", "select_n", "clamp", "copy", "copy_p"}


def _light_call(graph: Graph | None, index: int, shapes: list) -> bool:
    """Whether opaque call `index` is elementwise by its shapes (its result's shape is each array input's) or
    splits its input into several results, with no body of its own (a loop, a branch, a call)."""
    if graph is None or not 0 <= index < len(graph.opaque):
        return False
    call = graph.opaque[index]
    name = call.primitive.name
    if name in _NOT_ELEMENTWISE or any(hasattr(v, "eqns") or hasattr(v, "jaxpr") for v in call.params.values()):
        return False
    return name in _LAYOUT or call.multiple_results or all(shape == shapes[0] for shape in shapes[1:] if shape)


def fused_values(plan: "Plan", profile: Profile) -> frozenset[int]:
    """The plan's nodes whose values the target keeps inside fusions (no buffer); none where it fuses nothing."""
    if not profile.fuses_elementwise:
        return frozenset()
    nodes = plan.nodes
    classes = [class_of(n.op) for n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for j in node.inputs:
            users[j].append(i)
    kept = {*plan.outputs, *plan.effects} | {i for i, n in enumerate(nodes) if n.op == VAR or not users[i]}
    light_calls = {
        i
        for i, n in enumerate(nodes)
        if n.op == OPAQUE and _light_call(plan.graph, n.attrs[0], [n.shape, *(nodes[j].shape for j in n.inputs)])
    }
    light_nodes = {i for i, n in enumerate(nodes) if classes[i] in _LIGHT or i in light_calls}
    light_nodes |= {i for i, n in enumerate(nodes) if n.op == GET and n.inputs[0] in light_calls}

    def reads_through_light(i: int) -> bool:
        """Whether a heavy op reads node i's value, directly or through elementwise ops."""
        readers = reachable(users[i], lambda u: users[u] if u in light_nodes else ())
        return any(u not in light_nodes for u in readers)

    fused = set()
    for i in range(len(nodes)):
        if i in kept:
            continue
        if i in light_nodes:
            if all(u in light_nodes or classes[u] in profile.fuses_producers_into for u in users[i]):
                fused.add(i)
        elif classes[i] in profile.fuses_into_consumers and not reads_through_light(i):
            fused.add(i)
    return frozenset(fused)
