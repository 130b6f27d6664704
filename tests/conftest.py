import json
import os
import tempfile

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# tests plan with the bundled device profiles, not with one `python -m eqsat calibrate` left in the user's cache
os.environ["EQSAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqsat-test-cache-")
# plans are kept unmeasured (eqsat/guard.py): timing on a loaded CI machine would make tests depend on its load;
# tests/test_guard.py sets the budget itself
os.environ["EQSAT_GUARD_SECONDS"] = "0"


@pytest.fixture
def decide_timings(tmp_path, monkeypatch):
    """An empty timing cache in tmp_path, and decide(alternatives_win): every kernel the cache then holds priced so
    that each alternative implementation is far faster (or far slower) than its rival, in this process and in the
    file. Which rival wins on a loaded machine is load's call; tests of what a plan does with a decision use this.
    Returns the ops the cache prices."""
    from eqsat.extract import timing  # here, not at the top: jax must not start before XLA_FLAGS is set
    from eqsat.ops import OPS

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
