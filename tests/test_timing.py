"""The timing cache: kernel choices measured on this device, kept across calls and processes, moved between
machines, and prices that decide the plan."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.__main__ import main
from eqsat.extract import timing
from eqsat.extract.cost import load_profile, node_key

X = jnp.asarray(np.random.default_rng(0).standard_normal((2, 40, 40, 16)), jnp.float32)
W = jnp.asarray(np.random.default_rng(1).standard_normal((3, 3, 1, 16)), jnp.float32)


def depthwise(x, w):
    return jnp.tanh(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             feature_group_count=16))  # fmt: skip


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    return tmp_path


def _keys(op: str) -> str:
    return node_key(op, (1, 1, 1, 1, 1, 1, 1, 1, 16), [X.shape, W.shape], "float32")


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
    with pytest.raises(ValueError, match="format 1"):
        timing.parse(bad.read_text(), "bad.json")
    stale = timing.TimingCache("cpu:cpu", "jax 0.0.0, jaxlib 0.0.0", {_keys("Conv"): 1.0})
    (cache_dir / "timing").mkdir()
    (cache_dir / "timing" / "cpu_cpu.json").write_text(stale.to_json())
    assert timing.cache_for("cpu:cpu").entries == {}  # another jax may run the op differently: not trusted
    with pytest.raises(ValueError, match="cannot join"):
        timing.cache_for("cpu:cpu").merge(stale)


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
    finally:
        sys.path.remove(str(tmp_path))
    out = tmp_path / "export.json"
    assert main(["tune", "--export", str(out)]) == 0
    assert len(timing.parse(out.read_text(), str(out)).entries) == 2


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
