"""benches.charts: the benchmark harness's SVG charts, drawn from its recorded results."""

import json
from pathlib import Path

import pytest

from benches import charts

pytest.importorskip("matplotlib")  # the `charts` extra (part of `test`)
BENCHES = Path(__file__).parent.parent / "benches"


def test_speedup_and_optimize_time_charts_name_every_model(tmp_path):
    results = BENCHES / "results.json"
    speedup, optimize = charts.draw_results(results, tmp_path)
    assert (speedup.name, optimize.name) == ("results_speedup.svg", "results_optimize_time.svg")
    rows = json.loads(results.read_text())["rows"]
    for path in (speedup, optimize):
        svg = path.read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg
        assert all(f">{row['model']}<" in svg for row in rows)  # text stays text (svg.fonttype none)
    assert "Tensat (GPU, published)" in speedup.read_text() and "IQR" in speedup.read_text()
    again = charts.draw_results(results, tmp_path / "again")
    assert again[0].read_text() == speedup.read_text()  # no dates or random ids: a re-run changes nothing


def test_fidelity_scatter_says_how_many_plans_and_the_rank_correlation(tmp_path):
    fidelity = json.loads((BENCHES / "fidelity.json").read_text())
    svg = charts.draw_fidelity(BENCHES / "fidelity.json", tmp_path).read_text()
    assert f"{fidelity['plans']} plans, Spearman rank correlation {fidelity['spearman']:.3f}" in svg
    assert "predicted = measured" in svg


def test_a_missing_matplotlib_is_said_not_raised(capsys):
    def draw() -> list[Path]:
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    charts.write_charts(draw)
    assert "no charts: matplotlib is not installed" in capsys.readouterr().out
