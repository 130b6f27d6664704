"""SqueezeNet 1.1 for 224x224 ImageNet images, NHWC, batch 1.

Structure from Tensat ``model/squeezenet.model`` (the torchvision/ONNX
SqueezeNet 1.1): 3x3/2 stem conv with 64 channels, eight fire modules (1x1
squeeze, then 1x1 and 3x3 expands of the squeezed tensor, concatenated), max
pools after the stem and fires 3 and 5, a 1x1 classifier conv and global average
pool. Convs carry biases and ReLU; there is no batch norm. Dropout is omitted.
"""

import jax

from benches.models import layers as L
from eqsat.support.workload import Workload

# (squeeze, expand) channels of fires 2..9; a max pool precedes fires 2, 4 and 6.
FIRES = ((16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192), (64, 256), (64, 256))
POOL_BEFORE = (0, 2, 4)

CONFIGS = {
    "full": {"size": 224, "stem": 64, "div": 1, "classes": 1000},
    "small": {"size": 32, "stem": 8, "div": 8, "classes": 10},
}


def fire(x: jax.Array, p: L.Params) -> jax.Array:
    s = L.conv_bias(x, p["squeeze"])
    return L.concat_channels([L.conv_bias(s, p["e1"]), L.conv_bias(s, p["e3"], padding=1)])


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    params = {"stem": gen.conv(3, 3, c["stem"], bias=True), "fires": []}
    c_in = c["stem"]
    for sq, ex in FIRES:
        sq, ex = sq // c["div"], ex // c["div"]
        params["fires"].append(
            {
                "squeeze": gen.conv(1, c_in, sq, bias=True),
                "e1": gen.conv(1, sq, ex, bias=True),
                "e3": gen.conv(3, sq, ex, bias=True),
            }
        )
        c_in = 2 * ex
    params["classifier"] = gen.conv(1, c_in, c["classes"], bias=True)
    x = gen.normal((1, c["size"], c["size"], 3))

    def fn(params: L.Params, x: jax.Array) -> jax.Array:
        x = L.conv_bias(x, params["stem"], 2, "VALID")
        for i, p in enumerate(params["fires"]):
            if i in POOL_BEFORE:
                x = L.max_pool(x, 3, 2)
            x = fire(x, p)
        x = L.conv_bias(x, params["classifier"])
        return L.global_avg_pool(x)

    return Workload(f"squeezenet-{scale}", fn, gen.materialize((params, x)), (0,), "SqueezeNet 1.1")
