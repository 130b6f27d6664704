"""VGG-19 for 224x224 ImageNet images, NHWC, batch 1.

Structure from Simonyan & Zisserman (configuration E, as in torchvision
``vgg19``): 16 3x3 convs with bias and ReLU in stages of 2/2/4/4/4 separated by
2x2 max pools, then fully connected 4096 -> 4096 -> 1000. No batch norm, no
dropout (inference).
"""

import jax

from benches.models import layers as L
from eqsat.support.workload import Workload

STAGES = ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4))

CONFIGS = {
    "full": {"size": 224, "div": 1, "fc": 4096, "classes": 1000},
    "small": {"size": 32, "div": 16, "fc": 64, "classes": 10},
}


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    stages = []
    c_in = 3
    for width, n in STAGES:
        stage = []
        for _ in range(n):
            stage.append(gen.conv(3, c_in, width // c["div"], bias=True))
            c_in = width // c["div"]
        stages.append(stage)
    side = c["size"] // 2 ** len(STAGES)
    params = {
        "stages": stages,
        "fc": [
            gen.dense(side * side * c_in, c["fc"]),
            gen.dense(c["fc"], c["fc"]),
            gen.dense(c["fc"], c["classes"]),
        ],
    }
    x = gen.normal((1, c["size"], c["size"], 3))

    def fn(params: L.Params, x: jax.Array) -> jax.Array:
        for stage in params["stages"]:
            for p in stage:
                x = L.conv_bias(x, p, padding=1)
            x = L.max_pool(x, 2, 2)
        x = x.reshape(x.shape[0], -1)
        fc = params["fc"]
        for p in fc[:-1]:
            x = L.relu(L.dense(x, p))
        return L.dense(x, fc[-1])

    return Workload(f"vgg19-{scale}", fn, gen.materialize((params, x)), (0,), "VGG-19, no BN")
