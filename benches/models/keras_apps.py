"""keras.applications models (Keras 3 on its JAX backend) as benchmark workloads, random weights."""

import os
from typing import Any

import jax

from benches.models.random_init import SEED, init_scope, normal, params_workload
from eqsat.support.workload import Workload


def keras_app(name: str, app: str, size: int = 224, batch: int = 1) -> Workload:
    """A ``keras.applications`` model, random init, inference mode."""
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"keras was imported with backend {keras.backend.backend()!r}, need 'jax'")
    keras.utils.set_random_seed(SEED)
    with init_scope():
        model = getattr(keras.applications, app)(weights=None, input_shape=(size, size, 3))
    params = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
    )

    def fn(params: Any, x: jax.Array) -> jax.Array:
        trainable, non_trainable = params
        y, _ = model.stateless_call(trainable, non_trainable, x, training=False)
        return y

    return params_workload(
        name, fn, params, normal((batch, size, size, 3)), f"keras.applications.{app} {size}x{size}, batch {batch}"
    )
