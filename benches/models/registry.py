"""Short name -> ``build(scale)`` for every benchmark model."""

from collections.abc import Callable

from benches.models import (
    bert,
    decoder_block,
    inception_v3,
    nasnet_a,
    nasrnn,
    resnext50,
    squeezenet,
    train_step,
    vgg19,
)
from eqsat.support.workload import Workload

MODELS: dict[str, Callable[[str], Workload]] = {
    "bert": bert.build,
    "nasrnn": nasrnn.build,
    "resnext50": resnext50.build,
    "nasnet_a": nasnet_a.build,
    "inception_v3": inception_v3.build,
    "squeezenet": squeezenet.build,
    "vgg19": vgg19.build,
    "decoder_block": decoder_block.build,
    "train_step": train_step.build,
}
