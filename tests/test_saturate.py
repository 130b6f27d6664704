"""Saturation in a kept e-graph: the prelude and rules are declared once, and each program, added above a push and
taken off by a pop, saturates as it would in an e-graph of its own."""

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings

import eqsat
from eqsat.capture.jaxpr import capture
from eqsat.egraph import saturate as saturation
from eqsat.egraph.rule_sources import RuleSource, collect
from eqsat.egraph.saturate import Saturation, Snapshot, saturate
from eqsat.tools.generators import programs
from eqsat.tools.program import Program

RULES = collect()
LIMITS = Saturation(iterations=4, seconds=20)


def _graph(prog: Program):
    with jax.enable_x64(prog.dtype.endswith("64")):
        return capture(jax.make_jaxpr(prog)(*[jax.ShapeDtypeStruct(s, prog.dtype) for s in prog.input_shapes]))


def _content(snapshot: Snapshot) -> tuple:
    """What extraction reads, with e-classes named by the original nodes they hold where they hold one."""
    name = {eclass: f"orig{i}" for i, eclass in sorted(snapshot.orig.items(), reverse=True)}
    nodes = sorted((n.op, n.attrs, name.get(n.eclass, "?"), tuple(name.get(c, "?") for c in n.children))
                   for n in snapshot.nodes)  # fmt: skip
    shapes = sorted((name[c], s) for c, s in snapshot.shape.items() if c in name)
    return nodes, shapes, snapshot.stop_reason, snapshot.iterations, snapshot.rule_matches


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(programs(max_steps=5), programs(max_steps=5))
def test_a_program_saturates_after_another_as_it_does_alone(first: Program, second: Program):
    saturation._DECLARED.clear()
    alone = _content(saturate(_graph(second), RULES, LIMITS))  # in a fresh e-graph, which is then kept
    saturate(_graph(first), RULES, LIMITS)
    assert len(saturation._DECLARED[tuple((s.origin, s.text) for s in RULES)]) == 1  # the same e-graph, reused
    assert _content(saturate(_graph(second), RULES, LIMITS)) == alone


def test_an_e_graph_a_conflict_stopped_is_not_kept():
    rules = [RuleSource("collapse", "<test>", '(rewrite (Dot a b) a :name "collapse")')]
    key = (("<test>", rules[0].text),)
    saturation._DECLARED.clear()
    graph = capture(jax.make_jaxpr(lambda a, b: a @ b)(jnp.ones((2, 3)), jnp.ones((3, 4))))
    with pytest.raises(eqsat.ShapeConflictError, match="collapse"):
        saturate(graph, rules, LIMITS)
    assert not saturation._DECLARED.get(key)  # left mid-step: dropped, as were the replays that found the rule
    fine = capture(jax.make_jaxpr(lambda a: a * 2)(jnp.ones((2, 3))))
    assert saturate(fine, rules, LIMITS).stop_reason == "saturated"
    assert len(saturation._DECLARED[key]) == 1


def test_a_kept_e_graph_is_declared_afresh_after_its_share_of_programs():
    # egglog keeps some memory per program that a pop does not give back; a new e-graph frees it
    saturation._DECLARED.clear()
    key = tuple((s.origin, s.text) for s in RULES)
    graph = capture(jax.make_jaxpr(lambda a: a * 2)(jnp.ones((2, 3))))
    saturate(graph, RULES, LIMITS)
    first = saturation._DECLARED[key][0]
    for _ in range(saturation._PROGRAMS_PER_EGRAPH - 1):
        saturate(graph, RULES, LIMITS)
    assert first.programs == saturation._PROGRAMS_PER_EGRAPH and first not in saturation._DECLARED[key]
    saturate(graph, RULES, LIMITS)
    assert saturation._DECLARED[key][0].programs == 1
