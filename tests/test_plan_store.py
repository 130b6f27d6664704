"""Plans kept across processes (eqsat/plans/plan_store.py) and the bounded signature cache."""

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
from eqsat.numerics import guard
from eqsat.plans import plan_store

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


def test_a_stored_refusal_is_measured_again_on_other_hardware(store_on, monkeypatch):
    """Issue 27: a refusal is what the guard measured on one machine (and jax): on another the plan is planned and
    measured again; on the same one the original runs at once."""
    measured = []

    def slower(*_: object, **__: object) -> dict:
        measured.append(1)
        return guard._judged([(1e-3, 2e-3)] * 7, 1.0, source="first call")  # slower in 7 of 7 rounds

    monkeypatch.setattr(guard, "measure", slower)
    args = _args()

    def planned_on(machine: str) -> eqsat.Plan:
        monkeypatch.setattr(plan_store, "hardware", lambda: machine)
        fast = eqsat.optimize(_fresh_chain(), limits=eqsat.Limits(guard_seconds=0.05, measure_seconds=0))
        fast(*args)
        return fast.plan(*args)

    first = planned_on("cpu Model A x2")
    assert guard.refused_for_good(first.measured) and len(measured) == 1
    again = planned_on("cpu Model A x2")
    assert again.stats["stored"] == 1.0 and "slower with" in again.fallback and len(measured) == 1
    elsewhere = planned_on("cpu Model B x8")
    assert "stored" not in elsewhere.stats and guard.refused_for_good(elsewhere.measured) and len(measured) == 2
    assert len(list((store_on / "plans").glob("*.json"))) == 2  # each machine's refusal under its own key


def _restamped(data: dict) -> str:
    """A stored plan file's data, changed, with a digest that matches: a change the digest alone misses."""
    content = {k: v for k, v in data.items() if k != "digest"}
    return json.dumps({**content, "digest": plan_store.content_digest(content)})


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda text: b"\xff\xfe" + text.encode()[2:], id="not-utf8"),
        pytest.param(lambda text: text[: len(text) // 2], id="truncated"),
        pytest.param(lambda text: "", id="empty"),
        pytest.param(lambda text: "[1, 2]", id="a-list"),
        pytest.param(lambda text: json.dumps({**json.loads(text), "version": plan_store.VERSION + 1}), id="version"),
        pytest.param(lambda text: text.replace('"Dot"', '"Tanh"'), id="digest"),
        pytest.param(lambda text: _restamped({**json.loads(text), "timings": [1]}), id="timings-type"),
        pytest.param(lambda text: _restamped({**json.loads(text), "plan": {"format": 1}}), id="plan-type"),
        pytest.param(lambda text: _restamped(json.loads(text.replace('"Tanh"', '"Dot"'))), id="does-not-lower"),
    ],
)
def test_a_stored_plan_file_that_cannot_be_used_is_set_aside_and_planned_again(store_on, damage):
    """Bad bytes, broken or other JSON, another version, a changed plan: the function is planned again (never the
    original for good, as a non-UTF-8 file made it in every later process), the file set aside with one warning."""
    args = _args()
    planned = eqsat.optimize(lambda a, b, v: jnp.tanh(_chain(a, b, v))).plan(*args)
    (path,) = (store_on / "plans").glob("*.json")
    text = path.read_text()
    damaged = damage(text)
    path.write_bytes(damaged if isinstance(damaged, bytes) else damaged.encode())
    with pytest.warns(eqsat.EqsatWarning, match="set aside") as caught:
        again = eqsat.optimize(lambda a, b, v: jnp.tanh(_chain(a, b, v))).plan(*args)  # none of it in memory
    assert len(caught) == 1 and str(path) in str(caught[0].message)
    assert again.fallback is None and "stored" not in again.stats
    assert [n.op for n in again.nodes] == [n.op for n in planned.nodes]
    assert path.with_name(path.name + ".rejected").read_bytes() == (
        damaged if isinstance(damaged, bytes) else damaged.encode()
    )
    assert json.loads(path.read_text())["digest"]  # stored again, whole


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


