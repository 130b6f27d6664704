"""extract.report: plans saved as versioned JSON, compared, diffed, drawn as DOT and written as HTML reports."""

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import fields
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from rich.console import Console

import eqsat
from eqsat.examples import EXAMPLES
from eqsat.extract import report
from eqsat.extract.plan import Plan, PlanNode

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    work = EXAMPLES["distributivity"]("small")
    chain = EXAMPLES["matmul_chain"]("small")
    return {
        "cpu": eqsat.optimize(work.fn).plan(*work.args),
        "h100": eqsat.optimize(work.fn, target="h100").plan(*work.args),
        "chain": eqsat.optimize(chain.fn).plan(*chain.args),
    }


def test_json_round_trip_is_equal(plans, tmp_path):
    plan = plans["cpu"]
    loaded = report.load_plan(report.save_plan(plan, tmp_path / "plan.json"))
    assert loaded == plan
    assert loaded.graph is None  # a loaded plan cannot be lowered, as backends.lower expects
    assert all(isinstance(n.shape, tuple) and isinstance(n.inputs, tuple) for n in loaded.nodes)
    assert report.original_graph(loaded).nodes == plan.graph.nodes
    # saving the loaded plan again gives the same file: the format is stable
    again = report.save_plan(loaded, tmp_path / "again.json")
    assert again.read_text() == (tmp_path / "plan.json").read_text()


def test_every_compared_field_is_saved(plans):
    saved = report.plan_to_dict(plans["cpu"])["plan"]
    assert set(saved) == {f.name for f in fields(Plan) if f.compare}  # graph and memory are not compared
    assert set(saved["nodes"][0]) == {f.name for f in fields(PlanNode)}


def test_opaque_primitive_names_survive_saving(tmp_path):
    x, w = np.ones((8, 4), np.float32), np.ones((4, 4), np.float32)
    plan = eqsat.optimize(lambda x, w: jnp.cumsum(x @ w + x @ w, axis=0)).plan(x, w)
    loaded = report.load_plan(report.save_plan(plan, tmp_path / "plan.json"))
    assert loaded == plan
    assert report.diff_original(loaded) == report.diff_original(plan)
    assert "cumsum" in report.to_dot(loaded, "original")


def test_version_is_written_and_checked(plans, tmp_path):
    data = json.loads(report.save_plan(plans["cpu"], tmp_path / "plan.json").read_text())
    assert data["format"] == "eqsat-plan" and data["version"] == 1
    with pytest.raises(report.PlanFormatError, match="version 99 is not supported"):
        report.plan_from_dict({**data, "version": 99})
    with pytest.raises(report.PlanFormatError, match="not an eqsat plan"):
        report.plan_from_dict({"format": "something-else", "version": 1})
    with pytest.raises(report.PlanFormatError, match="malformed"):
        report.plan_from_dict({**data, "plan": {**data["plan"], "unknown_field": 1}})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(report.PlanFormatError, match="not JSON"):
        report.load_plan(tmp_path / "bad.json")


def test_compare_prints_a_table_and_returns_its_data(plans, capsys):
    data = report.compare(plans["cpu"], plans["h100"], console=Console(width=160))
    printed = capsys.readouterr().out
    assert list(data) == ["cpu", "h100"]
    assert data["h100"]["target"] == "h100"
    assert data["cpu"]["predicted time"] > data["h100"]["predicted time"]  # an H100 is faster than a CPU
    for key in ("nodes", "rewritten nodes", "predicted flops", "predicted bytes", "predicted kernels", "speed-up"):
        assert key in data["cpu"] and key in printed
    assert "stop reason" in printed and "dot-factor-left" in printed
    labelled = report.compare(plans["cpu"], plans["cpu"], labels=["before", "after"], console=Console(width=160))
    assert list(labelled) == ["before", "after"]
    with pytest.raises(ValueError, match="distinct labels"):
        report.compare(plans["cpu"], plans["h100"], labels=["x", "x"])


def test_diff_names_changed_ops_and_subgraphs(plans):
    lines = report.diff_original(plans["cpu"])
    assert "only in original: Add(Dot(x0, x1), Dot(x0, x2))  : 64x32 float32" in lines
    assert "only in plan: Dot(x0, Add(x1, x2))  : 64x32 float32" in lines
    assert "Dot 64x32 float32: 2 -> 1 (-1)" in lines
    between = report.diff(plans["cpu"], plans["chain"])
    assert "only in b: Dot(x0, Dot(x1, x2))  : 64x4 float32" in between
    same = report.diff(plans["cpu"], plans["h100"])
    assert "same ops and subgraphs in a and b" in same


def test_to_dot_looks_like_dot(plans):
    plan = plans["cpu"]
    for which, program_size in (("plan", len(plan.nodes)), ("original", len(plan.graph.nodes))):
        dot = report.to_dot(plan, which)
        assert dot.startswith(f'digraph "{which}" {{') and dot.rstrip().endswith("}")
        assert len(re.findall(r"^  n\d+ \[label=", dot, re.M)) == program_size
        assert dot.count("->") == sum(len(n.inputs) for n in (plan.nodes if which == "plan" else plan.graph.nodes))
    assert report.to_dot(plan).count("#ffb347") == sum(n.rewritten for n in plan.nodes)
    with pytest.raises(ValueError, match="which"):
        report.to_dot(plan, "neither")
    if shutil.which("dot"):  # graphviz itself, where installed, must accept it
        subprocess.run(["dot", "-Tsvg"], input=report.to_dot(plan), text=True, check=True, capture_output=True)


@pytest.mark.parametrize("loaded", [False, True])
def test_to_html_is_self_contained_with_graphs_and_tables(plans, tmp_path, loaded):
    plan = plans["cpu"]
    if loaded:
        plan = report.load_plan(report.save_plan(plan, tmp_path / "plan.json"))
    page = report.to_html(plan, tmp_path / "report.html").read_text()
    assert page.count("<svg") == 2
    assert 'id="cost-summary"' in page and 'id="per-node"' in page and 'id="rules"' in page
    assert "dot-factor-left" in page and "64x32 float32" in page
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)  # nothing fetched from outside


def test_html_report_renders_in_chromium(plans, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is absent: install chromium to render the report headlessly")
    page = report.to_html(plans["cpu"], tmp_path / "report.html")
    shot = tmp_path / "report.png"
    flags = "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
    flags += " --disable-component-update --disable-sync --window-size=1400,1000"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [CHROMIUM, *flags.split(), f"--user-data-dir={profile}", f"--screenshot={shot}", page.resolve().as_uri()],
            check=True,
            capture_output=True,
            timeout=120,
        )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
