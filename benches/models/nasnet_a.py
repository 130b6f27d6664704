"""NasNet-A cells as benchmarked by TASO and Tensat, NHWC, batch 1.

Structure from TASO ``examples/nasnet_a.py`` / Tensat ``src/nasneta.rs``: a
(1, 56, 56, 128) input, then 3 stages of 5 normal cells and 1 reduction cell,
channels 128 -> 256 -> 512 -> 1024. Each cell squeezes its inputs with 1x1
convs, builds 10 branches of separable convs (depthwise kxk + pointwise 1x1),
3x3 avg/max pools and identities, adds them pairwise and concatenates the 5
sums. Deviations: batch norm (inference form) follows each conv, as in the real
NASNet; TASO's leading identity 1x1 max pool is omitted.
"""

import jax

from benches.models import layers as L
from eqsat.support.workload import Workload

CONFIGS = {
    "full": {"size": 56, "channels": 128, "stages": 3, "normal": 5},
    "small": {"size": 8, "channels": 8, "stages": 3, "normal": 2},
}

# (input, kernel) of each separable conv, in the order the cells use them.
NORMAL_SEP = (("cur", 3), ("prev", 3), ("cur", 3), ("prev", 3), ("prev", 3))
REDUCTION_SEP = (("prev", 7), ("cur", 5), ("prev", 7), ("prev", 5), ("out0", 3))
# As in TASO, the reduction cell max-pools ``cur`` twice (duplicate kept).


def init_sep(gen: L.ParamGen, c: int, k: int) -> L.Params:
    return {"dw": gen.conv(k, c, c, groups=c), "pw": gen.conv_bn(1, c, c)}


def sep_conv(x: jax.Array, p: L.Params, stride: int = 1) -> jax.Array:
    x = L.conv2d(x, p["dw"]["w"], stride, "SAME", groups=x.shape[-1])
    return L.conv_bn(x, p["pw"], act=False)


def init_cell(gen: L.ParamGen, c_prev: int, c_cur: int, c: int, seps: tuple[tuple[str, int], ...]) -> L.Params:
    return {
        "squeeze": gen.conv_bn(1, c_cur, c),
        "fit": gen.conv_bn(1, c_prev, c),
        "sep": [init_sep(gen, c, k) for _, k in seps],
    }


def squeeze_fit(p: L.Params, prev: jax.Array, cur: jax.Array) -> tuple[jax.Array, jax.Array]:
    """1x1-squeeze ``cur`` and ``prev`` to the cell width.

    TASO's ``fit`` uses a 3x3 stride-2 conv when ``prev`` is larger than ``cur``;
    with every stage restarting from ``prev = cur`` that case never arises.
    """
    assert prev.shape[1:3] == cur.shape[1:3]
    return L.conv_bn(prev, p["fit"]), L.conv_bn(cur, p["squeeze"])


def normal_cell(p: L.Params, prev: jax.Array, cur: jax.Array) -> jax.Array:
    prev, cur = squeeze_fit(p, prev, cur)
    src = {"cur": cur, "prev": prev}
    s = [sep_conv(src[name], q) for (name, _), q in zip(NORMAL_SEP, p["sep"], strict=True)]
    # TASO pools ``prev`` twice for the fourth sum; the duplicate is kept on purpose.
    outs = [
        s[0] + cur,
        s[1] + s[2],
        L.avg_pool(cur, 3, 1, 1) + prev,
        L.avg_pool(prev, 3, 1, 1) + L.avg_pool(prev, 3, 1, 1),
        s[3] + s[4],
    ]
    return L.concat_channels(outs)


def reduction_cell(p: L.Params, prev: jax.Array, cur: jax.Array) -> jax.Array:
    prev, cur = squeeze_fit(p, prev, cur)
    sep = p["sep"]
    out0 = sep_conv(prev, sep[0], 2) + sep_conv(cur, sep[1], 2)
    out1 = L.max_pool(cur, 3, 2, "SAME") + sep_conv(prev, sep[2], 2)
    out2 = L.avg_pool(cur, 3, 2, "SAME") + sep_conv(prev, sep[3], 2)
    out3 = L.max_pool(cur, 3, 2, "SAME") + sep_conv(out0, sep[4])
    out4 = L.avg_pool(out0, 3, 1, 1) + out1
    return L.concat_channels([out0, out1, out2, out3, out4])


def build(scale: str = "full") -> Workload:
    c = L.pick_config(CONFIGS, scale)
    gen = L.ParamGen(0)
    ch = c["channels"]
    stages = []
    c_in = ch
    for _ in range(c["stages"]):
        c_prev = c_cur = c_in
        normal = []
        for _ in range(c["normal"]):
            normal.append(init_cell(gen, c_prev, c_cur, ch, NORMAL_SEP))
            c_prev, c_cur = c_cur, 5 * ch
        ch *= 2
        reduction = init_cell(gen, c_prev, c_cur, ch, REDUCTION_SEP)
        stages.append({"normal": normal, "reduction": reduction})
        c_in = 5 * ch
    params = {"stages": stages}
    x = gen.normal((1, c["size"], c["size"], c["channels"]))

    def fn(params: L.Params, x: jax.Array) -> jax.Array:
        for stage in params["stages"]:
            prev = cur = x
            for p in stage["normal"]:
                prev, cur = cur, normal_cell(p, prev, cur)
            x = reduction_cell(stage["reduction"], prev, cur)
        return x

    return Workload(f"nasnet_a-{scale}", fn, gen.materialize((params, x)), (0,), "TASO NasNet-A cells with BN")
