import json
import os
import tempfile

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# tests plan with the bundled device profiles, not with one `python -m eqsat calibrate` left in the user's cache
os.environ["EQSAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqsat-test-cache-")
# plans are kept unmeasured (eqsat/numerics/guard.py): timing on a loaded CI machine would make tests depend on its
# load; tests/test_guard.py sets the budget itself
os.environ["EQSAT_GUARD_SECONDS"] = "0"
# a first call plans (not the planning thread, eqsat/support/background.py): which program a call runs must not depend
# on how fast the machine plans; tests/test_background.py builds plans in the background itself
os.environ["EQSAT_BACKGROUND"] = "0"


def _unmeasured() -> object:
    """Limits under which a plan does not follow the machine's load: kernels priced by roofline (not timed),
    saturation bounded by iterations, not by the clock."""
    import eqsat

    return eqsat.Limits(seconds=300, measure_seconds=0)


@pytest.fixture(scope="session")
def bert_small_plans() -> dict:
    """The small BERT benchmark (2 layers) planned for cpu and for h100 with its weights prepared, as
    `python -m eqsat optimize --bench bert --scale small [--target h100] --params-argnums 0` plans it."""
    import eqsat
    from benches.models.registry import MODELS

    work = MODELS["bert"]("small")
    plans = {}
    for target in ("cpu", "h100"):  # greedy: the ILP's time budget would make plans follow the load too
        fast = eqsat.optimize(
            work.fn, target=target, params_argnums=0, validate=False, limits=_unmeasured(), extractor="greedy"
        )
        plans[target] = fast.plan(*work.args)
    return plans


@pytest.fixture(scope="session")
def plans() -> dict:
    """x@W1 + x@W2 planned for cpu and h100, and the matmul chain for cpu (the bundled examples, small)."""
    import eqsat
    from eqsat.tools.examples import EXAMPLES

    work = EXAMPLES["distributivity"]("small")
    chain = EXAMPLES["matmul_chain"]("small")
    return {
        "cpu": eqsat.optimize(work.fn).plan(*work.args),
        "h100": eqsat.optimize(work.fn, target="h100").plan(*work.args),
        "chain": eqsat.optimize(chain.fn).plan(*chain.args),
    }


# each test plans afresh (tests that keep plans across processes switch the store on themselves)
os.environ["EQSAT_PLAN_STORE"] = "off"


@pytest.fixture
def decide_timings(tmp_path, monkeypatch):
    """An empty timing cache in tmp_path, and decide(alternatives_win): every kernel the cache then holds priced so
    that each alternative implementation is far faster (or far slower) than its rival, in this process and in the
    file. Which rival wins on a loaded machine is load's call; tests of what a plan does with a decision use this.
    Returns the ops the cache prices."""
    from eqsat.extract import timing  # here, not at the top: jax must not start before XLA_FLAGS is set
    from eqsat.ops.table import OPS

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))

    def decide(alternatives_win: bool = True) -> set[str]:
        cache = timing.cache_for(timing.local_device())
        alternative_seconds = 1e-6 if alternatives_win else 1.0
        with cache.lock:
            ops = {key: json.loads(key)[0] for key in cache.entries}
            cache.entries = {key: alternative_seconds if OPS[op].alternative else 1e-3 for key, op in ops.items()}
        cache.save()
        return set(ops.values())

    return decide
