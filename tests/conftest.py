import os
import tempfile

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# tests plan with the bundled device profiles, not with one `python -m eqsat calibrate` left in the user's cache
os.environ["EQSAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqsat-test-cache-")


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
    from eqsat.examples import EXAMPLES

    work = EXAMPLES["distributivity"]("small")
    chain = EXAMPLES["matmul_chain"]("small")
    return {
        "cpu": eqsat.optimize(work.fn).plan(*work.args),
        "h100": eqsat.optimize(work.fn, target="h100").plan(*work.args),
        "chain": eqsat.optimize(chain.fn).plan(*chain.args),
    }
