"""extract.changes: plans side by side, and what changed by named region of the user's program."""

import pytest
from rich.console import Console

from eqsat.extract import changes
from eqsat.extract.views import plan_program
from eqsat.tools import html_report


def test_compare_prints_a_table_and_returns_its_data(plans, capsys):
    data = changes.compare(plans["cpu"], plans["h100"], console=Console(width=160))
    printed = capsys.readouterr().out
    assert list(data) == ["cpu", "h100"]
    assert data["h100"]["target"] == "h100"
    assert data["cpu"]["predicted time"] > data["h100"]["predicted time"]  # an H100 is faster than a CPU
    for key in ("nodes", "rewritten nodes", "predicted flops", "predicted bytes", "predicted kernels", "speed-up"):
        assert key in data["cpu"] and key in printed
    assert "stop reason" in printed and "dot-factor-left" in printed
    assert "regions that differ, cpu -> h100: none" in printed and data["h100"]["regions vs first"] == []
    labelled = changes.compare(plans["cpu"], plans["cpu"], labels=["before", "after"], console=Console(width=160))
    assert list(labelled) == ["before", "after"]
    with pytest.raises(ValueError, match="distinct labels"):
        changes.compare(plans["cpu"], plans["h100"], labels=["x", "x"])


def test_compare_of_plans_of_two_programs_says_they_are_different_programs(plans, capsys, tmp_path):
    data = changes.compare(plans["cpu"], plans["chain"], labels=["mine", "theirs"], console=Console(width=400))
    printed = capsys.readouterr().out
    note = "mine and theirs are plans of different programs (input a only in theirs): the regions compare them"
    assert note in printed and data["theirs"]["different program"] == "input a only in theirs"
    assert printed.index(note) < printed.index("regions that differ, mine -> theirs: ")
    assert not any(line.endswith("x)") or "x); from" in line for line in data["theirs"]["regions vs first"])
    assert "plans of different programs (input a only in b)" in changes.diff(plans["cpu"], plans["chain"])
    page = html_report.to_html(plans["cpu"], tmp_path / "two.html", versus=plans["chain"], labels=("mine", "theirs"))
    assert "of different programs (input a only in theirs)" in page.read_text()
    # one program planned for two targets: no note
    data = changes.compare(plans["cpu"], plans["h100"], console=Console(width=400))
    assert "different programs" not in capsys.readouterr().out and data["h100"]["different program"] is None
    assert not any("different programs" in line for line in changes.diff(plans["cpu"], plans["h100"]))


def test_diff_names_changed_ops_and_subgraphs(plans):
    lines = changes.diff_original(plans["cpu"])
    assert "only in original: Add(Dot(x, w1), Dot(x, w2))  : 64x32 float32" in lines, lines
    assert "only in plan: Dot(x, Add(w1, w2))  : 64x32 float32" in lines
    assert "Dot 64x32 float32: 2 -> 1 (-1)" in lines
    assert lines[0] == "regions (original -> plan):" and lines[1].startswith("  (top level): 2 Dot, 1 Add -> 1 Dot,")
    between = changes.diff(plans["cpu"], plans["chain"])
    assert "only in b: Dot(a, Dot(b, v))  : 64x4 float32" in between, between
    same = changes.diff(plans["cpu"], plans["h100"])
    assert "same ops and subgraphs in a and b" in same


def test_compare_of_the_cpu_and_h100_bert_plans_names_the_layers_that_differ(bert_small_plans, capsys):
    cpu, h100 = bert_small_plans["cpu"], bert_small_plans["h100"]
    data = changes.compare(cpu, h100, console=Console(width=200))
    printed = capsys.readouterr().out
    differ = data["h100"]["regions vs first"]
    expected = changes.regions(plan_program(cpu), plan_program(h100), h100.rules_fired, comparable=False)
    assert differ == [r.line() for r in expected] and differ  # the two targets' plans differ somewhere
    assert not any(line.endswith("x)") or "x); from" in line for line in differ)  # no ratio of two targets' times
    for region, line in zip(expected, differ, strict=True):
        assert region.name.startswith(("encoder/layer_0/", "encoder/layer_1/")), line  # named by layer and part
        assert line in printed
    assert f"regions that differ, cpu -> h100: {len(differ)}" in printed
    for plan in (cpu, h100):  # both plans name what they changed against the original, layer by layer
        assert {name.split("/")[1] for name in data[plan.target]["changed regions"]} == {"layer_0", "layer_1"}
