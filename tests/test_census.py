"""The kernel census (eqsat/census/census.py): what its table lists for small programs, not how fast anything ran.

Kernels are timed by stand-ins (a depthwise convolution slow, every other kernel fast; fused loops and opaque calls
still compiled and run alone), so that the plan's choice and the table's figures do not follow the machine's load."""

import dataclasses
import json
import logging

import jax
import jax.numpy as jnp
import pytest

import eqsat
from eqsat.__main__ import main
from eqsat.census import census, units
from eqsat.extract import timing
from eqsat.extract.cost import load_profile, node_cost
from eqsat.planning import planner

CONV_S, OTHER_S = 1e-3, 1e-5


@pytest.fixture(autouse=True)
def own_timing_cache(tmp_path, monkeypatch):
    """A timing cache of this test's own (the stand-in's times stay out of the session's cache), and the stand-in."""
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path / "cache"))

    def measure_one(wanted: timing.Wanted) -> float:
        return CONV_S if wanted.op == "Conv" else OTHER_S

    monkeypatch.setattr(timing, "measure_one", measure_one)
    timed = timing.time_alone

    def time_alone(fn, args):  # fused loops and opaque calls: compiled and run as they are, timed as fast
        timed(fn, args)
        return OTHER_S

    monkeypatch.setattr(timing, "time_alone", time_alone)


def depthwise(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
    """A depthwise 3x3 convolution (its e-class holds ShiftConv), a loop, and a sort (an opaque primitive)."""
    y = jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=x.shape[-1]
    )
    return jnp.sort(jnp.tanh(y), axis=-1)


def two_layers(x: jnp.ndarray, w1: jnp.ndarray, w2: jnp.ndarray) -> jnp.ndarray:
    """Two layers of the same shapes: one matmul class and one loop class, each twice."""
    return jnp.tanh(jnp.tanh(x @ w1) @ w2)


def _depthwise_args() -> tuple:
    return jnp.ones((2, 16, 16, 8)), jnp.ones((3, 3, 1, 8))


def _two_layer_args() -> tuple:
    return jnp.ones((32, 64)), jnp.ones((64, 64)), jnp.ones((64, 64))


def _kernel(found: census.Census, name: str) -> census.Kernel:
    matches = [k for k in found.kernels if k.name == name]
    assert len(matches) == 1, [(k.name, k.detail) for k in found.kernels]
    return matches[0]


def test_depthwise_conv_names_its_alternative_and_what_the_plan_saved():
    found = eqsat.optimize(depthwise).census(*_depthwise_args())
    conv = _kernel(found, "Conv")
    assert conv.alternatives == ("ShiftConv",)
    assert (conv.chosen, conv.chosen_count) == ("ShiftConv", 1)  # 1 ms against 13 us (the switch margin on top)
    assert conv.measured_s == CONV_S and conv.chosen_s == OTHER_S
    assert conv.saved_s == pytest.approx(CONV_S - OTHER_S)
    assert conv.kind == "kernel" and conv.detail.startswith("f32[2,16,16,8] f32[3,3,1,8] -> f32[2,16,16,8]")
    assert found.kernels[0] is conv  # the most time lost against the roofline comes first


def test_opaque_primitive_is_listed_and_counted_as_untouched():
    found = eqsat.optimize(depthwise).census(*_depthwise_args())
    sort = _kernel(found, "sort")
    assert sort.kind == "opaque" and sort.alternatives == () and sort.measured_s is not None
    assert found.opaque_s == pytest.approx(sort.total_s)
    assert any(k.kind == "fused" and "Tanh" in k.name for k in found.kernels)
    assert "untouched by eqsat" in str(found) and "sort" in str(found)


def test_identical_kernels_are_grouped_with_their_count():
    found = eqsat.optimize(two_layers).census(*_two_layer_args())
    dot = _kernel(found, "Dot")
    assert dot.count == 2 and dot.measured_s == OTHER_S and dot.total_s == pytest.approx(2 * OTHER_S)
    assert [k.count for k in found.kernels if k.kind == "fused"] == [2]  # the two tanh loops: one class


