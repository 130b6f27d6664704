"""The benchmark models in ``benches/models`` build, jit, run and give finite outputs."""

import jax
import numpy as np
import pytest

import eqsat
from benches.models.registry import MODELS
from eqsat.support.workload import Workload

# Output shapes at scale="small" (train_step is checked separately).
SMALL_OUT = {
    "bert": (8, 32),
    "nasrnn": (1, 16),
    "resnext50": (1, 10),
    "nasnet_a": (1, 1, 1, 320),
    "inception_v3": (1, 10),
    "squeezenet": (1, 10),
    "vgg19": (1, 10),
    "decoder_block": (8, 32),
}

FULL_OUT = {
    "bert": (64, 1024),
    "nasrnn": (1, 512),
    "resnext50": (1, 1000),
    "nasnet_a": (1, 7, 7, 5120),
    "inception_v3": (1, 1000),
    "squeezenet": (1, 1000),
    "vgg19": (1, 1000),
    "decoder_block": (128, 1024),
}


def _finite(tree) -> bool:
    return all(bool(np.isfinite(np.asarray(leaf)).all()) for leaf in jax.tree.leaves(tree))


def test_registry_names():
    assert set(MODELS) == {*SMALL_OUT, "train_step"}


@pytest.mark.parametrize("name", sorted(SMALL_OUT))
def test_small_model_runs(name: str):
    w = MODELS[name]("small")
    assert isinstance(w, Workload) and w.params_argnums == (0,)
    out = jax.jit(w.fn)(*w.args)
    assert out.shape == SMALL_OUT[name]
    assert out.dtype == np.float32
    assert _finite(out)


def test_small_train_step():
    w = MODELS["train_step"]("small")
    params = w.args[0]
    loss, grads = jax.jit(w.fn)(*w.args)
    assert loss.shape == () and _finite(loss) and float(loss) > 0.0
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert all(g.shape == p.shape for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(params), strict=True))
    assert _finite(grads)


def test_bad_scale():
    with pytest.raises(ValueError):
        MODELS["bert"]("huge")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_full_model_traces(name: str):
    w = MODELS[name]("full")
    out = jax.eval_shape(w.fn, *w.args)
    if name == "train_step":
        loss, grads = out
        assert loss.shape == ()
        assert jax.tree.structure(grads) == jax.tree.structure(w.args[0])
    else:
        assert out.shape == FULL_OUT[name]


def test_markdown_tables_of_a_run():
    from benches.run import markdown

    row = {
        "model": "m",
        "ops": 3,
        "enodes": 7,
        "optimize_s": 0.1234,
        "predicted_speedup": 1.5,
        "measured_speedup": 1.25,
        "measured_iqr": [1.2, 1.3],
        "jit_ms": 2.0,
        "eqsat_ms": 1.6,
        "peak_bytes_before": 2**20,
        "peak_bytes_after": 2**21,
        "rewritten_ops": {"Dot": 2, "Concat": 1},
        "roofline_ms_by_class": {"elementwise": 0.1, "contraction": 1.2},
        "roofline_fraction": 0.81,
    }
    text = markdown([row])
    assert "| m | 3 | 7 | 0.12 | 1.50x | **1.25x** [1.20-1.30] | 2.0 | 1.0 -> 2.0 | Concat 1, Dot 2 |" in text
    assert "| m | contraction 1.20, elementwise 0.10 | 1.60 | 0.81 |" in text


@pytest.mark.parametrize("name", sorted(MODELS))
def test_plans_need_no_typecheck_bans(name: str):
    # the shape rules accept what the lowerings accept (tests/test_shapes.py), so extraction never picks a node
    # that its type check must ban
    w = MODELS[name]("small")
    plan = eqsat.optimize(w.fn, params_argnums=w.params_argnums).plan(*w.args)
    assert plan.fallback is None and plan.extraction.typecheck_bans == 0
