"""eqsat/plans/plan_json.py: plans saved as versioned JSON that loads back equal, with where every node came from;
files of the previous format versions still load."""

import json
from dataclasses import fields, replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.extract import changes
from eqsat.extract.plan import Plan, PlanNode
from eqsat.extract.views import original_graph
from eqsat.plans import plan_json

V1_PLAN = Path(__file__).parent / "data" / "plan_v1.json"  # saved by eqsat before provenance (x@W1 + x@W2)


def test_json_round_trip_is_equal(plans, tmp_path):
    plan = plans["cpu"]
    loaded = plan_json.load_plan(plan_json.save_plan(plan, tmp_path / "plan.json"))
    assert loaded == plan
    assert loaded.graph is None  # a loaded plan cannot be lowered, as backends.lower expects
    assert all(isinstance(n.shape, tuple) and isinstance(n.inputs, tuple) for n in loaded.nodes)
    assert original_graph(loaded).nodes == plan.graph.nodes
    # saving the loaded plan again gives the same file: the format is stable
    again = plan_json.save_plan(loaded, tmp_path / "again.json")
    assert again.read_text() == (tmp_path / "plan.json").read_text()


def test_every_compared_field_is_saved(plans):
    saved = plan_json.plan_to_dict(plans["cpu"])["plan"]
    assert set(saved) == {f.name for f in fields(Plan) if f.compare}  # graph and memory are not compared
    assert set(saved["nodes"][0]) == {f.name for f in fields(PlanNode)}


def test_opaque_primitive_names_survive_saving(tmp_path):
    x, w = np.ones((8, 4), np.float32), np.ones((4, 4), np.float32)
    plan = eqsat.optimize(lambda x, w: jnp.sort(x @ w + x @ w, axis=0)).plan(x, w)
    loaded = plan_json.load_plan(plan_json.save_plan(plan, tmp_path / "plan.json"))
    assert loaded == plan
    assert changes.diff_original(loaded) == changes.diff_original(plan)
    assert "sort" in str(original_graph(loaded).opaque[0].primitive)


def test_version_is_written_and_checked(plans, tmp_path):
    data = json.loads(plan_json.save_plan(plans["cpu"], tmp_path / "plan.json").read_text())
    assert data["format"] == "eqsat-plan" and data["version"] == plan_json.VERSION == 4
    with pytest.raises(plan_json.PlanFormatError, match="version 99 is not supported"):
        plan_json.plan_from_dict({**data, "version": 99})
    with pytest.raises(plan_json.PlanFormatError, match="not an eqsat plan"):
        plan_json.plan_from_dict({"format": "something-else", "version": 1})
    with pytest.raises(plan_json.PlanFormatError, match="malformed"):
        plan_json.plan_from_dict({**data, "plan": {**data["plan"], "unknown_field": 1}})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(plan_json.PlanFormatError, match="not JSON"):
        plan_json.load_plan(tmp_path / "bad.json")


def test_provenance_is_saved_and_loads_back(tmp_path):
    def f(params, x):
        with jax.named_scope("block"):
            return jnp.tanh(x @ params["w"])

    one = np.ones((4, 4), np.float32)
    plan = eqsat.optimize(f, params_argnums=0).plan({"w": one}, one)
    loaded = plan_json.load_plan(plan_json.save_plan(plan, tmp_path / "plan.json"))
    assert loaded == plan  # scopes, sources, paths and parameters of every node are compared fields
    assert sorted(n.path for n in loaded.nodes if n.op == "Var") == ["params.w", "x"]
    assert any(n.scopes == ("block",) and n.sources for n in loaded.nodes)
    graph, original = original_graph(loaded), plan.graph
    assert graph.where == original.where and graph.variables == original.variables
    assert {n for n, v in graph.variables.items() if v.role == "parameter"} == {"x0"}
    assert loaded.original_seconds == plan.original_seconds and sum(plan.original_seconds) > 0


def test_a_file_of_the_previous_version_loads(tmp_path):
    assert json.loads(V1_PLAN.read_text())["version"] == 1
    plan = plan_json.load_plan(V1_PLAN)
    assert plan.target == "cpu" and plan.rewritten_ops() == {"Add": 1, "Dot": 1}
    assert all(n.scopes == () and n.sources == () and n.path == "" for n in plan.nodes)  # not recorded then
    assert plan.original_seconds == [] and original_graph(plan).where == {}
    (region,) = changes.diff_regions(plan)  # the diff still works: one region, at the top level
    assert region.name == changes.TOP_LEVEL and region.before["Dot"] == 2 and region.after["Dot"] == 1
    again = plan_json.load_plan(plan_json.save_plan(plan, tmp_path / "v4.json"))  # saved again: as version 4
    assert again == plan and json.loads((tmp_path / "v4.json").read_text())["version"] == 4


def test_a_version_2_file_loads_with_its_node_fields_renamed():
    """Version 2 named a node's `parameter_only` and `parameter` fields `weight` and `param`."""
    one = np.ones((4, 4), np.float32)
    plan = eqsat.optimize(lambda p, x: x @ (p["a"] + p["b"]), params_argnums=0).plan({"a": one, "b": one}, one)
    assert any(n.parameter_only for n in plan.nodes) and any(n.parameter for n in plan.nodes)
    old = {"parameter_only": "weight", "parameter": "param"}
    data = plan_json.plan_to_dict(plan)
    data["version"] = 2
    data["plan"]["nodes"] = [{old.get(k, k): v for k, v in n.items()} for n in data["plan"]["nodes"]]
    assert plan_json.plan_from_dict(data) == plan


def test_a_version_3_file_loads_with_its_overflow_watch_renamed():
    """Version 3 named the plan's `overflow_watch` (the @real rules whose values are watched) `overflow_guard`."""
    x = np.ones((8, 8), np.float32)
    plan = replace(eqsat.optimize(lambda a, b: a @ b + a).plan(x, x), overflow_watch=["dot-assoc-right"])
    data = plan_json.plan_to_dict(plan)
    data["version"] = 3
    data["plan"] = {("overflow_guard" if k == "overflow_watch" else k): v for k, v in data["plan"].items()}
    assert plan_json.plan_from_dict(data) == plan
