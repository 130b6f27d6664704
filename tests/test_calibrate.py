"""Calibration writes a profile that load_profile("cpu") then prefers; the fidelity script computes its figure."""

import json
import math

import pytest

import eqsat  # first: extract.cost imported alone would meet eqsat's import cycle half-way
from eqsat.extract.cost import load_bundled, load_profile, node_cost


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_calibrate_writes_a_profile_that_load_profile_prefers(cache):
    from eqsat.tools.calibrate import calibrate, summary

    assert load_profile("cpu") == load_bundled("cpu")  # nothing calibrated yet
    written = calibrate(seconds_budget=1.0, scale=1 / 16)
    path = cache / "profiles" / "cpu.json"
    assert written["path"] == str(path) and path.is_file()
    profile = load_profile("cpu")
    assert profile != load_bundled("cpu")
    assert profile.name == "cpu" and profile.disabled_rules == load_bundled("cpu").disabled_rules
    assert profile.peak_flops["float32"] > 0 and profile.bandwidth > 0 and profile.contraction_overhead is not None
    assert json.loads(path.read_text())["calibration"]["gemm"]
    cost = node_cost("Dot", [(64, 64), (64, 64)], (64, 64), "float32", profile)
    assert math.isfinite(cost.seconds) and cost.seconds > 0
    assert "peak GEMM" in summary(written)


def test_older_profile_json_still_loads(cache):
    (cache / "profiles").mkdir()
    old = json.loads(json.dumps(load_bundled("cpu").__dict__))  # only the original fields
    for new in ("contraction_overhead", "conv_peak_flops", "cache_bandwidth", "cache_bytes", "call_overhead"):
        old.pop(new)
    (cache / "profiles" / "cpu.json").write_text(json.dumps({**old, "launch_overhead": 1e-6, "extra": 1}))
    profile = load_profile("cpu")
    # the calibration's figures win; what an older calibration lacks comes from the bundled profile
    assert profile.launch_overhead == 1e-6
    assert profile.contraction_overhead == load_bundled("cpu").contraction_overhead


def test_fidelity_is_computed_on_tiny_candidates(cache):
    from benches.fidelity import VARIANTS, candidates, evaluate
    from eqsat.tools.examples import EXAMPLES

    works = [EXAMPLES["matmul_chain"]("small"), EXAMPLES["distributivity"]("small")]
    cands = candidates(works, [v for v in VARIANTS if v[0] in ("cpu", "none")])
    assert len(cands) == 4
    result = evaluate(cands, load_profile("cpu"), seconds=0.02)
    assert len(result["rows"]) == 4 and all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in result["rows"])
    assert -1.0 <= result["spearman"] <= 1.0


@pytest.mark.parametrize("content", [b"\xff\xfe{", b"{not json", b"[1, 2]"], ids=["not-utf8", "not-json", "a-list"])
def test_an_unreadable_calibrated_profile_never_stops_planning(cache, content):
    """A calibrated profile in the cache that cannot be read (bad bytes: a UnicodeDecodeError from every
    optimize() until it was deleted) gives the bundled profile, with a warning naming the file."""
    (cache / "profiles").mkdir()
    (cache / "profiles" / "cpu.json").write_bytes(content)
    with pytest.warns(eqsat.EqsatWarning, match="ignoring the calibrated profile .*cpu.json"):
        assert load_profile("cpu") == load_bundled("cpu")
