"""ResNeXt-50 (32x4d) for ImageNet, NHWC, batch 1.

Block layout from TASO ``examples/resnext50.py`` / Tensat ``src/resnext50.rs``
(3/4/6/3 bottleneck blocks of widths 128/256/512/1024, 32-group 3x3 convs,
stride on the 3x3). Following the real model (He et al., torchvision) every conv
is followed by inference-form batch norm, the projection shortcut has no ReLU,
and the network ends in global average pooling and a 1000-way classifier.
"""

import jax

from benches.models import layers as L
from eqsat.support.workload import Workload

CONFIGS = {
    "full": {
        "size": 224,
        "stem": 64,
        "widths": (128, 256, 512, 1024),
        "blocks": (3, 4, 6, 3),
        "groups": 32,
        "classes": 1000,
    },
    "small": {
        "size": 32,
        "stem": 8,
        "widths": (8, 16, 32, 64),
        "blocks": (1, 1, 1, 1),
        "groups": 4,
        "classes": 10,
    },
}


def init_block(gen: L.ParamGen, c_in: int, width: int, groups: int, stride: int) -> L.Params:
    p = {
        "c1": gen.conv_bn(1, c_in, width),
        "c2": gen.conv_bn(3, width, width, groups),
        "c3": gen.conv_bn(1, width, 2 * width),
    }
    if stride > 1 or c_in != 2 * width:
        p["proj"] = gen.conv_bn(1, c_in, 2 * width)
    return p


def block(x: jax.Array, p: L.Params, stride: int, groups: int) -> jax.Array:
    t = L.conv_bn(x, p["c1"])
    t = L.conv_bn(t, p["c2"], stride, 1, groups)
    t = L.conv_bn(t, p["c3"], act=False)
    if "proj" in p:
        x = L.conv_bn(x, p["proj"], stride, 0, act=False)
    return L.relu(x + t)


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    params = {"stem": gen.conv_bn(7, 3, c["stem"]), "stages": []}
    strides = []
    c_in = c["stem"]
    for i, (width, n) in enumerate(zip(c["widths"], c["blocks"], strict=True)):
        stage = []
        for j in range(n):
            stride = 2 if i > 0 and j == 0 else 1
            stage.append(init_block(gen, c_in, width, c["groups"], stride))
            strides.append(stride)
            c_in = 2 * width
        params["stages"].append(stage)
    params["fc"] = gen.dense(c_in, c["classes"])
    x = gen.normal((1, c["size"], c["size"], 3))

    def fn(params: L.Params, x: jax.Array) -> jax.Array:
        x = L.conv_bn(x, params["stem"], 2, 3)
        x = L.max_pool(x, 3, 2, 1)
        i = 0
        for stage in params["stages"]:
            for p in stage:
                x = block(x, p, strides[i], c["groups"])
                i += 1
        return L.dense(L.global_avg_pool(x), params["fc"])

    return Workload(f"resnext50-{scale}", fn, gen.materialize((params, x)), (0,), "ResNeXt-50 32x4d with BN")
