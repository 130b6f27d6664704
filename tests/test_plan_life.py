"""A plan's life (eqsat/plans/plan_life.py): real plans driven through every transition, and no transition but the
table's."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.numerics import guard
from eqsat.plans.plan_life import TRANSITIONS, Entry, Event, IllegalTransition, State, diagram

E, S = Event, State
# the life as the architecture page draws it: a change here is a change of the design
LIFE = {
    (S.NEW, E.PENDING): S.BUILDING,
    (S.NEW, E.PLANNED): S.BUILT,
    (S.NEW, E.LOADED): S.BUILT,
    (S.NEW, E.UNPLANNED): S.ORIGINAL,
    (S.BUILT, E.TRUSTED): S.KEPT,
    (S.BUILT, E.STORED): S.BUILT,
    (S.ORIGINAL, E.STORED): S.ORIGINAL,
    (S.BUILT, E.VALIDATED): S.VALIDATED,
    (S.BUILT, E.MISMATCHED): S.ORIGINAL,
    (S.BUILT, E.REPLANNED): S.BUILT,
    (S.VALIDATED, E.UNMERGED): S.VALIDATED,
    (S.VALIDATED, E.FELL_BACK): S.ORIGINAL,
    (S.VALIDATED, E.KEPT): S.KEPT,
    (S.VALIDATED, E.SLOWER): S.ORIGINAL,
    (S.VALIDATED, E.LEANING): S.TRIAL,
    (S.VALIDATED, E.UNDECIDED): S.MEASURING,
    (S.TRIAL, E.KEPT): S.KEPT,
    (S.TRIAL, E.SLOWER): S.ORIGINAL,
    (S.MEASURING, E.KEPT): S.KEPT,
    (S.MEASURING, E.SLOWER): S.ORIGINAL,
    (S.BUILT, E.REFITTED): S.BUILT,
    (S.KEPT, E.REFITTED): S.KEPT,
    (S.ORIGINAL, E.REFITTED): S.KEPT,
    (S.BUILDING, E.LANDED): S.CLEARED,
    **{(s, E.CLEARED): S.CLEARED for s in S if s is not S.NEW},
}


def _chain(a, b, v):
    return (a @ b) @ v  # re-associated: a @ (b @ v)


def _args():
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in [(48, 48), (48, 48), (48, 2)]]


def _entries(fast) -> list[Entry]:
    return list(fast._calls.cache.values())


def _life(fast) -> tuple[State, list[Event]]:
    (entry,) = _entries(fast)
    return entry.state, entry.history


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQSAT_PLAN_STORE", "on")


def test_the_life_has_these_transitions_and_no_other():
    assert TRANSITIONS == LIFE
    for state in State:
        for event in Event:
            entry = Entry(None, None, None, None, state=state)
            if (state, event) in LIFE:
                assert entry.move(event).state is LIFE[state, event]
            else:
                with pytest.raises(IllegalTransition, match=f"a plan {state.value} cannot be {event.value}"):
                    entry.move(event)
                assert entry.state is state and entry.history == []


def test_built_stored_validated_kept_then_loaded_and_cleared(store):
    args = _args()
    fast = eqsat.optimize(lambda *a: _chain(*a))
    np.testing.assert_allclose(fast(*args), _chain(*args), rtol=2e-3, atol=1e-4)
    assert _life(fast) == (S.KEPT, [E.PLANNED, E.STORED, E.VALIDATED, E.KEPT])
    (entry,) = _entries(fast)
    assert entry.running is entry.plan_program and entry.plan.rewritten_ops()
    fast.clear_cache()
    assert entry.state is S.CLEARED and entry.history[-1] is E.CLEARED
    fast(*args)  # as a new process finds it: from the store, compared again before it counts
    assert _life(fast) == (S.KEPT, [E.LOADED, E.VALIDATED, E.KEPT])


def test_mismatched_and_the_refusal_stored(store, recwarn):
    wrong = '(rewrite (Tanh x) x :name "wrong-tanh")'  # tanh(x) is not x
    fast = eqsat.optimize(lambda x: jnp.tanh(x) * 2.0, rules=wrong)
    x = jnp.linspace(-3.0, 3.0, 64)
    np.testing.assert_allclose(fast(x), jnp.tanh(x) * 2.0, rtol=1e-6)
    assert _life(fast) == (S.ORIGINAL, [E.PLANNED, E.STORED, E.MISMATCHED, E.STORED])
    (entry,) = _entries(fast)
    assert entry.running is entry.original and entry.mismatched and "wrong-tanh" in entry.plan.fallback


def test_slower_falls_back(monkeypatch):
    def measured_slower(original, optimized, seconds, warm=False, predicted=1.0, across=None):
        return {
            **{"ratio": 0.5, "ratio_low": 0.4, "ratio_high": 0.6, "rounds": 9, "faster_rounds": 0},
            **{"decision": "slower", "confidence": 0.998, "predicted": predicted, "kept": False},
            **{"original_s": 1e-4, "optimized_s": 2e-4},
        }

    monkeypatch.setattr(guard, "measure", measured_slower)
    args = _args()
    fast = eqsat.optimize(lambda *a: _chain(*a), limits=eqsat.Limits(guard_seconds=0.05))
    fast(*args)
    assert _life(fast) == (S.ORIGINAL, [E.PLANNED, E.VALIDATED, E.SLOWER])
    (entry,) = _entries(fast)
    assert entry.running is entry.original and not entry.mismatched and entry.plan.measured["decision"] == "slower"


def test_trusted_unplanned_and_built_in_the_background():
    args = _args()
    trusted = eqsat.optimize(lambda *a: _chain(*a), validate=False)
    trusted(*args)
    assert _life(trusted) == (S.KEPT, [E.PLANNED, E.TRUSTED])
    plain = eqsat.optimize(lambda x: x + 1.0)
    plain(jnp.ones(4))
    assert _life(plain) == (S.ORIGINAL, [E.UNPLANNED])
    tiered = eqsat.optimize(lambda *a: _chain(*a), background=True)
    tiered(*args)
    (pending,) = _entries(tiered)
    tiered.plan(*args)  # waits for the background job
    tiered(*args)
    assert pending.history == [E.PENDING, E.LANDED] and pending.state is S.CLEARED
    assert _life(tiered) == (S.KEPT, [E.PLANNED, E.VALIDATED, E.KEPT])


def test_planning_moves_no_entry_the_dispatcher_gives_it_its_first_state():
    """Issue 44 item 1: planning returns an entry still new, with the events of its first state; the dispatcher
    applies them as it takes the entry."""
    args = _args()
    fast = eqsat.optimize(lambda *a: _chain(*a), background=False)
    calls = fast._calls
    _, signature = calls.signature(tuple(args), {})
    new = calls.planner.build(signature, False)
    assert new.entry.state is S.NEW and new.entry.history == [] and new.events == (E.PLANNED,)
    assert new.becomes is S.BUILT and new.runs_plan
    plain = eqsat.optimize(lambda x: x + 1.0)._calls
    unplanned = plain.planner.build(plain.signature((jnp.ones(4),), {})[1], False)
    assert unplanned.entry.state is S.NEW and unplanned.becomes is S.ORIGINAL and not unplanned.runs_plan
    fast(*args)  # the dispatcher's entry went through its first state
    assert _life(fast) == (S.KEPT, [E.PLANNED, E.VALIDATED, E.KEPT])


def test_an_illegal_transition_names_the_state_and_event():
    entry = Entry(None, None, None, None).move(E.UNPLANNED)
    with pytest.raises(IllegalTransition, match="a plan original cannot be validated"):
        entry.move(E.VALIDATED)
    assert jax.tree_util.tree_leaves(entry.history) == [E.UNPLANNED]


def test_the_shared_index_of_states_follows_the_entries_own_moves():
    """Issue 44 item 1: the set of unvalidated entries and of those timed on live calls are kept by the entries'
    moves (SharedPlans.track), not by hand beside them: each matches the cached entries' states at every step."""
    args = _args()
    fast = eqsat.optimize(lambda *a: _chain(*a), background=False)
    plans = fast._calls.plans

    def index_matches() -> bool:
        entries = list(plans.entries.values())
        built = {id(e) for e in entries if e.state is S.BUILT}
        live = {id(e) for e in entries if e.undecided and not e.prepared}
        return plans.unchecked == built and plans.measuring == live

    traced = fast.lower(*args)  # a trace builds the plan and settles it
    assert traced is not None and index_matches()
    (entry,) = _entries(fast)
    fresh = Entry(entry.signature, entry.plan, entry.original, entry.out_tree, entry.plan_program)
    fresh.move(E.PLANNED)
    plans.track(fresh)
    assert id(fresh) in plans.unchecked
    fresh.move(E.VALIDATED, E.UNDECIDED)
    assert id(fresh) not in plans.unchecked and id(fresh) in plans.measuring
    fresh.move(E.KEPT)
    assert id(fresh) not in plans.measuring
    fast.clear_cache()
    assert not plans.unchecked and not plans.measuring and index_matches()


def test_the_architecture_page_draws_the_table():
    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    assert f"```mermaid\n{diagram()}\n```" in page, (
        "regenerate the diagram: python -c 'from eqsat.plans.plan_life import diagram; print(diagram())'"
    )
