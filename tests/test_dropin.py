"""eqsat.optimize as a drop-in for jax.jit: any caller and transformation, jax.jit's interface, its errors.

The program most tests use, (A @ A) @ v, is one eqsat rewrites (A @ (A @ v)), so the optimized path (plan,
validation, custom_jvp) runs, not only the fallback to the original."""

import functools
import gc
import inspect
import logging
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import eqsat
from eqsat.__main__ import main
from eqsat.extract import changes
from eqsat.planning import planner
from eqsat.plans import plan_json
from eqsat.support import background as eqsat_background

A, V = jnp.linspace(-1, 1, 32 * 32).reshape(32, 32), jnp.linspace(0, 1, 32 * 4).reshape(32, 4)


def chain(a, v):
    return (a @ a) @ v


def _fast(**options):
    """A fresh function each time: plans are shared by the optimize() objects of one function, as jax.jit shares
    traces, and each test here must plan anew."""
    return eqsat.optimize(functools.wraps(chain)(lambda a, v: chain(a, v)), **options)


def _close(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-3, atol=2e-3 * float(np.abs(w).max()))


@pytest.fixture(autouse=True)
def _no_eqsat_warnings():
    """A false mismatch or a failed build would warn and run the original: every test here must do neither."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", eqsat.EqsatWarning)
        yield


def test_the_chain_is_rewritten():
    plan = _fast().plan(A, V)
    assert plan.rewritten_ops() and plan.fallback is None


# the first call of a signature, from each place a jax.jit'd function can be called
CALLERS = {
    "jit": lambda f: jax.jit(f)(A, V),
    "vmap": lambda f: jax.vmap(f, in_axes=(None, 0))(A, jnp.stack([V, V]))[1],
    "grad": lambda f: jax.grad(lambda a: f(a, V).sum())(A),
    "jvp": lambda f: jax.jvp(f, (A, V), (A, V))[1],
    "scan": lambda f: lax.scan(lambda c, _: (f(A, c), None), V, None, length=2)[0],
    "fori_loop": lambda f: lax.fori_loop(0, 2, lambda i, c: f(A, c), V),
    "while_loop": lambda f: lax.while_loop(lambda c: c[1] < 2, lambda c: (f(A, c[0]), c[1] + 1), (V, 0))[0],
    "cond": lambda f: lax.cond(True, lambda v: f(A, v), lambda v: v, V),
    "switch": lambda f: lax.switch(1, [lambda v: v, lambda v: f(A, v)], V),
    "checkpoint": lambda f: jax.checkpoint(f)(A, V),
    "eval_shape": lambda f: jax.eval_shape(f, A, V),
    "disable_jit": lambda f: _under(jax.disable_jit(), lambda: f(A, V)),
    "checking_leaks": lambda f: _under(jax.checking_leaks(), lambda: f(A, V)),
}


def _under(context, thunk):
    with context:
        return thunk()


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_first_call_from_anywhere(caller):
    got, want = CALLERS[caller](_fast()), CALLERS[caller](chain)
    if caller == "eval_shape":
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    else:
        _close(got, want)


def test_closure_over_an_outer_tracer_runs_the_original():
    x = jnp.arange(3.0)
    got = jax.grad(lambda s: eqsat.optimize(lambda y: (y * s).sum())(x))(2.0)
    assert float(got) == 3.0


def test_python_scalar_beside_tracers():
    branches = [lambda vs: [jnp.sin(v) for v in vs]] * 4
    f = eqsat.optimize(lambda i, vs: lax.switch(lax.convert_element_type(i // 1, np.int32), branches, vs))
    x = jnp.arange(3.0)
    out, tangent = jax.jvp(functools.partial(f, 1), ([x, x, x],), ([x, x, x],))
    _close(out[0], jnp.sin(x))
    _close(tangent[0], jnp.cos(x) * x)


def test_donated_arguments_are_validated_before_donation():
    fast = _fast(donate_argnums=1)
    want = chain(A, V)
    got = fast(A, jnp.array(V))
    _close(got, want)
    assert fast.plan(A, V).rewritten_ops() and not fast._calls._unvalidated


def test_donate_argnames_and_static_argnames():
    fast = eqsat.optimize(lambda a, v, act: jnp.tanh(chain(a, v)) if act else chain(a, v), static_argnames="act")
    _close(fast(A, v=V, act=True), jnp.tanh(chain(A, V)))
    _close(fast(A, V, act=False), chain(A, V))
    donating = eqsat.optimize(chain, donate_argnames="v")
    _close(donating(A, v=jnp.array(V)), chain(A, V))


def test_explicit_empty_static_argnames_is_kept():
    """As jax.jit: static_argnums=1 with static_argnames=() makes v static by position only, not by name."""
    fast = eqsat.optimize(lambda a, v: chain(a, v * jnp.ones_like(V)), static_argnums=1, static_argnames=())
    _close(fast(A, 2.0), chain(A, 2.0 * jnp.ones_like(V)))
    _close(fast(A, v=V), chain(A, V))  # traced, not an (unhashable) static value


def test_a_callable_whose_repr_raises():
    class Chain:
        def __call__(self, a, v):
            return chain(a, v)

        def __repr__(self):
            raise ValueError("invalid repr")

    _close(eqsat.optimize(Chain())(A, V), chain(A, V))


@jax.tree_util.register_pytree_node_class
class _Matrices:
    """A pytree that checks its leaves as it is built (jax.jit rebuilds it from tracers, which have a shape)."""

    def __init__(self, a, v):
        if not (hasattr(a, "shape") and hasattr(v, "shape")):
            raise TypeError(f"_Matrices holds arrays, got {type(a).__name__}")
        self.a, self.v = a, v

    def tree_flatten(self):
        return (self.a, self.v), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)


def test_a_pytree_that_inspects_its_leaves_is_planned():
    fast = eqsat.optimize(lambda m: chain(m.a, m.v))
    _close(fast(_Matrices(A, V)), chain(A, V))
    plan = fast.plan(_Matrices(A, V))
    assert plan.rewritten_ops() and plan.fallback is None


def test_keyword_arguments():
    _close(_fast()(A, v=V), chain(A, V))
    _close(_fast()(a=A, v=V), chain(A, V))


@pytest.mark.parametrize("result", [None, (), {}, [None]])
def test_functions_returning_nothing(result):
    assert eqsat.optimize(lambda x: result)(jnp.ones(3)) == result


def test_effects_with_no_outputs_are_kept(capfd):
    def h(x):
        jax.debug.print("first {}", x[0, 0])
        lax.dce_sink(x)
        return chain(x, V)

    _close(eqsat.optimize(h)(A), chain(A, V))
    jax.effects_barrier()
    assert "first -1.0" in capfd.readouterr().out


def test_typed_key_under_grad():
    def f(a, v, key):
        return (chain(a, v) * jax.random.uniform(key)).sum()

    key, fast, a, v = jax.random.key(0), eqsat.optimize(f), jnp.tile(A, (2, 2)), jnp.tile(V, (2, 1))
    _close(jax.grad(lambda a, k: fast(a, v, k))(a, key), jax.grad(f)(a, v, key))
    assert fast.plan(a, v, key).rewritten_ops()  # at 64 x 64 the rewrite pays despite the key's work


def test_cond_under_disable_jit_in_float64():
    def f(a, v):
        return lax.cond(a[0, 0] > 0, lambda: chain(a, v), lambda: chain(a, -v))

    with jax.enable_x64(), jax.disable_jit():
        a, v = A.astype(jnp.float64), V.astype(jnp.float64)
        _close(eqsat.optimize(f)(a, v), f(a, v))


def test_tokens_pass_through():
    token, out = eqsat.optimize(lambda t, a, v: (t, chain(a, v)))(lax.create_token(), A, V)
    _close(out, chain(A, V))
    assert isinstance(token, type(lax.create_token()))


@pytest.mark.parametrize("dtype", [jnp.complex64, jnp.int32])
def test_complex_and_integer_programs_are_optimized_without_a_false_mismatch(dtype):
    a, v = (A * 4).astype(dtype), (V * 4).astype(dtype)
    fast = _fast()
    _close(fast(a, v), chain(a, v))
    assert fast.plan(a, v).fallback is None


def test_pure_callback():
    f = eqsat.optimize(lambda a: chain(jax.pure_callback(np.sin, jax.ShapeDtypeStruct(a.shape, a.dtype), a), V))
    _close(f(A), chain(jnp.sin(A), V))


def test_rewrapping_a_function_plans_it_once(monkeypatch):
    """jax.jit(f)(x) inside a loop or a gradient: the plan is found again, as jax.jit finds its trace."""
    built = []
    real = planner.capture
    monkeypatch.setattr("eqsat.planning.planner.capture", lambda *args: built.append(1) or real(*args))

    def f(a, v):
        return chain(a, v)

    for _ in range(3):
        _close(eqsat.optimize(f)(A, V), chain(A, V))
    assert len(built) == 1
    eqsat.optimize(f, target="h100")(A, V)  # other settings, another plan
    assert len(built) == 2


def test_nested_optimize_keeps_its_own_state():
    inner = eqsat.optimize(jnp.sin)
    outer = eqsat.optimize(jax.grad(inner))
    assert float(outer(3.0)) == pytest.approx(float(jnp.cos(3.0)), rel=1e-6)

    @functools.wraps(inner)
    def wrapper(x):
        return inner(x) * 2

    assert float(eqsat.optimize(wrapper)(3.0)) == pytest.approx(2 * float(jnp.sin(3.0)), rel=1e-6)


def test_static_arguments_are_keyed_by_type_and_value():
    g = eqsat.optimize(lambda k: k, static_argnums=0)
    assert [g(1).dtype, g(True).dtype, g(1.0).dtype] == [jnp.int32, jnp.bool_, jnp.float32]


def test_static_argnums_beyond_the_arguments_passed():
    f = eqsat.optimize(lambda a, v, scale=2.0: chain(a, v) * scale, static_argnums=2)
    _close(f(A, V), chain(A, V) * 2)
    _close(f(A, V, 3.0), chain(A, V) * 3)


def test_ahead_of_time_stages_are_jaxs_own():
    fast = _fast()
    traced = fast.trace(A, V)
    assert isinstance(traced, jax.stages.Traced)
    lowered = fast.lower(jax.ShapeDtypeStruct(A.shape, A.dtype), V)
    assert isinstance(lowered, jax.stages.Lowered) and "dot_general" in lowered.as_text()
    compiled = lowered.compile()
    _close(compiled(A, V), chain(A, V))
    assert compiled.cost_analysis() is not None
    shape = fast.eval_shape(A, V)
    assert (shape.shape, shape.dtype) == ((32, 4), jnp.float32)


def test_the_dispatch_holds_the_program_not_a_nested_jit():
    # a nested jax.jit kept a trace and a lowering of its own for every signature the function met
    for fast in (_fast(), eqsat.optimize(lambda a, v: a + 1.0)):  # a plan, and the original
        eqns = fast.trace(A, V).jaxpr.eqns
        assert eqns and not {e.primitive.name for e in eqns} & {"pjit", "jit"}, eqns


def test_clear_cache_forgets_plans():
    fast = _fast()
    fast(A, V)
    assert fast._calls.cache
    fast.clear_cache()
    assert not fast._calls.cache
    _close(fast(A, V), chain(A, V))


def test_method_decorator():
    class Model:
        def __init__(self, a):
            self.a = a

        def __hash__(self):
            return id(self)

        @functools.partial(eqsat.optimize, static_argnums=0)
        def apply(self, v):
            return chain(self.a, v)

    _close(Model(A).apply(V), chain(A, V))


def test_jax_export_of_the_optimized_program():
    exported = jax.export.export(_fast())(A, V)
    _close(exported.call(A, V), chain(A, V))


def test_jit_options_pass_through():
    device = jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    fast = _fast(in_shardings=(sharding, sharding), out_shardings=sharding, keep_unused=True)
    _close(fast(A, V), chain(A, V))
    unused = eqsat.optimize(lambda a, v: v * 2, keep_unused=True)
    assert len(unused.lower(A, V).compile().input_shardings[0]) == 2
    options = _fast(compiler_options={"xla_cpu_enable_fast_math": False})
    _close(options(A, V), chain(A, V))


def test_arguments_are_not_kept_alive():
    fast = _fast()
    a = jnp.array(A)
    ref = weakref.ref(a)
    fast(a, V)
    del a
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize(
    "error, fun",
    [
        (TypeError, lambda a: (_ for _ in ()).throw(TypeError("mine"))),
        (jax.errors.ConcretizationTypeError, lambda a: jnp.zeros(int(a.sum()))),
        (jax.errors.TracerBoolConversionError, lambda a: a if a.sum() > 0 else -a),
    ],
)
def test_user_errors_keep_their_type(error, fun):
    with pytest.raises(error):
        eqsat.optimize(fun)(A)


def test_argument_checks_raise_what_jax_jit_raises():
    with pytest.raises(TypeError, match="abstract array"):
        _fast()("text", V)
    for options in ({"static_argnums": 5}, {"donate_argnums": 7}, {"params_argnums": 3}):
        with pytest.raises(ValueError):
            _fast(**options)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"disabled_rules": "algebra"}, r"sequence of rule group names"),
        ({"limits": {"iterations": 2}}, r"eqsat\.Limits\("),
        ({"rules": 42}, r"rule file paths or egglog text"),
        ({"rules": ""}, r"empty string"),
        ({"autotune": -1}, r"number of candidate plans"),
        ({"background": "yes"}, r"background takes True or False"),
        ({"validate": "no"}, r"validate takes True or False"),
        ({"memory_budget": "1GB"}, r"memory_budget takes a number of bytes"),
        ({"memory_budget": -5}, r"memory_budget takes a number of bytes"),
    ],
)
def test_wrong_option_values_say_what_was_expected(options, expected):
    with pytest.raises((TypeError, ValueError), match=expected):
        eqsat.optimize(chain, **options)


def test_compare_is_top_level():
    assert eqsat.compare is changes.compare


def test_cli_compare_of_a_missing_or_malformed_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    for path in (tmp_path / "missing.json", bad):
        assert main(["compare", str(path)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(path.name) in err


@pytest.mark.parametrize("flag", ["--iterations", "--seconds"])
def test_cli_zero_limits_mean_zero(flag, tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["optimize", "test_dropin:chain", "--args", "f32[32,32]", "f32[32,4]", "--no-progress", "--json"]
    assert main([*argv, str(out), flag, "0"]) == 0
    plan = plan_json.load_plan(out)
    assert not plan.rewritten_ops() and plan.stop_reason == flag[2:]


WRONG = ['(rewrite (Tanh x) x :name "wrong")']  # unsound: validation must catch it wherever the first call is
BIG = jnp.ones((512, 512)), jnp.full((512, 512), 2.0)


@pytest.mark.parametrize(
    "caller",
    [
        lambda f: jax.jit(f)(*BIG),
        lambda f: jax.vmap(f, in_axes=(None, 0))(BIG[0], BIG[1][None])[0],
        lambda f: f.lower(*BIG).compile()(*BIG),
        lambda f: eqsat.optimize(f.__wrapped__, rules=WRONG, donate_argnums=1)(BIG[0], jnp.array(BIG[1])),
    ],
    ids=["jit", "vmap", "lower", "donated"],
)
def test_a_wrong_plan_is_caught_on_examples_and_the_original_runs(caller):
    fast = eqsat.optimize(lambda a, b: jnp.tanh(a + b), rules=WRONG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", eqsat.EqsatWarning)
        _close(caller(fast), jnp.tanh(BIG[0] + BIG[1]))
    assert any("wrong" in str(w.message) for w in caught)


def test_the_function_is_not_kept_alive():
    def local(a, v):
        return chain(a, v)

    fast = eqsat.optimize(local)
    fast(A, V)
    ref = weakref.ref(local)
    del local, fast
    gc.collect()
    assert ref() is None


def test_a_failure_of_eqsats_own_machinery_warns_and_runs_the_original(monkeypatch):
    def broken(*_):
        raise RuntimeError("saturation broke")

    monkeypatch.setattr("eqsat.planning.planner.saturate", broken)
    fast = _fast()
    with pytest.warns(eqsat.EqsatWarning, match="could not plan chain.*saturation broke"):
        _close(fast(A, V), chain(A, V))
    assert "saturation broke" in fast.plan(A, V).fallback


@pytest.mark.parametrize("background", [False, True])
def test_dropping_the_optimized_frees_what_the_function_closes_over_without_gc(background):
    """Also while its plan waits for the planning thread (held here by a pause): the job holds it weakly."""
    x = jnp.ones((8, 8))
    f = (lambda x: lambda a: (a @ x) @ x)(x)
    g = eqsat.optimize(f, background=background)
    x = weakref.ref(x)
    eqsat_background.pause()
    try:
        g(A[:8, :8])
        del f
        assert x() is not None
        g(A[:8, :8])
        del g  # no cycle: freed by reference counting, as a jax.jit object is
        assert x() is None
    finally:
        eqsat_background.resume()


def test_wrapped_attributes_and_callables_jax_jit_accepts_or_refuses():
    def f(x: int) -> int:
        """docstring of f."""
        return x + 1

    f.some_value = 4
    fast = eqsat.optimize(f)
    assert (fast.__doc__, fast.__name__, fast.some_value) == (f.__doc__, "f", 4)
    assert fast.__annotations__ == f.__annotations__
    with pytest.raises(jax.errors.ConcretizationTypeError):  # jax.jit's error: a builtin without a signature
        eqsat.optimize(int)(jnp.int32(3))

    def gen(x):
        yield x

    with pytest.raises(TypeError, match="generator function"):
        eqsat.optimize(gen)
    with pytest.raises(TypeError, match="staticmethod"):
        eqsat.optimize(staticmethod(f))
    with pytest.raises(TypeError, match="Expected a callable value"):
        eqsat.optimize(3)


def test_a_cond_whose_branches_do_not_change_is_not_counted_as_rewritten():
    """The original then runs, as jax.jit would run it (a re-planned copy also kept its constants alive)."""
    data = jnp.ones(8)
    plan = eqsat.optimize(lambda p: lax.cond(p, jax.jit(lambda: data[0]), lambda: data[1])).plan(True)
    assert plan.unchanged and not plan.stats.get("bodies_rewritten")


@pytest.mark.parametrize("background", [False, True])
def test_a_call_explains_its_cache_miss_once_at_the_users_line(background, caplog):
    def f(x, a, b):
        return x @ a + x @ b  # a plan that rewrites: capture, planning and validation all trace

    fast = eqsat.optimize(f, background=background)
    x = jnp.ones((16, 16))
    with jax.explain_cache_misses(True), caplog.at_level(logging.WARNING):
        fast(x, x, x)
        line = inspect.currentframe().f_lineno - 1
        fast.plan(x, x, x)  # built (in the background, or by the call), validated and timed
        fast(x, x, x)
        fast(x[:8], x, x)
        resized = inspect.currentframe().f_lineno - 1
    misses = [r.getMessage() for r in caplog.records if "CACHE MISS" in r.getMessage()]
    assert len(misses) == 2, misses
    assert f"{__file__}:{line}:" in misses[0] and "never seen function" in misses[0], misses[0]
    assert f"{__file__}:{resized}:" in misses[1] and "f32[8,16]" in misses[1], misses[1]
