"""extract.html_report: DOT, and the HTML report (ELK laid out, clusters by name stack), checked in Chromium."""

import dataclasses
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

import eqsat
from eqsat.census import census
from eqsat.extract.changes import diff_regions, regions
from eqsat.extract.plan import Plan
from eqsat.extract.views import plan_program
from eqsat.plans import plan_json
from eqsat.tools import html_report
from eqsat.tools.examples import EXAMPLES

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def plan() -> Plan:
    work = EXAMPLES["distributivity"]("small")
    return eqsat.optimize(work.fn).plan(*work.args)


def _graph_data(page: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', page, re.S)[1])


def test_to_dot_looks_like_dot(plan):
    for which, program_size in (("plan", len(plan.nodes)), ("original", len(plan.graph.nodes))):
        dot = html_report.to_dot(plan, which)
        assert dot.startswith(f'digraph "{which}" {{') and dot.rstrip().endswith("}")
        assert len(re.findall(r"^  n\d+ \[label=", dot, re.M)) == program_size
        assert dot.count("->") == sum(len(n.inputs) for n in (plan.nodes if which == "plan" else plan.graph.nodes))
    assert html_report.to_dot(plan).count("#ffb347") == sum(n.rewritten for n in plan.nodes)
    with pytest.raises(ValueError, match="which"):
        html_report.to_dot(plan, "neither")
    if shutil.which("dot"):  # graphviz itself, where installed, must accept it
        subprocess.run(["dot", "-Tsvg"], input=html_report.to_dot(plan), text=True, check=True, capture_output=True)


@pytest.mark.parametrize("loaded", [False, True])
def test_to_html_is_one_self_contained_file(plan, tmp_path, loaded):
    if loaded:
        plan = plan_json.load_plan(plan_json.save_plan(plan, tmp_path / "plan.json"))
    page = html_report.to_html(plan, tmp_path / "report.html").read_text()
    assert page.count('class="pane"') == 2 and "new ELK()" in page and "elk.bundled" not in page.split("<script>")[0]
    assert 'id="cost-summary"' in page and 'id="per-node"' in page and 'id="rules"' in page and 'id="regions"' in page
    assert "dot-factor-left" in page and "64x32 float32" in page
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)  # nothing fetched from outside
    assert not re.search(r"""<(script|link)[^>]*(src|href)=""", page)  # and nothing read from beside it
    data = _graph_data(page)
    assert len(data["pane-b"]["nodes"]) == len(plan.nodes) and data["pane-a"]["collapsed"] == []  # small: all open


def test_clusters_follow_name_stacks_and_large_programs_start_collapsed(bert_small_plans, tmp_path):
    plan = bert_small_plans["h100"]
    data = _graph_data(html_report.to_html(plan, tmp_path / "bert.html").read_text())["pane-b"]
    clusters = data["clusters"]
    assert {"encoder", "encoder/layer_0", "encoder/layer_1", "encoder/layer_0/attention/q"} <= set(clusters)
    assert data["collapsed"] and len(data["nodes"]) > html_report.MAX_VISIBLE  # too many to draw open
    shown = {name for info in clusters.values() for name in info["regions"]}
    assert shown == {r.name for r in diff_regions(plan) if r.scope}  # every named region has a box
    assert all(clusters[c]["changed"] for c in ("encoder/layer_0", "encoder/layer_1"))
    inputs = {n["label"]: n["cluster"] for n in data["nodes"] if n["kind"] == "input"}
    assert inputs["params.layers[0].attn.q.w"].startswith("encoder/layer_0/attention")  # beside its consumer


def test_a_report_of_two_plans_shows_their_differences(bert_small_plans, tmp_path):
    cpu, h100 = bert_small_plans["cpu"], bert_small_plans["h100"]
    page = html_report.to_html(cpu, tmp_path / "two.html", versus=h100, labels=("cpu", "h100")).read_text()
    assert "eqsat plans cpu (cpu) and h100 (h100)" in page
    rows = re.findall(r'<tr data-region="([^"]+)"', page)
    assert rows == [html.escape(r.name) for r in regions(plan_program(cpu), plan_program(h100), h100.rules_fired)]
    assert {row.split("/")[1] for row in rows} == {"layer_0", "layer_1"}  # the layers that differ, each named


class _Drawn(HTMLParser):
    """The boxes the page drew for regions (data-regions, data-box) and the text inside each."""

    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.census: dict[str, str] = {}  # the census chart's element
        self.census_rows = 0
        self.boxes: list[dict] = []
        self._current: dict | None = None
        self._in_text = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "div" and a.get("id") == "census":
            self.census = a
        if tag == "g" and a.get("class") == "census-row":
            self.census_rows += 1
        if tag == "g" and "data-regions" in a:
            self._current = {"regions": a["data-regions"].split("|"), "box": a.get("data-box"), "text": []}
            self.boxes.append(self._current)
        elif tag == "g":
            self._current = None
        self._in_text = tag == "text"

    def handle_endtag(self, tag: str) -> None:
        self._in_text = False

    def handle_data(self, data: str) -> None:
        if self._in_text and self._current is not None:
            self._current["text"].append(data)


