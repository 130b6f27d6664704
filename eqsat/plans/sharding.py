"""Sharding: what optimizing a sharded program needs to know about shard_map, and what tells two programs'
partitioning apart (their collectives, counted in the compiled HLO)."""

import contextlib
import re
from collections import Counter
from typing import Any

from jax._src import config as jax_config
from jax._src import shard_map as jax_shard_map
from jax.sharding import AxisType, use_abstract_mesh

from eqsat.capture.ir import Graph, Opaque
from eqsat.ops.kernels import OVERFLOW_WATCH
from eqsat.support.graph_walk import reachable

# the collectives XLA's SPMD partitioner and shard_map's lowering emit
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_PARTITIONING = ("shard_map", "sharding_constraint")
# `%name = TYPE kind(` where TYPE may be a tuple (XLA's combiner makes one all-reduce of many values)
_COLLECTIVE = re.compile(r"%\S+ = (?:\([^)]*\)|\S+) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) [^\n]*\{\n(.*?)^\}", re.M | re.S)  # name, body
_CALLED = re.compile(r"%([\w.\-]+)")
# a check's flag over the devices: a scalar, or several in one tuple (XLA's combiner joins the checks' all-reduces)
_FLAG_REDUCE = re.compile(r"\s*%\S+ = (?:(?:pred|f32)\[\]|\((?:(?:pred|f32)\[\](?:, )?)+\)) all-reduce(?:-start)?\(")
# the watch's fallback: its loop's body, or branch 0 of a cond (its false branch; the watch's derivatives)
_FALLBACK_BRANCH = re.compile(r"(?:branch_computations=\{%|false_computation=%|\bbody=%)([\w.\-]+)")


def body_tracing(call: Opaque) -> contextlib.AbstractContextManager[Any]:
    """The context a call's body is traced in, as the call traces it: for shard_map, its mesh's manual axes bound
    (collectives and pvary in the body name them) and the manual mesh current; for other calls, none."""
    if call.primitive.name != "shard_map":
        return contextlib.nullcontext()
    mesh, manual = call.params["mesh"], call.params["newly_manual_axes"]
    stack = contextlib.ExitStack()
    # jax's own staging of shard_map (jax._src.shard_map._shard_map_staging) enters these three
    stack.enter_context(jax_shard_map._extend_axis_env(mesh, manual))
    stack.enter_context(use_abstract_mesh(jax_shard_map._as_manual_mesh(mesh, manual)))
    stack.enter_context(jax_config._check_vma(call.params["check_vma"]))
    return stack


def collectives(hlo_text: str) -> Counter[str]:
    """The collectives of a compiled program (`.lower(...).compile().as_text()`), by kind, on the path it runs:
    the overflow watch's (backends/lower.py with_overflow_watch) and the one-hot kernels' checks are not counted,
    neither the program in the branch that runs only where a checked value is out of range nor the all-reduce of
    each check's flag (what a sharded watched plan adds to jax.jit's program)."""
    bodies: dict[str, list[str]] = {}
    for block in _COMPUTATION.finditer(hlo_text):
        bodies[block.group(1)] = block.group(2).splitlines()
    fallbacks = [
        match.group(1)
        for lines in bodies.values()
        for line in lines
        if ("conditional(" in line or " while(" in line) and OVERFLOW_WATCH in line
        for match in [_FALLBACK_BRANCH.search(line)]
        if match
    ]
    skipped = reachable(fallbacks, lambda name: [c for c in _CALLED.findall("\n".join(bodies[name])) if c in bodies])
    lines = [line for name, body in bodies.items() if name not in skipped for line in body]
    flags = [line for line in lines if OVERFLOW_WATCH in line and _FLAG_REDUCE.match(line)]
    return Counter(m.group(1) for line in lines if line not in flags for m in _COLLECTIVE.finditer(line))


def partitioned(flat: list[Any], graph: Graph | None) -> bool:
    """Whether the program runs partitioned: an argument spread over several devices, or a shard_map or sharding
    constraint in the program (then XLA's SPMD partitioner may add collectives to what a plan changed)."""
    spread = any(len(getattr(getattr(x, "sharding", None), "device_set", ())) > 1 for x in flat)
    return spread or (graph is not None and any(call.primitive.name in _PARTITIONING for call in graph.opaque))


def added_collectives(optimized: Any, original: Any, flat: list[Any]) -> dict[str, int]:
    """The collectives the optimized program, compiled for these arguments, has beyond the original (kind: how
    many more): a merge along a sharded axis (concatenated weights) makes XLA move the pieces between devices."""
    mine = collectives(optimized.lower(*flat).compile().as_text())
    theirs = collectives(original.lower(*flat).compile().as_text())
    return {kind: n - theirs[kind] for kind, n in mine.items() if n > theirs[kind]}


def explicit_sharding(aval: Any) -> Any:
    """The sharding of an abstract value over a mesh with explicit axes (there it is part of the type: a
    shard_map's in_specs are checked against it), else None."""
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    return sharding if AxisType.Explicit in getattr(mesh, "axis_types", ()) else None
