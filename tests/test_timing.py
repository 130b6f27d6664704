"""The timing cache: kernel choices measured on this device, kept across calls and processes, moved between
machines, and prices that decide the plan."""

import dataclasses
import errno
import json
import time
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.__main__ import main
from eqsat.extract import timing
from eqsat.extract.cost import Profile, load_profile, node_cost, node_key
from eqsat.ops.table import ConvAttrs

X = jnp.asarray(np.random.default_rng(0).standard_normal((2, 40, 40, 16)), jnp.float32)
W = jnp.asarray(np.random.default_rng(1).standard_normal((3, 3, 1, 16)), jnp.float32)


def depthwise(x, w):
    return jnp.tanh(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             feature_group_count=16))  # fmt: skip


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    return tmp_path


CONV_ATTRS = ConvAttrs((1, 1), (1, 1), (1, 1), (1, 1), (1, 1), 16, 1)  # 3x3 same, depthwise


def _keys(op: str) -> str:
    return node_key(op, CONV_ATTRS, [X.shape, W.shape], "float32")


def test_kernel_choices_are_measured_once_and_kept(cache_dir):
    fast = eqsat.optimize(lambda x, w: depthwise(x, w))
    np.testing.assert_allclose(fast(X, W), depthwise(X, W), rtol=1e-5, atol=1e-5)
    plan = fast.plan(X, W)
    assert plan.stats["timing_measured"] == 2 and plan.stats["timing_hits"] == 0
    stored = timing.parse((cache_dir / "timing" / "cpu_cpu.json").read_text(), "cache")
    conv, shifted = stored.entries[_keys("Conv")], stored.entries[_keys("ShiftConv")]
    assert {_keys("Conv"), _keys("ShiftConv")} <= set(stored.entries)
    # the plan follows what was measured (which side wins is load's call here; benches/kernels.py measures it); a
    # kernel faster than a few calls' overhead is kept as None, priced by the roofline
    if conv is not None and shifted is not None:
        margin = load_profile("cpu").switch_margin
        assert (plan.rewritten_ops() == {"ShiftConv": 1}) is (shifted * margin < conv), (conv, shifted)
    again = eqsat.optimize(lambda x, w: depthwise(x, w)).plan(X, W)
    assert again.stats["timing_measured"] == 0 and again.stats["timing_hits"] == 2
    assert "of 1 measured" in again.summary()  # 0 where the kernel ran faster than a few calls' overhead


def test_measuring_can_be_switched_off(cache_dir):
    plan = eqsat.optimize(lambda x, w: depthwise(x, w), limits=eqsat.Limits(measure_seconds=0)).plan(X, W)
    assert plan.stats["timing_measured"] == 0 and plan.stats["timing_skipped"] == 2
    assert (
        not (cache_dir / "timing" / "cpu_cpu.json").exists()
        or not timing.parse((cache_dir / "timing" / "cpu_cpu.json").read_text(), "cache").entries
    )


def test_a_cache_from_another_device_prices_its_profile_and_nothing_is_measured_here(cache_dir):
    # a made-up device on which the shifted form is slow: its cache, imported, keeps the Conv
    other = timing.TimingCache("gpu:made-up", timing.versions(), {_keys("Conv"): 1e-6, _keys("ShiftConv"): 1.0})
    source = cache_dir / "made-up.json"
    source.write_text(other.to_json())
    assert main(["tune", "--import", str(source)]) == 0
    profile = dataclasses.replace(load_profile("cpu"), timing_device="gpu:made-up")
    plan = eqsat.optimize(lambda x, w: depthwise(x, w), target=profile).plan(X, W)
    assert plan.rewritten_ops() == {} and plan.stats["timing_measured"] == 0 and plan.stats["timing_hits"] == 2