def _chromium(page: Path, *flags: str) -> subprocess.CompletedProcess:
    common = "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
    common += " --disable-component-update --disable-sync --window-size=1600,1000 --virtual-time-budget=30000"
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, *common.split(), f"--user-data-dir={profile}", *flags, page.resolve().as_uri()],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _rendered(page: Path) -> tuple[_Drawn, int, int]:
    """The page rendered in headless Chromium once its layout finished: what it drew, the view's width and height."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("EQSAT_REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} is absent and EQSAT_REQUIRE_BROWSER is set (.ci/run installs chromium)")
        pytest.skip(f"{CHROMIUM} is absent: install chromium to render the report headlessly")
    drawn = _Drawn()
    drawn.feed(_chromium(page, "--dump-dom").stdout)
    assert drawn.body.get("data-ready") == "yes", "the layout did not finish"
    width, height = map(int, drawn.body["data-viewport"].split(","))
    return drawn, width, height


def _check_in_chromium(plan: Plan, tmp_path: Path, name: str) -> None:
    """Render the plan's report in headless Chromium: every named region drawn in both panes, inside the view, with
    its name; a screenshot kept as the test's artifact (EQSAT_TEST_ARTIFACTS, .ci/run sets it)."""
    page = html_report.to_html(plan, tmp_path / f"{name}.html")
    drawn, width, height = _rendered(page)
    named = [r for r in diff_regions(plan) if r.scope]
    assert len(named) >= 4  # each layer's Q/K/V merge, attention and ffn at least
    for region in named:
        boxes = [b for b in drawn.boxes if region.name in b["regions"]]
        assert len(boxes) == 2, f"{region.name}: drawn in {len(boxes)} of the 2 panes"
        for box in boxes:
            left, top, right, bottom = map(int, box["box"].split(","))
            assert 0 <= left < right <= width and 0 <= top < bottom <= height, f"{region.name} outside the view"
            assert region.name.split("/")[-1] in " ".join(box["text"]), f"{region.name} is not named"
    _screenshot(page, tmp_path, name)


def _screenshot(page: Path, tmp_path: Path, name: str) -> None:
    """A screenshot kept as the test's artifact (EQSAT_TEST_ARTIFACTS, .ci/run sets it)."""
    artifacts = Path(os.environ.get("EQSAT_TEST_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / f"{name}.png"
    _chromium(page, f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_bert_report_draws_every_changed_region_in_view_in_chromium(bert_small_plans, tmp_path):
    _check_in_chromium(bert_small_plans["h100"], tmp_path, "bert_small_report")


def test_census_chart_is_drawn_in_view_in_chromium(bert_small_plans, tmp_path):
    """The census (every kernel class of the small BERT, given times here: the chart is checked, not the clock)
    drawn first in the report, one row per kernel class, inside the view."""
    plan = bert_small_plans["cpu"]
    found = census.take(plan, rules=(), measure_seconds=0)
    found.kernels = [dataclasses.replace(k, measured_s=3 * k.roofline_s) for k in found.kernels]
    found.original_s = sum(k.total_s for k in found.kernels)
    page = html_report.to_html(plan, tmp_path / "census.html", census=found)
    assert "Where the time goes" in page.read_text()
    drawn, width, height = _rendered(page)
    rows = min(len(found.kernels), html_report.CENSUS_ROWS + 1)
    assert int(drawn.census["data-rows"]) == drawn.census_rows == rows
    left, top, right, bottom = map(int, drawn.census["data-box"].split(","))
    assert 0 <= left < right <= width and 0 <= top < bottom <= height, "the census chart is outside the view"
    _screenshot(page, tmp_path, "census_report")


@pytest.mark.slow
def test_full_bert_report_shows_its_eight_layers_in_chromium(tmp_path):
    """The acceptance case: `optimize --bench bert --target h100 --params-argnums 0 --html`, 8 layers."""
    from benches.models.registry import MODELS

    work = MODELS["bert"]("full")
    limits = eqsat.Limits(seconds=300, measure_seconds=0)  # saturated however loaded the machine, roofline-priced
    fast = eqsat.optimize(work.fn, target="h100", params_argnums=0, validate=False, limits=limits, extractor="greedy")
    plan = fast.plan(*work.args)
    assert plan.stop_reason == "saturated"
    merged = [r for r in diff_regions(plan) if r.name.endswith("attention/{q,k,v}")]
    assert [r.scope for r in merged] == [f"encoder/layer_{i}/attention" for i in range(8)]
    assert all("shared-input-merge" in r.rules and r.sources for r in merged)
    _check_in_chromium(plan, tmp_path, "bert_report")
