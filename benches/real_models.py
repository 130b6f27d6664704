"""Published third-party models (Keras, Hugging Face Flax, Haiku, Equinox) as benchmark workloads.

Every model is built from its library's own code with random weights, so nothing is downloaded at run
time. Each library is imported inside its builder; install them with the optional extra ``models``
(pins in ``benches/real_models_requirements.txt``).
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from benches.models.keras_apps import keras_app
from benches.models.random_init import SEED, init_scope, normal, params_workload, token_ids
from eqsat.support.workload import Workload

# --- Keras 3 (JAX backend) ---------------------------------------------------------------------------


def keras_resnet50() -> Workload:
    return keras_app("keras_resnet50", "ResNet50")


def keras_mobilenetv2() -> Workload:
    return keras_app("keras_mobilenetv2", "MobileNetV2")


def keras_mobilenetv2_batch2() -> Workload:
    """At the batch of the census's acceptance (issue 28): `python -m eqsat census benches.real_models:...`."""
    return keras_app("keras_mobilenetv2_batch2", "MobileNetV2", batch=2)


def keras_efficientnetb0_batch2() -> Workload:
    """At the peers' batch (benches/peers.py), for `python -m benches.rule_ab`."""
    return keras_app("keras_efficientnetb0_batch2", "EfficientNetB0", batch=2)


def keras_mobilenetv3small_batch2() -> Workload:
    """At the peers' batch (benches/peers.py), for `python -m benches.rule_ab`."""
    return keras_app("keras_mobilenetv3small_batch2", "MobileNetV3Small", batch=2)


def keras_mobilenetv2_train() -> Workload:
    """The census's training step (issue 28): value_and_grad of a cross-entropy through MobileNetV2, batch 2."""
    from benches.kernels import workload

    return workload("mobilenetv2_train")


# --- Hugging Face transformers (Flax) ----------------------------------------------------------------


def _hf_flax(name: str, model_cls: str, config_cls: str, seq: int = 128) -> Workload:
    """A transformers Flax model built from a config (random init), last hidden state, batch 1."""
    import transformers

    cfg = getattr(transformers, config_cls)()
    with init_scope():
        model = getattr(transformers, model_cls)(cfg, input_shape=(1, seq), seed=SEED)

    def fn(params: Any, input_ids: jax.Array) -> jax.Array:
        return model(input_ids, params=params, train=False).last_hidden_state

    ids = token_ids(1, seq, cfg.vocab_size)
    return params_workload(name, fn, model.params, ids, f"transformers.{model_cls} seq {seq}")


def flax_bert() -> Workload:
    return _hf_flax("flax_bert", "FlaxBertModel", "BertConfig")  # BERT-base defaults


def flax_gpt2() -> Workload:
    return _hf_flax("flax_gpt2", "FlaxGPT2Model", "GPT2Config")  # GPT-2 small defaults


# --- dm-haiku ----------------------------------------------------------------------------------------


def _haiku(name: str, forward: Callable[[jax.Array, bool], jax.Array], x: jax.Array, note: str) -> Workload:
    """Transform ``forward(x, is_training)`` with state; params and state together are the weights.

    Init runs in training mode so that batch-norm statistics exist; the workload runs in inference mode.
    """
    import haiku as hk

    net = hk.without_apply_rng(hk.transform_with_state(forward))
    with init_scope():
        params = net.init(jax.random.key(SEED), x, True)

    def fn(params: Any, x: jax.Array) -> jax.Array:
        return net.apply(*params, x, False)[0]

    return params_workload(name, fn, params, x, note)


def haiku_resnet50() -> Workload:
    import haiku as hk

    def forward(x: jax.Array, is_training: bool) -> jax.Array:
        return hk.nets.ResNet50(num_classes=1000)(x, is_training=is_training)

    return _haiku("haiku_resnet50", forward, normal((1, 224, 224, 3)), "haiku.nets.ResNet50 224x224")


def haiku_mlp() -> Workload:
    import haiku as hk

    def forward(x: jax.Array, is_training: bool) -> jax.Array:
        del is_training
        return hk.nets.MLP([1024, 1024, 1024, 10])(x)

    return _haiku("haiku_mlp", forward, normal((32, 784)), "haiku.nets.MLP 784-1024x3-10 batch 32")


# --- Equinox -----------------------------------------------------------------------------------------


def _equinox(name: str, model: Any, x: jax.Array, note: str) -> Workload:
    """Split an Equinox module into array leaves (the weights) and static structure; vmap over batch."""
    import equinox as eqx

    params, static = eqx.partition(model, eqx.is_array)

    def fn(params: Any, x: jax.Array) -> jax.Array:
        return jax.vmap(eqx.combine(params, static))(x)

    return params_workload(name, fn, params, x, note)


def equinox_mlp() -> Workload:
    import equinox as eqx

    model = eqx.nn.MLP(784, 10, width_size=1024, depth=3, activation=jax.nn.gelu, key=jax.random.key(SEED))
    return _equinox("equinox_mlp", model, normal((32, 784)), "equinox.nn.MLP 784-1024x3-10 batch 32")


def equinox_cnn() -> Workload:
    import equinox as eqx

    k1, k2, k3 = jax.random.split(jax.random.key(SEED), 3)
    model = eqx.nn.Sequential(
        [
            eqx.nn.Conv2d(1, 32, 3, padding=1, key=k1),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.MaxPool2d(2, stride=2),
            eqx.nn.Conv2d(32, 64, 3, padding=1, key=k2),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.AdaptiveAvgPool2d(1),
            eqx.nn.Lambda(jnp.ravel),
            eqx.nn.Linear(64, 10, key=k3),
        ]
    )
    return _equinox("equinox_cnn", model, normal((16, 1, 28, 28)), "equinox.nn Conv2d/MaxPool2d/Linear batch 16")


REAL_MODELS: dict[str, Callable[[], Workload]] = {
    "keras_resnet50": keras_resnet50,
    "keras_mobilenetv2": keras_mobilenetv2,
    "flax_bert": flax_bert,
    "flax_gpt2": flax_gpt2,
    "haiku_resnet50": haiku_resnet50,
    "haiku_mlp": haiku_mlp,
    "equinox_mlp": equinox_mlp,
    "equinox_cnn": equinox_cnn,
}