def test_kernels_cover_the_program_so_shares_add_up():
    """Every op of the program is in exactly one kernel: their rooflines add up to the program's."""
    fast = eqsat.optimize(two_layers)
    args = _two_layer_args()
    found = fast.census(*args)
    graph, profile = fast.plan(*args).graph, load_profile("cpu")
    whole = sum(
        node_cost(n.op, [graph.nodes[j].shape for j in n.inputs], n.shape, n.dtype, profile, n.attrs).seconds
        for n in (graph.nodes[i] for i in graph.live())
        if n.op != "Var"
    )
    assert sum(k.count * k.roofline_s for k in found.kernels) == pytest.approx(whole)
    assert found.original_s > 0 and found.plan_s > 0 and found.rounds >= 5  # timed end to end, interleaved
    shares = sum(found.share(k) for k in found.kernels)
    assert shares == pytest.approx(found.kernels_s / found.original_s)


def test_kernels_in_the_timing_cache_cost_nothing_and_the_budget_bounds_the_rest():
    args = _depthwise_args()
    first = eqsat.optimize(depthwise, limits=eqsat.Limits(measure_seconds=0)).census(*args)
    assert first.measured == 0 and all(k.measured_s is None for k in first.kernels)  # no budget: listed, untimed
    assert "-" in str(first)
    second = eqsat.optimize(depthwise).census(*args)
    assert second.measured > 0 and second.skipped == 0
    third = eqsat.optimize(depthwise).census(*args)
    assert third.measured == 0 and third.cached == second.cached + second.measured


def test_json_round_trip(tmp_path):
    found = eqsat.optimize(depthwise).census(*_depthwise_args())
    again = census.load_census(found.save(tmp_path / "census.json"))
    assert again == found and str(again) == str(found)


