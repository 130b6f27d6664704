"""Plans kept across processes (eqsat/plan_store.py) and the bounded signature cache."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat import plan_store

_CHILD = textwrap.dedent(
    """
    import json, sys
    import jax.numpy as jnp, numpy as np
    import eqsat

    def chain(a, b, v):
        return (a @ b) @ v

    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in [(64, 64), (64, 64), (64, 2)]]
    fast = eqsat.optimize(chain)
    plan = fast.plan(*args)
    out = np.asarray(fast(*args))
    nodes = [[n.op, list(n.inputs)] for n in plan.nodes]
    print(json.dumps({"stored": plan.stats.get("stored", 0.0), "nodes": nodes, "out": out.tolist()}))
    """
)


def _run_child(cache: str) -> dict:
    env = {**os.environ, "EQSAT_CACHE_DIR": cache, "EQSAT_PLAN_STORE": "on"}
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_plan(tmp_path):
    first, second = _run_child(str(tmp_path)), _run_child(str(tmp_path))
    assert first["stored"] == 0.0 and second["stored"] == 1.0
    assert second["nodes"] == first["nodes"] and any(op == "Dot" for op, _ in first["nodes"])
    np.testing.assert_array_equal(np.asarray(second["out"]), np.asarray(first["out"]))
    assert len(list((tmp_path / "plans").glob("*.json"))) == 1


def _args():
    rng = np.random.default_rng(1)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in [(32, 32), (32, 32), (32, 1)]]


def _chain(a, b, v):
    return (a @ b) @ v


def _fresh_chain():
    """The same program as a new function: no plan of it in this process's memory."""
    return lambda a, b, v: _chain(a, b, v)


@pytest.fixture
def store_on(tmp_path, monkeypatch):
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQSAT_PLAN_STORE", "on")
    return tmp_path


def test_forgotten_plans_come_back_from_the_store(store_on):
    args = _args()
    fast = eqsat.optimize(_fresh_chain())
    planned = fast.plan(*args)
    fast.clear_cache()
    loaded = fast.plan(*args)
    assert "stored" not in planned.stats and loaded.stats["stored"] == 1.0
    assert [(n.op, n.inputs, n.attrs) for n in loaded.nodes] == [(n.op, n.inputs, n.attrs) for n in planned.nodes]
    np.testing.assert_allclose(fast(*args), _chain(*args), rtol=2e-3, atol=1e-4)


def test_other_settings_or_programs_are_planned_afresh(store_on):
    args = _args()
    eqsat.optimize(_fresh_chain()).plan(*args)
    assert "stored" in eqsat.optimize(_fresh_chain()).plan(*args).stats
    assert "stored" not in eqsat.optimize(_fresh_chain(), target="h100").plan(*args).stats
    assert "stored" not in eqsat.optimize(lambda a, b, v: (a @ b) @ v + 1.0).plan(*args).stats
    assert "stored" not in eqsat.optimize(_fresh_chain()).plan(args[0][:16], *args[1:]).stats


def test_unreadable_or_old_stored_plans_are_ignored(store_on, caplog):
    args = _args()
    eqsat.optimize(_fresh_chain()).plan(*args)
    (path,) = (store_on / "plans").glob("*.json")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "version": plan_store.VERSION + 1}))
    fresh = eqsat.optimize(_fresh_chain())
    assert "stored" not in fresh.plan(*args).stats  # planned again, and stored in this version
    path.write_text("{not json")
    fresh.clear_cache()
    assert "stored" not in fresh.plan(*args).stats
    assert "ignoring the stored plan" in caplog.text


def test_a_plan_priced_by_other_kernel_times_is_not_reused(store_on):
    """A stored plan records the measured times of its kernel choices; the timing cache holding others (a new
    measurement, another machine's cache imported) makes it stale."""
    x = jnp.ones((1, 16, 16, 8))
    w = jnp.ones((3, 3, 1, 8)) / 9

    def depthwise(x, w):
        dims = ("NHWC", "HWIO", "NHWC")
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dims, feature_group_count=8)

    eqsat.optimize(depthwise).plan(x, w)
    (path,) = (store_on / "plans").glob("*.json")
    data = json.loads(path.read_text())
    assert data["timings"], "the depthwise conv's rival kernels were priced by the timing cache"
    data["timings"] = {k: 1.0 for k in data["timings"]}
    path.write_text(json.dumps(data))
    assert "stored" not in eqsat.optimize(depthwise).plan(x, w).stats


def test_signature_cache_keeps_the_most_recent(store_on):
    fast = eqsat.optimize(lambda x: jnp.tanh(x @ x.T), cache_size=3)
    for n in range(1, 7):
        jax.block_until_ready(fast(jnp.ones((n, 4))))
    assert fast.cache_info() == {"plans": 3, "cache_size": 3, "planning": 0}
    np.testing.assert_allclose(fast(jnp.ones((1, 4))), jnp.tanh(jnp.ones((1, 4)) @ jnp.ones((4, 1))), rtol=1e-6)


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_cache_size_must_be_a_positive_int(size):
    with pytest.raises(ValueError, match="cache_size"):
        eqsat.optimize(lambda x: x, cache_size=size)


def test_a_validated_plan_is_not_validated_again(store_on):
    """Validation accepted the plan once: a later process (here: memory forgotten) trusts it as one process does."""
    args = _args()
    fast = eqsat.optimize(_fresh_chain())
    jax.block_until_ready(fast(*args))  # validated, and marked so in the store
    (path,) = (store_on / "plans").glob("*.json")
    assert json.loads(path.read_text())["validated"] is True
    again = eqsat.optimize(_fresh_chain())
    plan = again.plan(*args)
    assert plan.stats["stored_validated"] == 1.0 and not again._unvalidated
    np.testing.assert_allclose(again(*args), _chain(*args), rtol=2e-3, atol=1e-4)


def test_the_signature_cache_can_be_listed_without_reordering_it():
    from eqsat.lru import LRU

    cache = LRU(2)
    cache["a"], cache["b"] = 1, 2
    assert cache.values() == [1, 2] and list(cache) == ["a", "b"]  # looking does not make an entry recent
    cache["c"] = 3
    assert list(cache) == ["b", "c"]


def test_a_plan_whose_attributes_come_from_numpy_is_kept(tmp_path, monkeypatch):
    # a folded broadcast's dimensions arrive as np.int64; a value JSON cannot hold must never make the plan fall back
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQSAT_PLAN_STORE", "on")
    import jax.numpy as jnp

    import eqsat

    def f(x, b):
        return jnp.tanh(x + b[None, :, None]) @ jnp.ones((5, 3))

    x, b = jnp.ones((2, 4, 5)), jnp.ones((4,))
    plan = eqsat.optimize(f).plan(x, b)
    assert plan.fallback is None
    assert list((tmp_path / "plans").glob("*.json"))
