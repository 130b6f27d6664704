"""Sharding on an 8-device CPU mesh: shardings and collectives as jax.jit's, shard_map bodies rewritten, a merge
along a sharded axis not made. The programs run in a subprocess (tests/sharded_programs.py): the device count is
fixed when jax starts, and this process runs on one device."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def cases() -> dict[str, Any]:
    script = Path(__file__).with_name("sharded_programs.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


NAMES = [
    "sharded_args",
    "constraint",
    "shard_map",
    "shard_map_psum",
    "shard_map_psum_traced",
    "merge_along_sharded_axis",
    "merge_refused_chain_kept",
    "explicit_args",
    "explicit_shard_map",
    "explicit_shard_map_traced",
]


@pytest.mark.parametrize("name", NAMES)
def test_shardings_and_collectives_are_jax_jits(cases: dict[str, Any], name: str) -> None:
    case = cases[name]
    assert cases["devices"] == 8
    assert case["sharding"][0] == case["sharding"][1]
    assert case["collectives"][0] == case["collectives"][1]
    assert case["error"] < 1e-4 and not case["warnings"]


@pytest.mark.parametrize("name", [n for n in NAMES if "shard_map" in n])
def test_shard_map_bodies_are_rewritten(cases: dict[str, Any], name: str) -> None:
    assert cases[name]["bodies_rewritten"] == 1 and cases[name]["fallback"] is None
    if "psum" in name:
        assert cases[name]["collectives"][0] == {"all-reduce": 1}


def test_sharded_arguments_keep_their_rewrite(cases: dict[str, Any]) -> None:
    for name in ("sharded_args", "explicit_args"):
        assert cases[name]["rewritten"] == {"Dot": 2} and cases[name]["fallback"] is None
        assert cases[name]["watched"]  # re-associated: jax.jit's collectives, the watch's own not counted


def test_a_merge_along_a_sharded_axis_is_not_made(cases: dict[str, Any]) -> None:
    """The merge is extracted, adds collectives, and is not made: with nothing else to rewrite the original runs
    (the plan says why), and beside a chain the plan without the merge runs, the chain re-associated."""
    case = cases["merge_along_sharded_axis"]
    assert case["rewritten"].get("Concat") and "adds collectives" in case["fallback"]
    assert case["collectives"][0] == {}
    kept = cases["merge_refused_chain_kept"]
    assert kept["fallback"] is None and "Concat" not in kept["rewritten"] and kept["rewritten"].get("Dot")
    assert "all-to-all" in kept["refused"] or "collective-permute" in kept["refused"]
