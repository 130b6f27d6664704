"""Matrix products of merged axes, lowered as one dot_general that contracts those axes in place.

Capture writes a dot_general that contracts several axes as a matrix product of its operands flattened: a weight
gradient, x[B, T, I] and dy[B, T, O] contracted over (B, T), is Dot(MT(Reshape(x)), Reshape(dy)). XLA:CPU folds
the reshapes into its GEMM; the TPU compiler writes each out in the transposed layout its matrix unit reads
(`bf16[8,64,256] -> bf16[512,256]{0,1}`): the training step's capture lowered unchanged read 8% more bytes than
jax.jit's program for v5e (benches/RESULTS.md, session 28). Lowering gives the op table's Dot the unmerged
operands and their contracted axes instead.
"""

from math import prod
from typing import NamedTuple

from eqsat.extract.plan import Plan
from eqsat.ops.table import DOT, MT, RESHAPE


class Merged(NamedTuple):
    """A Dot's operands before their merging views, and the axes of each its dot_general contracts."""

    operands: tuple[int, int]
    contracting: tuple[tuple[int, ...], tuple[int, ...]]


def merged_contractions(plan: Plan, needed: list[int], kept: set[int]) -> tuple[dict[int, Merged], set[int]]:
    """The Dots among `needed` that contract merged axes in place, and the views no other node then reads (left
    out of the lowered program). `kept`: nodes computed as they are whatever reads them (widened ones, results,
    values given): a view among them stays. A widened Dot reads its operands in float32 and is left as it is."""
    merged = {}
    for i in needed:
        node = plan.nodes[i]
        if node.op != DOT or node.wide or len(node.shape or ()) != 2:
            continue
        left, right = (_unmerged(plan, j, kept, contracted_last=k == 0) for k, j in enumerate(node.inputs))
        if left is not None and right is not None and left[2] == right[2]:
            merged[i] = Merged((left[0], right[0]), (left[1], right[1]))
    readers: dict[int, set[int]] = {}
    for i in needed:
        for j in plan.nodes[i].inputs:
            readers.setdefault(j, set()).add(i)
    read = {j for m in merged.values() for j in m.operands}
    views = {v for i in merged for j in plan.nodes[i].inputs for v in _path(plan, j)} - read - kept
    unread: set[int] = set()
    for v in sorted(views, reverse=True):  # an MT before the Reshape it reads: a reader comes later in plan order
        if readers[v] <= merged.keys() | unread:
            unread.add(v)
    return merged, unread


def _path(plan: Plan, j: int) -> tuple[int, ...]:
    """The views between a merged Dot and its operand: a Reshape, or an MT and the Reshape it reads."""
    return (j, plan.nodes[j].inputs[0]) if plan.nodes[j].op == MT else (j,)


def _unmerged(
    plan: Plan, j: int, kept: set[int], contracted_last: bool
) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """A Dot operand that is a merging Reshape of x (under an MT where that puts the contracted axes last for the
    left operand, first for the right one): (x, x's contracted axes, their sizes); None for any other operand.
    Only one free axis each, so the product's shape is the Dot's."""
    node, transposed = plan.nodes[j], False
    if node.op == MT and j not in kept:
        j, node, transposed = node.inputs[0], plan.nodes[node.inputs[0]], True
    if node.op != RESHAPE or j in kept:
        return None
    x = node.inputs[0]
    shape = plan.nodes[x].shape or ()
    if len(shape) < 3 or len(node.shape or ()) != 2:
        return None
    free_first = contracted_last != transposed  # the merged matrix's rows are x's free axis
    axes = tuple(range(1, len(shape))) if free_first else tuple(range(len(shape) - 1))
    contracted = tuple(shape[a] for a in axes)
    free = shape[0] if free_first else shape[-1]
    if tuple(node.shape or ()) != ((free, prod(contracted)) if free_first else (prod(contracted), free)):
        return None
    return x, axes, contracted
