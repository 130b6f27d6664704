"""Plans built in the background (eqsat/support/background.py): a signature's first call runs jax.jit's program while
its plan is built, validated and timed beside it, and a later call switches to the plan.

Tests elsewhere plan in the first call (tests/conftest.py sets EQSAT_BACKGROUND=0); these ask for background=True."""

import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.dispatch.dispatcher import Dispatcher

X = jnp.arange(12.0).reshape(3, 4) / 10
W1, W2 = jnp.ones((4, 5)), jnp.full((4, 5), 0.5)


def _program():
    """A function of its own (plans are shared by every optimize() of one function): x@w1 + x@w2, which
    distributivity rewrites to x @ (w1 + w2)."""

    def shared_operand(x, w1, w2):
        return x @ w1 + x @ w2

    return shared_operand


def _entry(fast):
    (entry,) = fast._calls.cache.values()
    return entry


def test_the_first_call_runs_jax_jits_program_and_a_later_call_the_validated_plan():
    program = _program()
    fast = eqsat.optimize(program, background=True)
    first = fast(X, W1, W2)
    np.testing.assert_array_equal(first, jax.jit(program)(X, W1, W2))  # the original program, exactly
    pending = _entry(fast)
    assert pending.job is not None and pending.running is pending.original
    plan = fast.plan(X, W1, W2)  # waits for the job
    assert plan.rewritten_ops() and fast.cache_info()["planning"] == 0
    entry = _entry(fast)
    assert not entry.unvalidated and entry.running is not entry.original and entry.job is None
    warm = fast._calls._warm  # the plan compiled in a dispatch of its own, on the first call's arguments
    assert warm is not None and entry.traced
    np.testing.assert_allclose(fast(X, W1, W2), first, rtol=1e-6)
    assert fast._calls.dispatch is warm  # the call switched to it: nothing traced or compiled in the call


def test_a_settled_signature_is_called_through_jax_jits_dispatch_alone(monkeypatch):
    fast = eqsat.optimize(_program(), background=True)
    fast(X, W1, W2)
    fast.plan(X, W1, W2)
    fast(X, W1, W2)  # switches to the plan and settles
    slow, finished = [], []
    calls = fast._calls
    monkeypatch.setattr(calls, "call", lambda *a: slow.append(a) or Dispatcher.call(calls, *a))
    monkeypatch.setattr(calls, "finish", lambda *a, **k: finished.append(a) or Dispatcher.finish(calls, *a, **k))
    for _ in range(5):
        np.testing.assert_allclose(fast(X, W1, W2), X @ (W1 + W2), rtol=1e-6)
    assert not slow and not finished  # nothing but jax.jit's call
    x = jnp.ones((7, 4))  # a new signature: its trace moves the epoch, and the call settles what it built
    np.testing.assert_allclose(fast(x, W1, W2), x @ (W1 + W2), rtol=1e-6)
    assert finished and fast.plan(x, W1, W2).rewritten_ops()


def test_a_wrong_plan_found_in_the_background_warns_and_the_original_keeps_running():
    fast = eqsat.optimize(lambda a, b: jnp.tanh(a + b), rules=['(rewrite (Tanh x) x :name "wrong")'], background=True)
    a, b = jnp.ones((64, 64)), jnp.full((64, 64), 2.0)
    expected = jnp.tanh(a + b)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", eqsat.EqsatWarning)
        np.testing.assert_allclose(fast(a, b), expected, rtol=1e-6)
        fast.plan(a, b)
        for _ in range(2):
            np.testing.assert_allclose(fast(a, b), expected, rtol=1e-6)
    assert any("wrong" in str(w.message) for w in caught)
    entry = _entry(fast)
    assert entry.mismatched and entry.running is entry.original


@pytest.mark.parametrize(
    "caller",
    [
        lambda f: jax.jit(f)(X, W1, W2),
        lambda f: jax.grad(lambda x: f(x, W1, W2).sum())(X),
        lambda f: f.lower(X, W1, W2).compile()(X, W1, W2),
    ],
    ids=["jit", "grad", "lower"],
)
def test_what_a_caller_keeps_is_traced_with_the_plan(caller):
    """An outer jax.jit, a gradient or an ahead-of-time lowering keeps its trace: the plan is waited for."""
    fast = eqsat.optimize(_program(), background=True)
    caller(fast)
    entry = _entry(fast)
    assert entry.job is None and entry.plan.rewritten_ops() and not entry.unvalidated


def test_forgetting_plans_while_one_is_built_is_harmless():
    program = _program()
    fast = eqsat.optimize(program, background=True)
    expected = jax.jit(program)(X, W1, W2)
    fast(X, W1, W2)
    job = _entry(fast).job
    fast.clear_cache()
    job.exception()  # waits: the plan is built, or dropped (Stopped) once its pending entry is forgotten
    for _ in range(2):
        np.testing.assert_allclose(fast(X, W1, W2), expected, rtol=1e-6)
    assert fast.plan(X, W1, W2).rewritten_ops()


def test_a_process_exits_without_waiting_for_the_plan_being_built(tmp_path):
    """Planning stops at its next progress event once the process exits: here a saturation that would take a
    minute, stopped within seconds, the job ended with Stopped."""
    script = textwrap.dedent(
        """
        import atexit, time
        import jax.numpy as jnp
        jobs = []
        atexit.register(lambda: print("job:", type(jobs[0].exception(timeout=0)).__name__ if jobs else None))
        import eqsat
        from eqsat.planning import planner
        from eqsat.support import progress

        def slow_saturate(*args, **kwargs):
            for k in range(600):
                progress.step("saturate", "slow", k)
                time.sleep(0.1)
            raise AssertionError("not stopped")

        planner.saturate = slow_saturate
        fast = eqsat.optimize(lambda x: jnp.tanh(x) * 2, background=True)
        print("result:", float(fast(jnp.ones(3)).sum()))
        (entry,) = fast._calls.cache.values()
        jobs.append(entry.job)
        """
    )
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=_env(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert "result: 4.56" in done.stdout and "job: Stopped" in done.stdout, done.stdout
    assert time.perf_counter() - start < 45  # the saturation alone would take 60 s


def test_a_process_that_exits_while_a_plan_compiles_its_reference_prints_no_warning(tmp_path):
    """The process exits just as the plan being built hands its reference compile to another thread: threading's
    exit hooks have begun, which refuse new threads and futures; the plan is dropped without a warning."""
    script = textwrap.dedent(
        """
        import threading, time
        import jax.numpy as jnp
        import eqsat
        from eqsat.planning import planner

        reached, exiting = threading.Event(), threading.Event()
        threading._register_atexit(exiting.set)  # registered last: the first exit hook to run
        compiler = planner._COMPILER

        class AtExit:  # hands the reference compile over once the process has begun to exit
            def submit(self, *args):
                reached.set()
                exiting.wait()
                time.sleep(1.0)
                return compiler.submit(*args)

        planner._COMPILER = AtExit()
        fast = eqsat.optimize(lambda x, w1, w2: x @ w1 + x @ w2, background=True)
        print("result:", float(fast(jnp.ones((3, 4)), jnp.ones((4, 5)), jnp.ones((4, 5))).sum()))
        assert reached.wait(60)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=_env(tmp_path)
    )
    assert done.returncode == 0 and "result: 120.0" in done.stdout, done.stderr
    assert "EqsatWarning" not in done.stderr and "could not plan" not in done.stderr, done.stderr


def _env(tmp_path):
    import os

    return {**os.environ, "EQSAT_CACHE_DIR": str(tmp_path)}
