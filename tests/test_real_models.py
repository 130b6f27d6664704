"""The third-party models in ``benches/real_models.py`` build with random weights, jit, run, stay finite."""

import os

import jax
import numpy as np
import pytest

from benches.real_models import REAL_MODELS

pytestmark = pytest.mark.models

# importorskip imports keras, which fixes its backend on first import.
os.environ["KERAS_BACKEND"] = "jax"

# The modules each model family needs, by name prefix.
LIBRARIES = {
    "keras": ("keras",),
    "flax": ("flax", "transformers"),
    "haiku": ("haiku",),
    "equinox": ("equinox",),
}

EXPECTED_OUT = {
    "keras_resnet50": (1, 1000),
    "keras_mobilenetv2": (1, 1000),
    "flax_bert": (1, 128, 768),
    "flax_gpt2": (1, 128, 768),
    "haiku_resnet50": (1, 1000),
    "haiku_mlp": (32, 10),
    "equinox_mlp": (32, 10),
    "equinox_cnn": (16, 10),
}


def test_registry_names() -> None:
    assert set(REAL_MODELS) == set(EXPECTED_OUT)


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_runs(name: str) -> None:
    for module in LIBRARIES[name.split("_")[0]]:
        pytest.importorskip(module)
    w = REAL_MODELS[name]()
    assert w.name == name
    assert w.params_argnums == (0,)
    out = jax.jit(w.fn)(*w.args)
    assert out.shape == EXPECTED_OUT[name]
    assert np.isfinite(np.asarray(out)).all()