_TAMPERED_CHILD = textwrap.dedent(
    """
    import json, warnings
    import jax, jax.numpy as jnp, numpy as np
    import eqsat

    def f(a, b, v):
        return jnp.tanh((a @ b) @ v)

    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in [(64, 64), (64, 64), (64, 2)]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = eqsat.optimize(f)
        out = np.asarray(fast(*args))
        plan = fast.plan(*args)
    print(json.dumps({
        "ops": sorted({n.op for n in plan.nodes}),
        "error": float(np.max(np.abs(out - np.asarray(jax.jit(f)(*args))))),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, eqsat.EqsatWarning)],
    }))
    """
)


@pytest.mark.parametrize("digest", ["kept", "rewritten"])
def test_a_plan_file_changed_by_hand_is_caught_in_a_new_process(tmp_path, digest):
    """The issue's reproducer: tanh((A@B)@v) planned in one process; "Tanh" changed to "Logistic" in the stored
    JSON; a new process must give jax.jit's result (the changed plan was 1.08 away) and warn. The digest catches
    the change; with the digest rewritten to match, the validation each process runs on a kept plan does."""
    # planned in the call, and kept whatever the guard would measure: the changed plan would run
    env = {**os.environ, "EQSAT_CACHE_DIR": str(tmp_path), "EQSAT_PLAN_STORE": "on", "EQSAT_BACKGROUND": "0"}
    env["EQSAT_GUARD_SECONDS"] = "0"

    def run() -> dict:
        done = subprocess.run([sys.executable, "-c", _TAMPERED_CHILD], capture_output=True, text=True, env=env,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert first["warnings"] == [] and "Tanh" in first["ops"]
    (path,) = (tmp_path / "plans").glob("*.json")
    text = path.read_text()
    assert '"Tanh"' in text
    path.write_text(
        text.replace('"Tanh"', '"Logistic"')
        if digest == "kept"
        else _restamped(json.loads(text.replace('"Tanh"', '"Logistic"')))
    )
    second = run()
    assert second["error"] < 1e-4, second
    (warning,) = second["warnings"]
    why = "does not match its digest" if digest == "kept" else "gave results that differ from the original's"
    assert str(path) in warning and why in warning and "set aside" in warning
    assert "Logistic" not in second["ops"] and path.with_name(path.name + ".rejected").exists()


def test_a_changed_body_plan_is_caught_and_set_aside(store_on):
    """A scan body's plan is kept in a file of its own: changed (its digest rewritten to match), the program's
    validation catches it; both plans are set aside and planned again, and the call gives the original's result."""

    def scanned(a, b, vs):
        return jax.lax.scan(lambda c, v: (c, jnp.tanh((c[0] @ c[1]) @ v)), (a, b), vs)[1]

    rng = np.random.default_rng(2)
    a, b = (jnp.asarray(rng.standard_normal((64, 64)).astype(np.float32)) for _ in range(2))
    vs = jnp.asarray(rng.standard_normal((3, 64, 2)).astype(np.float32))
    jax.block_until_ready(eqsat.optimize(lambda *x: scanned(*x))(a, b, vs))  # planned, validated, stored
    (body,) = [p for p in (store_on / "plans").glob("*.json") if '"Tanh"' in p.read_text()]
    body.write_text(_restamped(json.loads(body.read_text().replace('"Tanh"', '"Logistic"'))))
    with pytest.warns(eqsat.EqsatWarning, match="gave results that differ") as caught:
        got = eqsat.optimize(lambda *x: scanned(*x))(a, b, vs)
    np.testing.assert_allclose(got, jax.jit(scanned)(a, b, vs), rtol=2e-3, atol=1e-4)
    assert str(body) in " ".join(str(w.message) for w in caught)
    assert body.with_name(body.name + ".rejected").exists() and '"Tanh"' in body.read_text()  # planned again


def test_the_signature_cache_can_be_listed_without_reordering_it():
    from eqsat.support.lru import LRU

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