def test_cli_profile_prints_the_table_and_saves_json(tmp_path, capsys):
    out = tmp_path / "census.json"
    argv = ["census", "test_census:depthwise", "--args", "f32[2,16,16,8]", "f32[3,3,1,8]", "--seconds", "0.1"]
    assert main([*argv, "--json", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "census of depthwise" in printed and "ShiftConv x1" in printed and "sort" in printed
    assert census.load_census(out).kernels[0].name == "Conv"


def test_cli_profile_plans_with_its_budget_at_these_very_shapes(monkeypatch):
    """The plan's kernel choices measured as the census times them: within --budget, none priced from other shapes."""
    built = []
    optimize = eqsat.optimize
    monkeypatch.setattr(eqsat, "optimize", lambda *a, **k: built.append(k["limits"]) or optimize(*a, **k))
    argv = ["census", "test_census:depthwise", "--args", "f32[2,16,16,8]", "f32[3,3,1,8]", "--seconds", "0"]
    assert main([*argv, "--budget", "7", "--no-progress"]) == 0
    assert [(limits.measure_seconds, limits.timing_transfer) for limits in built] == [(7.0, 0.0)]


def test_compare_shows_two_censuses_side_by_side(tmp_path, capsys):
    args = _depthwise_args()
    found = eqsat.optimize(depthwise).census(*args)
    kept = eqsat.optimize(depthwise, disabled_rules=("kernels",)).census(*args)  # no alternative kernels
    assert kept.kernels[0].alternatives == () and not kept.kernels[0].chosen
    paths = [str(found.save(tmp_path / "a.json")), str(kept.save(tmp_path / "b.json"))]
    assert main(["compare", *paths]) == 0
    printed = capsys.readouterr().out
    conv = next(line for line in printed.splitlines() if line.startswith("│ Conv"))
    assert "ShiftConv x1" in conv and conv.count("1 ms") == 2  # timed alike in both, chosen in one
    assert main(["compare", *paths, paths[0]]) == 2


def test_kernels_far_from_the_program_are_flagged_and_a_plan_without_program_is_refused():
    kernel = census.Kernel("k", "kernel", "Dot", "f32[8,8] f32[8,8] -> f32[8,8]", 4, 1e-6, 1e-3)
    far = census.Census("f", "cpu:cpu", "cpu", [kernel], original_s=1e-3, plan_s=1e-3, rounds=5)
    assert "far from the program's time" in str(far)  # 4 ms of kernels in a 1 ms program
    near = census.Census("f", "cpu:cpu", "cpu", [kernel], original_s=4e-3, plan_s=1e-3, rounds=5)
    assert "far from" not in str(near) and near.share(kernel) == pytest.approx(1.0)
    plan_far = dataclasses.replace(near, plan_kernels=[kernel], plan_s=10e-3)  # 4 ms of the plan's kernels in 10 ms
    assert "far from the program's time" in str(plan_far)
    assert "far from" not in str(dataclasses.replace(plan_far, plan_s=4e-3))
    plan = eqsat.optimize(depthwise).plan(*_depthwise_args())
    with pytest.raises(ValueError, match="no census: the plan holds no program"):
        census.take(dataclasses.replace(plan, graph=None), rules=(), measure_seconds=0)


def test_a_kernel_too_fast_to_time_is_priced_at_most_two_calls_overhead(monkeypatch):
    """A gather of 4 rows from a large table is too fast to time; its roofline (an opaque primitive priced as reading
    every input) is far above that, and the census does not report it as the kernel's time."""
    monkeypatch.setattr(timing, "time_alone", lambda fn, args: None)  # every fused loop and opaque call: too fast

    def rows(table: jnp.ndarray, ids: jnp.ndarray) -> jnp.ndarray:
        return jnp.take(table, ids, axis=0, mode="clip") * 2.0

    found = eqsat.optimize(rows).census(jnp.ones((200_000, 64)), jnp.arange(4))
    bound = timing.too_fast_s()
    assert any(k.roofline_s > 10 * bound for k in found.kernels)  # the table's read, as the roofline prices it
    assert all(k.measured_s is not None and k.measured_s <= bound for k in found.kernels if k.kind != "kernel")


def test_the_plans_own_kernels_are_listed_as_shares_of_the_plan():
    """What eqsat runs, cut and timed as the original is: the depthwise conv's ShiftConv in the conv's place."""
    found = eqsat.optimize(depthwise).census(*_depthwise_args())
    names = [k.name for k in found.plan_kernels]
    assert "ShiftConv" in names and "Conv" not in names and "sort" in names
    shift = _kernel(dataclasses.replace(found, kernels=found.plan_kernels), "ShiftConv")
    assert shift.measured_s == OTHER_S and shift.alternatives == () and not shift.chosen
    assert found.plan_kernels_s == pytest.approx(sum(k.count * k.measured_s for k in found.plan_kernels))
    printed = str(found)
    assert "what eqsat runs, kernel by kernel" in printed and "the plan's" in printed


def test_a_census_saved_before_the_plans_kernels_reads_with_none(tmp_path):
    found = eqsat.optimize(depthwise).census(*_depthwise_args())
    data = {**found.to_dict(), "version": 1}
    del data["plan_kernels"]
    old = census.census_from_dict(data)
    assert old.plan_kernels == [] and old.kernels == found.kernels
    with pytest.raises(ValueError, match="not an eqsat census of version 2 or older"):
        census.census_from_dict({**data, "version": 3})


def test_the_census_times_the_plans_program_apart_from_calls_and_compares_results_once():
    """The plan's program is timed alone, not through calls (whose first validates and times the plan, and whose
    undecided guard would time both programs one call in eight); its results are compared with the original's."""
    fast, args = eqsat.optimize(depthwise, limits=eqsat.Limits(guard_seconds=0.05)), _depthwise_args()
    found = fast.census(*args)
    assert found.plan_s and found.original_s and census._AGREED in found.notes
    assert fast.plan(*args).measured is None  # no call ran: the guard never timed it
    fast(*args)
    assert fast.plan(*args).measured["source"] == "first call"


def test_a_wrong_plan_is_named_by_the_census_and_still_refused_by_the_first_call():
    fast = eqsat.optimize(lambda a, b: jnp.tanh(a + b), rules=['(rewrite (Tanh x) x :name "wrong")'])
    a, b = jnp.full((64,), 0.5), jnp.full((64,), 1.0)
    found = fast.census(a, b)
    assert any(note.startswith("the plan's results differ from the original's: result 0:") for note in found.notes)
    with pytest.warns(eqsat.EqsatWarning, match="wrong"):
        assert jnp.allclose(fast(a, b), jnp.tanh(a + b))


def test_a_plan_loaded_from_the_store_is_keyed_as_one_built_here():
    """Attributes and shapes read back from JSON (lists) or made as named tuples key each kernel as plain tuples do:
    a census of a stored plan finds the kernels the census of the plan as built measured."""
    graph = eqsat.optimize(depthwise).plan(*_depthwise_args()).program()
    as_json = dataclasses.replace(
        graph, nodes=[dataclasses.replace(n, attrs=json.loads(json.dumps(n.attrs, default=str)),
                                          shape=None if n.shape is None else list(n.shape)) for n in graph.nodes]
    )  # fmt: skip
    found = units.units(graph)
    assert any(unit.kind == "fused" for unit in found)
    assert [units.unit_key(as_json, u) for u in found] == [units.unit_key(graph, u) for u in found]


def padded_before_strided_conv(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
    """keras' ZeroPadding2D between an activation and a strided depthwise conv (MobileNet, EfficientNet)."""
    y = jnp.pad(jnp.tanh(x), ((0, 0), (0, 1), (0, 1), (0, 0)))
    dims = ("NHWC", "HWIO", "NHWC")
    return jax.lax.conv_general_dilated(y, w, (2, 2), "VALID", dimension_numbers=dims, feature_group_count=8)


def test_a_zero_pad_runs_in_its_producers_loop_not_as_a_kernel_of_its_own():
    """XLA fuses the pad into the loop that makes its input, as it does elementwise ops; timed alone it would add a
    pass that no kernel of the program spends."""
    found = eqsat.optimize(padded_before_strided_conv).census(*_depthwise_args())
    assert not [k for k in found.kernels if k.name == "pad"]
    loop = _kernel(found, "fused Tanh,convert_element_type,pad")  # jnp.pad converts its int 0 to the dtype
    assert loop.kind == "fused" and loop.detail == "f32[2,16,16,8] i32[] -> f32[2,17,17,8]"
    assert found.opaque_s == 0.0


def test_a_census_of_a_stored_plan_compiles_the_original_once_and_traces_the_plan_once(monkeypatch, caplog):
    """The original that validation compiles in the background is the one the census's calls find compiled; the
    trace that checks a stored plan's result types is the one its program's calls find (a warm census's seconds
    go to timing, not to compiling twice)."""
    monkeypatch.setenv("EQSAT_PLAN_STORE", "on")
    fast, args = eqsat.optimize(depthwise), _depthwise_args()
    fast.plan(*args)
    fast.clear_cache()  # the plan is loaded from the store
    planner.compiling_done()  # the first plan's original, compiled for its validation
    traces = []

    def lower(plan, **kwargs):
        run = planning_lower(plan, **kwargs)
        return lambda *xs: traces.append(len(xs)) or run(*xs)

    planning_lower = planner.lower
    monkeypatch.setattr(planner, "lower", lower)
    jax.config.update("jax_log_compiles", True)  # on every thread: the original compiles on one of eqsat's
    try:
        with caplog.at_level(logging.WARNING, logger="jax"):
            found = fast.census(*args)
    finally:
        jax.config.update("jax_log_compiles", False)
    assert found.plan_s and census._AGREED in found.notes
    messages = [record.getMessage() for record in caplog.records]
    assert sum(m.startswith("Finished XLA compilation of jit(jaxpr_as_fun)") for m in messages) == 1, messages
    assert len(traces) == 1
