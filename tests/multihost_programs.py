"""One process of a multi-host JAX job on this machine (jax.distributed on localhost, CPU, gloo collectives), each
process one CPU device of a global mesh: a program optimized by eqsat and compared with jax.jit on global arrays.
Run N of these with the same --port by tests/test_multihost.py and benches/multihost.py (`launch` below).

Cases: `sum`, sum(x @ b for b in B) with x sharded on its columns and each b on its rows (every product needs an
all-reduce; eqsat factors the sum); `train`, a data-parallel MLP training step (value_and_grad, the batch sharded,
the gradients all-reduced); `tp`, a dense layer sharded on its contraction dimension; `rule`, max(x, 0) with a
user rule that is wrong where x < 0, which only process 1's shard (or, with --local, only its own values) holds;
`conv`, depthwise convolutions of six shapes over a batch sharded by process (kernel choices: each is measured
against its shifted-sum form, the measurements split among the processes); `mobilenetv2_train`, keras
MobileNetV2's training step (benches/kernels.py, the `models` extra) with its batch of 2 sharded by process.

Prints one JSON object: per call, the largest difference from jax.jit's results; the plan's rewrites and why the
original runs, if it does; with --seconds, jax.jit's and eqsat's times in interleaved rounds.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RULE = '(rewrite (Max a b) a :name "max-is-left")  ; wrong where b > a\n'


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--case", choices=("sum", "train", "tp", "rule", "conv", "mobilenetv2_train"), required=True)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--local", action="store_true", help="the rule case on each process's own values")
    parser.add_argument("--seconds", type=float, default=0.0, help="time jax.jit and eqsat, interleaved")
    parser.add_argument("--measure-seconds", type=float, help="the kernel measurements' budget (Limits)")
    parser.add_argument("--prepared", action="store_true", help="the first argument prepared as parameters")
    args = parser.parse_args()

    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{args.port}", num_processes=args.processes, process_id=args.index)

    import numpy as np
    from jax.experimental import multihost_utils

    import eqsat
    from eqsat.numerics.measure import interleaved
    from eqsat.support import processes

    if os.environ.get("TEST_OTHER_PROGRAM"):  # what EQSAT_CHECK_LOCKSTEP must catch: another program reported
        import eqsat.dispatch.dispatcher

        eqsat.dispatch.dispatcher._program = lambda entry, flat: "another program"
    if os.environ.get("TEST_OTHER_VERSION"):  # a host with another eqsat installed
        import eqsat.plans.plan_store

        eqsat.plans.plan_store.code_version = lambda: "another version"
    fun, inputs = _case(args)
    options: dict[str, Any] = {"rules": [RULE]} if args.case == "rule" else {}
    if args.measure_seconds is not None:
        options["limits"] = eqsat.Limits(measure_seconds=args.measure_seconds)
    fast = eqsat.optimize(fun, params_argnums=(0,) if args.prepared else (), **options)
    reference = jax.jit(fun)
    start = time.perf_counter()
    fast.plan(*inputs)  # cold: planned (or loaded) before the first call, in every process at once
    plan_s = time.perf_counter() - start
    differences = []
    run = functools.partial(fast.prepare(inputs[0]), *inputs[1:]) if args.prepared else functools.partial(fast, *inputs)
    for _ in range(args.calls):
        got, want = run(), reference(*inputs)
        got, want = (multihost_utils.process_allgather(v, tiled=True) for v in (got, want))
        leaves = zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
        differences.append(max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) for g, w in leaves))
    plan = fast.plan(*inputs)
    kernels = [json.loads(f.read_text())["entries"] for f in Path(os.environ["EQSAT_CACHE_DIR"]).glob("timing/*.json")]
    report: dict[str, Any] = {
        "process": args.index,
        "plan_s": plan_s,
        "kernels_kept": sum(map(len, kernels)),  # the timing cache this process keeps
        "measured": {k[len("timing_") :]: v for k, v in plan.stats.items() if k.startswith("timing_")},
        "measure_s": plan.stats.get("measure_s"),  # process 0's kernel measurements, the others' shares awaited
        "differences": differences,
        "rewritten": plan.rewritten_ops(),
        "fallback": plan.fallback,
        "guard": None if plan.measured is None else plan.measured.get("decision"),
    }
    if args.seconds:
        # every process times the same rounds: the collectives of each call meet
        across = functools.partial(processes.slowest, "bench")
        result = interleaved(reference, fast, inputs, seconds=args.seconds, min_rounds=5, across=across)
        report.update(jit_s=result.baseline_s, eqsat_s=result.candidate_s, ratio=result.ratio, rounds=result.rounds)
    print(json.dumps(report), flush=True)
    jax.distributed.shutdown()


def _case(args: argparse.Namespace) -> tuple[Any, tuple]:
    """The case's function and its global (or, with --local, process-local) inputs."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((args.processes,), ("d",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(0)  # the same global values in every process

    def put(value: np.ndarray, spec: P) -> jax.Array:
        value = value.astype(np.float32) if value.dtype.kind == "f" else value
        return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec), lambda index: value[index])

    n = args.size
    if args.case == "sum":
        x = put(rng.standard_normal((n, n)) / np.sqrt(n), P(None, "d"))
        weights = [put(rng.standard_normal((n, n)) / np.sqrt(n), P("d", None)) for _ in range(12)]
        return (lambda x, ws: sum(x @ w for w in ws)), (x, weights)
    if args.case == "tp":  # two projections of x, both sharded on the contraction dimension
        x = put(rng.standard_normal((n, 4 * n)), P(None, "d"))
        weights = [put(rng.standard_normal((4 * n, n)) / n, P("d", None)) for _ in range(2)]
        return (lambda weights, x: jax.nn.gelu(x @ weights[0] + x @ weights[1])), (weights, x)
    if args.case == "train":  # an embedding written as one_hot @ table, a projection and a cross-entropy
        vocab, batch = 4 * n, 16 * args.processes
        params = {
            "table": put(rng.standard_normal((vocab, 64)) / 8, P()),
            "out": put(rng.standard_normal((64, vocab)) / 8, P()),
        }
        ids = put(rng.integers(0, vocab, (batch, 8)).astype(np.int32), P("d", None))
        labels = put(rng.integers(0, vocab, batch).astype(np.int32), P("d"))

        def loss(params: dict[str, Any], ids: Any, labels: Any) -> Any:
            hidden = jnp.tanh(jax.nn.one_hot(ids, vocab) @ params["table"]).mean(axis=1)
            logits = hidden @ params["out"]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))

        return jax.value_and_grad(loss), (params, ids, labels)
    if args.case == "conv":  # a batch of 2 images per process, 32-64 channels, windows of 3, 5 and 7
        blocks = [(c, k) for c in (32, 64) for k in (3, 5, 7)]
        x = put(rng.standard_normal((2 * args.processes, n // 8, n // 8, 32)), P("d"))
        weights = [put(rng.standard_normal((k, k, 1, c)) / k, P()) for c, k in blocks]

        def net(x: Any, weights: list[Any]) -> Any:
            for w in weights:
                if w.shape[-1] != x.shape[-1]:
                    x = jnp.concatenate([x, x], axis=-1)
                dims = ("NHWC", "HWIO", "NHWC")
                x = jax.nn.relu(
                    jax.lax.conv_general_dilated(
                        x, w, (1, 1), "SAME", dimension_numbers=dims, feature_group_count=x.shape[-1]
                    )
                )
            return x

        return net, (x, weights)
    if args.case == "mobilenetv2_train":
        from benches.kernels import workload

        work = workload("mobilenetv2_train")
        params, x = jax.tree.map(np.asarray, work.args)
        return work.fn, (jax.tree.map(lambda v: put(v, P()), params), put(x, P("d")))
    # rule: x >= 0 in process 0's rows, < 0 in process 1's (or, --local, in process 1's own values only)
    rows = np.abs(rng.standard_normal((8 * args.processes, n)))
    rows[8:] *= -1
    if args.local:
        return (lambda x: jnp.maximum(x, 0.0)), (jnp.asarray(rows[8 * args.index : 8 * args.index + 8]),)
    return (lambda x: jnp.maximum(x, 0.0)), (put(rows, P("d", None)),)


def launch(
    processes: int,
    case: str,
    caches: list[Path],
    port: int,
    timeout: float,
    extra: list[str] = (),
    env: dict[int, dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Run `processes` of this script on localhost, process i with EQSAT_CACHE_DIR=caches[i] (and env[i]); every
    one's JSON report, or RuntimeError with each one's output where any failed or ran past `timeout` seconds."""
    root = Path(__file__).resolve().parents[1]
    running = []
    for i in range(processes):
        process_env = {
            **os.environ,
            "EQSAT_CACHE_DIR": str(caches[i]),
            "EQSAT_CHECK_LOCKSTEP": "1",
            "EQSAT_PLAN_STORE": "on",
        }
        process_env.update({"EQSAT_PROCESS_TIMEOUT": str(timeout / 2), **(env or {}).get(i, {})})
        command = [sys.executable, "-m", "tests.multihost_programs", f"--port={port}", f"--processes={processes}"]
        command += [f"--index={i}", f"--case={case}", *extra]
        running.append(
            subprocess.Popen(
                command, cwd=root, env=process_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs, failed = [], False
    for process in running:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in running:
                p.kill()
            out, err = process.communicate()
            err += f"\n(killed after {timeout} s)"
        failed = failed or process.returncode != 0
        outputs.append((out, err))
    if failed:
        text = "\n".join(
            f"--- process {i} (exit {p.returncode}):\n{o}\n{e[-3000:]}"
            for i, (p, (o, e)) in enumerate(zip(running, outputs, strict=True))
        )
        raise RuntimeError(f"a process of the {case} job failed:\n{text}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


if __name__ == "__main__":
    main()
