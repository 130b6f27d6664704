"""Inception-v3 for 299x299 ImageNet images, NHWC, batch 1.

Module layout from TASO ``examples/inceptionv3.py`` / Tensat
``src/inceptionv3.rs`` (the torchvision network): stem, 3x A, B, 4x C, D, 2x E,
global average pool. Each conv is conv -> batch norm -> ReLU as in torchvision's
``BasicConv2d`` (TASO fuses only the ReLU); a 1000-way classifier follows the
pool as in the real model. Sibling 1x1 convs reading the same input feed each
module's concat.
"""

import jax
import jax.numpy as jnp

from benches.models import layers as L
from eqsat.support.workload import Workload

CONFIGS = {
    "full": {"size": 299, "div": 1, "a": 3, "c": 4, "e": 2, "classes": 1000},
    "small": {"size": 75, "div": 16, "a": 1, "c": 1, "e": 1, "classes": 10},
}

Kernel = int | tuple[int, int]


class Net:
    """Runs the module wiring either to record conv shapes or to apply parameters.

    With ``params=None`` (used under ``jax.eval_shape``) each conv records its
    (kernel, c_in, c_out) and applies a dummy zero kernel; otherwise it applies
    the next parameter set. One wiring thus serves initialisation and forward.
    """

    def __init__(self, params: list[L.Params] | None, div: int) -> None:
        self.params, self.div = params, div
        self.specs: list[tuple[Kernel, int, int]] = []

    def ch(self, n: int) -> int:
        return max(1, n // self.div)

    def conv(self, x: jax.Array, c_out: int, kernel: Kernel = 1, stride: int = 1, padding: L.Padding = 0) -> jax.Array:
        spec = (kernel, x.shape[-1], self.ch(c_out))
        i = len(self.specs)
        self.specs.append(spec)
        if self.params is None:
            kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
            w = jnp.zeros((kh, kw, spec[1], spec[2]), x.dtype)
            bn = {"scale": jnp.ones(spec[2]), "shift": jnp.zeros(spec[2])}
            p = {"conv": {"w": w}, "bn": bn}
        else:
            p = self.params[i]
        return L.conv_bn(x, p, stride, padding)


def front(n: Net, x: jax.Array) -> jax.Array:
    x = n.conv(x, 32, 3, 2)
    x = n.conv(x, 32, 3)
    x = n.conv(x, 64, 3, padding=1)
    x = L.max_pool(x, 3, 2)
    x = n.conv(x, 80, 1)
    x = n.conv(x, 192, 3)
    return L.max_pool(x, 3, 2)


def inception_a(n: Net, x: jax.Array, pool_features: int) -> jax.Array:
    b1 = n.conv(x, 64)
    b5 = n.conv(n.conv(x, 48), 64, 5, padding=2)
    b3 = n.conv(n.conv(n.conv(x, 64), 96, 3, padding=1), 96, 3, padding=1)
    bp = n.conv(L.avg_pool(x, 3, 1, 1), pool_features)
    return L.concat_channels([b1, b5, b3, bp])


def inception_b(n: Net, x: jax.Array) -> jax.Array:
    b3 = n.conv(x, 384, 3, 2)
    bd = n.conv(n.conv(n.conv(x, 64), 96, 3, padding=1), 96, 3, 2)
    return L.concat_channels([b3, bd, L.max_pool(x, 3, 2)])


def inception_c(n: Net, x: jax.Array, c7: int) -> jax.Array:
    b1 = n.conv(x, 192)
    b7 = n.conv(x, c7)
    b7 = n.conv(b7, c7, (1, 7), padding=(0, 3))
    b7 = n.conv(b7, 192, (7, 1), padding=(3, 0))
    bd = n.conv(x, c7)
    for c_out, k, pad in ((c7, (7, 1), (3, 0)), (c7, (1, 7), (0, 3)), (c7, (7, 1), (3, 0))):
        bd = n.conv(bd, c_out, k, padding=pad)
    bd = n.conv(bd, 192, (1, 7), padding=(0, 3))
    bp = n.conv(L.avg_pool(x, 3, 1, 1), 192)
    return L.concat_channels([b1, b7, bd, bp])


def inception_d(n: Net, x: jax.Array) -> jax.Array:
    b3 = n.conv(n.conv(x, 192), 320, 3, 2)
    b7 = n.conv(x, 192)
    b7 = n.conv(b7, 192, (1, 7), padding=(0, 3))
    b7 = n.conv(b7, 192, (7, 1), padding=(3, 0))
    b7 = n.conv(b7, 192, 3, 2)
    return L.concat_channels([b3, b7, L.max_pool(x, 3, 2)])


def inception_e(n: Net, x: jax.Array) -> jax.Array:
    b1 = n.conv(x, 320)
    b3 = n.conv(x, 384)
    b3 = [n.conv(b3, 384, (1, 3), padding=(0, 1)), n.conv(b3, 384, (3, 1), padding=(1, 0))]
    bd = n.conv(n.conv(x, 448), 384, 3, padding=1)
    bd = [n.conv(bd, 384, (1, 3), padding=(0, 1)), n.conv(bd, 384, (3, 1), padding=(1, 0))]
    bp = n.conv(L.avg_pool(x, 3, 1, 1), 192)
    return L.concat_channels([b1, *b3, *bd, bp])


def trunk(n: Net, x: jax.Array, c: dict) -> jax.Array:
    x = front(n, x)
    for pool_features in (32, 64, 64)[: c["a"]]:
        x = inception_a(n, x, pool_features)
    x = inception_b(n, x)
    for c7 in (128, 160, 160, 192)[: c["c"]]:
        x = inception_c(n, x, c7)
    x = inception_d(n, x)
    for _ in range(c["e"]):
        x = inception_e(n, x)
    return L.global_avg_pool(x)


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    x = gen.normal((1, c["size"], c["size"], 3))
    net = Net(None, c["div"])
    features = jax.eval_shape(lambda x: trunk(net, x, c), x)
    params = {
        "convs": [gen.conv_bn(k, c_in, c_out) for k, c_in, c_out in net.specs],
        "fc": gen.dense(features.shape[-1], c["classes"]),
    }

    def fn(params: L.Params, x: jax.Array) -> jax.Array:
        return L.dense(trunk(Net(params["convs"], c["div"]), x, c), params["fc"])

    return Workload(f"inception_v3-{scale}", fn, gen.materialize((params, x)), (0,), "Inception-v3 with BN")