def test_cache_files_are_checked_and_versioned(cache_dir, capsys):
    bad = cache_dir / "bad.json"
    bad.write_text("{not json")
    assert main(["tune", "--import", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err
    bad.write_text(json.dumps({"format": 99, "entries": {}}))
    with pytest.raises(ValueError, match=f"format {timing.FORMAT}"):
        timing.parse(bad.read_text(), "bad.json")
    for key in ("Conv", '["Conv", [], [[2, "x"]], "float32"]'):  # a key planning could not read as a kernel's
        odd = timing.TimingCache("gpu:odd", timing.versions(), {key: 1e-3}).to_json()
        with pytest.raises(ValueError, match="is not a kernel's key"):
            timing.parse(odd, "odd.json")
    stale = timing.TimingCache("cpu:cpu", "jax 0.0.0, jaxlib 0.0.0", {_keys("Conv"): 1.0})
    (cache_dir / "timing").mkdir()
    (cache_dir / "timing" / "cpu_cpu.json").write_text(stale.to_json())
    assert timing.cache_for("cpu:cpu").entries == {}  # another jax may run the op differently: not trusted
    with pytest.raises(ValueError, match="cannot join"):
        timing.cache_for("cpu:cpu").merge(stale)


def test_a_cache_an_earlier_eqsat_wrote_is_measured_again_without_a_warning(cache_dir):
    (cache_dir / "timing").mkdir()
    old = json.loads(timing.TimingCache("cpu:cpu", timing.versions(), {_keys("Conv"): 1.0}).to_json())
    (cache_dir / "timing" / "cpu_cpu.json").write_text(json.dumps({**old, "format": timing.FORMAT - 1}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert timing.cache_for("cpu:cpu").entries == {}
    with pytest.raises(ValueError, match=f"format {timing.FORMAT - 1}, older"):  # tune --import still refuses it
        timing.parse(json.dumps({**old, "format": timing.FORMAT - 1}), "old.json")


def _cache_text(device: str, seconds: str) -> str:
    """A timing cache's JSON with the Conv priced at `seconds` (JSON text, as a hand or another tool wrote it)."""
    head = {"format": timing.FORMAT, "device": device, "versions": timing.versions(), "too_fast": []}
    entries = {_keys("ShiftConv"): 1e-3, _keys("Conv"): "SECONDS"}
    return json.dumps({**head, "entries": entries}).replace('"SECONDS"', seconds)


@pytest.mark.parametrize("seconds", ["NaN", "Infinity", "-Infinity", "-1", "0", "null", '"1e-3"', "true", "[1]"])
def test_a_timing_that_is_not_a_finite_positive_number_of_seconds_is_refused(cache_dir, capsys, seconds):
    """tune --import names the entry and exits non-zero (a Dot priced at -1 s kept the slow one-hot matmul; NaN
    made plans unstorable); the same entry in the cache directory is left out with a warning, the rest kept."""
    source = cache_dir / "absurd.json"
    source.write_text(_cache_text("gpu:absurd", seconds))
    assert json.loads(source.read_text())["entries"][_keys("ShiftConv")] == 1e-3 or seconds in (
        "NaN",
        "Infinity",
        "-Infinity",
    )
    assert main(["tune", "--import", str(source)]) == 2
    err = capsys.readouterr().err
    assert "absurd.json" in err and _keys("Conv") in err and "not a timing" in err
    assert not (cache_dir / "timing").exists()  # nothing imported
    (cache_dir / "timing").mkdir()
    (cache_dir / "timing" / "gpu_absurd.json").write_text(_cache_text("gpu:absurd", seconds))
    with pytest.warns(eqsat.EqsatWarning, match="ignoring entries of the timing cache"):
        assert timing.cache_for("gpu:absurd").entries == {_keys("ShiftConv"): 1e-3}


@pytest.mark.parametrize("where", ["a-file", "under-a-file", "read-only"])
def test_a_cache_that_cannot_be_written_plans_in_memory_and_warns_once(tmp_path, monkeypatch, where):
    """A cache path that is a file, lies under one, or is read-only (simulated: tests run as root, which writes
    anywhere) stopped planning ("could not plan f (OSError: Read-only file system: .../timing)"): now the plan and
    the kernel times stay in memory, with one warning per process that names where eqsat tried to write."""
    from eqsat.extract import cost

    monkeypatch.setattr(cost, "_UNWRITABLE", [], raising=False)  # as in a fresh process
    monkeypatch.setenv("EQSAT_PLAN_STORE", "on")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = {"a-file": blocker, "under-a-file": blocker / "eqsat", "read-only": tmp_path / "cache"}[where]
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(cache))
    if where == "read-only":
        real_mkdir = Path.mkdir

        def read_only(path: Path, *args, **kwargs) -> None:
            if path.is_relative_to(cache):
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.warns(eqsat.EqsatWarning) as caught:
        fast = eqsat.optimize(lambda x, w: depthwise(x, w))
        np.testing.assert_allclose(fast(X, W), depthwise(X, W), rtol=1e-5, atol=1e-5)
        plan = fast.plan(X, W)
    assert plan.fallback is None and plan.stats["timing_measured"] == 2
    (warning,) = [str(w.message) for w in caught]
    assert f"cannot write its cache at {cache}" in warning and "memory" in warning
    assert not cache.is_dir()
    again = eqsat.optimize(lambda x, w: depthwise(x, w)).plan(X, W)  # the times measured are kept in memory
    assert again.stats["timing_measured"] == 0 and again.stats["timing_hits"] == 2


def test_tune_says_when_the_cache_cannot_be_written(tmp_path, monkeypatch, capsys):
    """tune writes the timing cache, so there a cache path that is a file is an error that names it."""
    from eqsat.extract import cost

    monkeypatch.setattr(cost, "_UNWRITABLE", [], raising=False)  # as in a fresh process
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    source = tmp_path / "made-up.json"
    source.write_text(timing.TimingCache("gpu:unwritable", timing.versions(), {_keys("Conv"): 1e-3}).to_json())
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(blocker))
    assert main(["tune", "--import", str(source)]) == 2
    assert f"{blocker}/timing" in capsys.readouterr().err
    module = tmp_path / "dwmod_unwritable.py"
    module.write_text(
        "from jax import lax\n"
        "def dw(x, w):\n    return lax.conv_general_dilated(x, w, (1, 1), 'SAME', "
        "dimension_numbers=('NHWC', 'HWIO', 'NHWC'), feature_group_count=16)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(eqsat.EqsatWarning, match="cannot write its cache"):
        args = ["tune", "dwmod_unwritable:dw", "--args", "f32[2,40,40,16]", "f32[3,3,1,16]", "--no-progress"]
        assert main(args) == 2
    assert f"{blocker}/timing" in capsys.readouterr().err


def test_tune_warms_and_exports(cache_dir, tmp_path, capsys):
    module = tmp_path / "dwmod.py"
    module.write_text(
        "import jax.numpy as jnp\nfrom jax import lax\n"
        "def dw(x, w):\n    return lax.conv_general_dilated(x, w, (1, 1), 'SAME', "
        "dimension_numbers=('NHWC', 'HWIO', 'NHWC'), feature_group_count=8)\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        args = ["tune", "dwmod:dw", "--args", "f32[2,24,24,8]", "f32[3,3,1,8]", "--no-progress"]
        assert main(args) == 0
        assert "2 measured now" in capsys.readouterr().out
        before = (cache_dir / "timing" / "cpu_cpu.json").read_text()
        assert main(args) == 0  # warm: nothing is measured again
        assert (cache_dir / "timing" / "cpu_cpu.json").read_text() == before
        # tune measures the shapes it is given, even next to a shape measured before
        assert main(["tune", "dwmod:dw", "--args", "f32[3,24,24,8]", "f32[3,3,1,8]", "--no-progress"]) == 0
        assert "2 measured now" in capsys.readouterr().out
    finally:
        sys.path.remove(str(tmp_path))
    out = tmp_path / "export.json"
    assert main(["tune", "--export", str(out)]) == 0
    assert len(timing.parse(out.read_text(), str(out)).entries) == 4


@pytest.mark.parametrize(("shifted", "chosen"), [(0.9, False), (0.5, True)])
def test_an_alternative_must_beat_its_rival_by_the_switch_margin(cache_dir, shifted, chosen):
    # measured alone on a shared machine, a 10% faster kernel is noise; twice as fast is a choice
    entries = {_keys("Conv"): 1e-3, _keys("ShiftConv"): shifted * 1e-3}
    (cache_dir / "made-up.json").write_text(timing.TimingCache("gpu:margin", timing.versions(), entries).to_json())
    assert main(["tune", "--import", str(cache_dir / "made-up.json")]) == 0
    profile = dataclasses.replace(load_profile("cpu"), timing_device="gpu:margin")
    assert profile.switch_margin == 1.3
    plan = eqsat.optimize(lambda x, w: depthwise(x, w), target=profile).plan(X, W)
    assert (plan.rewritten_ops() == {"ShiftConv": 1}) is chosen


def _imported(cache_dir, device: str, conv: float, shifted: float) -> Profile:
    """A profile priced by a made-up device's cache holding the Conv and ShiftConv of X measured."""
    entries = {_keys("Conv"): conv, _keys("ShiftConv"): shifted}
    (cache_dir / "made-up.json").write_text(timing.TimingCache(device, timing.versions(), entries).to_json())
    assert main(["tune", "--import", str(cache_dir / "made-up.json")]) == 0
    return dataclasses.replace(load_profile("cpu"), timing_device=device)


@pytest.mark.parametrize(("shifted", "chosen"), [(3.0, False), (0.1, True)])
def test_a_new_shape_is_priced_from_the_nearest_measured_one(cache_dir, shifted, chosen):
    profile = _imported(cache_dir, "gpu:transfer", 1e-3, shifted * 1e-3)
    x3 = jnp.concatenate([X, X[:1]])  # batch 3: its kernels were measured at batch 2 only
    plan = eqsat.optimize(lambda x, w: depthwise(x, w), target=profile).plan(x3, W)
    assert plan.stats["timing_transferred"] == 2 and plan.stats["timing_skipped"] == 0
    assert (plan.rewritten_ops() == {"ShiftConv": 1}) is chosen  # the choice made at batch 2 holds
    assert "2 from other shapes" in plan.summary()
    # the price: batch 2's seconds scaled by the rooflines' ratio (both inputs and the output grow by 3/2 but the
    # weight does not), and kept apart from what was measured
    cache = timing.cache_for("gpu:transfer")
    bare = load_profile("cpu")
    roofline = {b: node_cost("Conv", [(b, 40, 40, 16), W.shape], (b, 40, 40, 16), "float32", bare,
                             CONV_ATTRS).seconds for b in (2, 3)}  # fmt: skip
    conv_at_3 = node_key("Conv", CONV_ATTRS, [x3.shape, W.shape], "float32")
    assert cache.transfers[conv_at_3] == pytest.approx(1e-3 * roofline[3] / roofline[2])
    assert conv_at_3 not in cache.entries


def test_a_shape_far_from_any_measured_one_is_not_priced_from_it(cache_dir):
    profile = _imported(cache_dir, "gpu:far", 1e-3, 1e-4)
    x40 = jnp.tile(X, (20, 1, 1, 1))  # 20 times the work: more than Limits.timing_transfer's factor of 4
    plan = eqsat.optimize(lambda x, w: depthwise(x, w), target=profile).plan(x40, W)
    assert plan.stats["timing_transferred"] == 0 and plan.stats["timing_skipped"] == 2  # another device: roofline
    # batch, height and width all changed: 3 dimensions apart, though within the roofline factor (2.2x)
    apart = jnp.zeros((3, 48, 48, 16), jnp.float32)
    plan = eqsat.optimize(lambda x, w: depthwise(x, w), target=profile).plan(apart, W)
    assert plan.stats["timing_transferred"] == 0 and plan.stats["timing_skipped"] == 2
    near = jnp.concatenate([X, X[:1]])
    off = eqsat.optimize(lambda x, w: depthwise(x, w), target=profile, limits=eqsat.Limits(timing_transfer=0))
    assert off.plan(near, W).stats["timing_transferred"] == 0


def test_a_close_choice_is_measured_at_the_new_shape(cache_dir):
    # the shifted form 0.8x the conv: 1.04x with the switch margin, too close to decide from another shape
    profile = _imported(cache_dir, "gpu:close", 1e-3, 0.8e-3)
    plan = eqsat.optimize(lambda x, w: depthwise(x, w), target=profile).plan(jnp.concatenate([X, X[:1]]), W)
    assert plan.stats["timing_transferred"] == 0 and plan.stats["timing_skipped"] == 2


def test_a_kernel_too_fast_to_measure_passes_that_on_to_smaller_shapes_only(cache_dir):
    cache = timing.cache_for("cpu:cpu")
    cache.entries[_keys("Conv")] = None  # measured at batch 2 as faster than a few calls' overhead
    attrs = CONV_ATTRS

    def wanted(batch: int) -> timing.Wanted:
        shapes = ((batch, 40, 40, 16), W.shape)
        return timing.Wanted(node_key("Conv", attrs, list(shapes), "float32"), "Conv", attrs, shapes, "float32",
                             ("float32", "float32"), f"batch {batch}")  # fmt: skip

    prices = timing.transferred(cache, [wanted(1), wanted(3)], load_profile("cpu"), 4.0)
    assert prices == {wanted(1).key: None}  # batch 3 may be slow enough to measure: it is measured


def test_choices_are_measured_largest_stake_first_each_with_its_rivals(cache_dir):
    """A budget that runs out leaves the smallest choices to the roofline, never one rival of a large choice."""

    def wanted(op: str, batch: int) -> timing.Wanted:
        shapes = ((batch, 40, 40, 16), W.shape)
        return timing.Wanted(node_key(op, CONV_ATTRS, list(shapes), "float32"), op, CONV_ATTRS, shapes, "float32",
                             ("float32", "float32"), f"batch {batch}")  # fmt: skip

    small, large = [wanted(op, 1) for op in ("Conv", "ShiftConv")], [wanted(op, 8) for op in ("Conv", "ShiftConv")]
    ordered = timing.by_stake([small[0], large[0], small[1], large[1]], load_profile("cpu"))
    assert ordered == [*large, *small]
    measured = []
    counts = timing.measure(timing.cache_for("cpu:cpu"), ordered, 1.0, timer=lambda w: measured.append(w) or 1.0)
    assert measured == ordered and counts["measured"] == 4


def test_a_budget_running_out_still_measures_the_rivals_of_the_choice_under_way(cache_dir):
    def wanted(op: str, eclass: str) -> timing.Wanted:
        return timing.Wanted(f"{op} {eclass}", op, CONV_ATTRS, (X.shape, W.shape), "float32", ("float32",) * 2, eclass)

    def slow(w: timing.Wanted) -> float:
        time.sleep(0.02)
        return 1.0

    choices = [wanted("Conv", "a"), wanted("ShiftConv", "a"), wanted("Conv", "b"), wanted("ShiftConv", "b")]
    counts = timing.measure(timing.cache_for("cpu:cpu"), choices, 0.01, timer=slow)
    assert (counts["measured"], counts["skipped"]) == (2, 2)
    assert set(timing.cache_for("cpu:cpu").entries) == {"Conv a", "ShiftConv a"}
