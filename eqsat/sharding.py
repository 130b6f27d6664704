"""Sharding: what optimizing a sharded program needs to know about shard_map, and what tells two programs'
partitioning apart (their collectives, counted in the compiled HLO)."""

import contextlib
import re
from collections import Counter
from typing import Any

from jax._src import config as jax_config
from jax._src import shard_map as jax_shard_map
from jax.sharding import use_abstract_mesh

from eqsat.ir import Opaque

# the collectives XLA's SPMD partitioner and shard_map's lowering emit
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE = re.compile(r"= [^=]*?\b(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


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
    """The collectives of a compiled program (`.lower(...).compile().as_text()`), by kind."""
    return Counter(match.group(1) for match in _COLLECTIVE.finditer(hlo_text))
