"""What a benchmark model hands to the harness: a pure function and example arguments."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    params_argnums: tuple[int, ...] = ()  # arguments that are parameters (weights), fixed across calls
    note: str = ""
