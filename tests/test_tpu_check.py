"""`python -m eqsat tpu-check` (eqsat/tools/tpu_check.py): the original and the plan compiled by XLA's TPU compiler
on a machine without a TPU. Without libtpu (the optional extra `tpu-aot`) the command says so in one line; the
tests marked tpu_aot compile for a v5e and are skipped where libtpu is missing."""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import pytest

import eqsat
from eqsat.__main__ import main
from eqsat.backends import memory as M
from eqsat.backends.fusion import fused_values
from eqsat.backends.memory import MemoryReport
from eqsat.extract.cost import Profile, load_bundled, load_profile, node_cost
from eqsat.ops import kernels
from eqsat.ops.table import OPS
from eqsat.support.workload import Workload
from eqsat.tools import tpu_check
from eqsat.tools.examples import EXAMPLES

tpu_check.quiet_libtpu()  # before this process's jax starts its backends, where it can: libtpu reads them once


def needs_libtpu(test: Callable[..., None]) -> Callable[..., None]:
    """Marked tpu_aot, and skipped where libtpu is not installed."""
    skip = pytest.mark.skipif(not tpu_check.libtpu_installed(), reason="needs libtpu: the optional extra `tpu-aot`")
    return pytest.mark.tpu_aot(skip(test))


# a TPU fusion nests bitcast fusions inside it: those are no launches of their own
HLO = """\
%bitcast_fusion (p: f32[4]) -> f32[4] {
  ROOT %bitcast = f32[4]{0} bitcast(%p)
}
%fused_computation (p0: f32[4]) -> f32[4] {
  %fusion.5 = f32[4]{0} fusion(%p0), kind=kLoop, calls=%bitcast_fusion
  ROOT %tanh = f32[4]{0} tanh(%fusion.5)
}
%body (c: f32[4]) -> f32[4] {
  ROOT %fusion.2 = f32[4]{0} fusion(%c), kind=kLoop, calls=%fused_computation
}
ENTRY %main.1 (a.1: f32[4]) -> f32[4] {
  %fusion.1 = f32[4]{0} fusion(%a.1), kind=kLoop, calls=%fused_computation
  ROOT %tanh_add_fusion = f32[4]{0} fusion(%fusion.1), kind=kOutput, calls=%fused_computation
}
"""


def test_fusions_are_counted_where_they_launch():
    assert tpu_check.fusion_count(HLO) == 3  # two in the entry, one in the loop body, none nested


def test_without_libtpu_the_command_names_the_extra_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(tpu_check, "libtpu_installed", lambda: False)
    argv = ["tpu-check", "eqsat.tools.examples:matmul_chain", "--scale", "small", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m eqsat tpu-check: error: ") and err.count("\n") == 1, err
    assert "`tpu-aot`" in err and "libtpu" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["nosuch_module:fn", "--args", "f32[8]"],
        ["eqsat.tools.examples:matmul_chain", "--target", "tpu-v9"],
        ["eqsat.tools.examples:matmul_chain", "--target", "cpu"],  # no TPU topology of its own: name one
        ["eqsat.tools.examples:matmul_chain", "--memory-budget", "-1"],
        ["eqsat.tools.examples:matmul_chain", "--bench", "bert"],
    ],
)
def test_bad_input_ends_in_one_line_and_exit_code_2(argv, capsys):
    try:
        code = main(["tpu-check", *argv, "--no-progress"])
    except SystemExit as exit_:  # argparse's own errors: its usage, then one line
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("python -m eqsat tpu-check: error: "), err


@needs_libtpu
def test_a_small_program_and_its_plan_compile_for_v5e():
    found = tpu_check.check(EXAMPLES["matmul_chain"]("full"))  # at 64 re-association gains too little
    assert not found.plan.fallback and found.with_fallbacks  # re-associated: under the overflow watch
    assert not any(c.error for _, c in tpu_check.programs(found))
    # (A @ B) @ v against A @ (B @ v): the TPU compiler counts n^2 m * 4 flops against n^3 * 2
    assert found.alone.flops < found.original.flops / 4
    assert found.alone.fusions >= 1 and found.original.peak > 0
    # the watch's fallback loop is the original: XLA counts it in the watched program
    assert found.planned.flops > found.original.flops
    table = tpu_check.side_by_side(found)
    assert "plan alone" in table and "XLA temp" in table and "dot-assoc-right" in table


def _branches(fn: Callable[..., object], *args: object) -> int:
    text = jax.jit(fn).lower(*args).as_text()
    return text.count("stablehlo.while") + text.count("stablehlo.case")


def test_the_common_path_leaves_the_fallbacks_out_and_returns_their_checks():
    # what an ordinary call runs, for XLA's static figures: an exact kernel's fallback (a loop, a cond) runs only
    # on values out of range, but XLA's cost analysis counts its body as if it ran
    table, ids = jnp.ones((64, 8)), jnp.arange(6) % 64
    x = jnp.ones((1, 8, 8, 3))
    pool = (OPS["PoolMaxSliced"].lower, ((1, 2, 2, 1), (1, 2, 2, 1), (0,) * 4, (0,) * 4))
    for fn, args in (
        (lambda t, i: kernels.take_rows((), t, i), (table, ids)),
        (lambda r, i: kernels.scatter_rows((64,), r, i), (jnp.ones((6, 8)), ids)),
        (lambda v: pool[0](pool[1], v), (x,)),
    ):
        assert _branches(fn, *args) == 1
        with kernels.common_path() as checks:
            assert _branches(lambda *a, fn=fn: (fn(*a), checks), *args) == 0
            assert len(checks) == 1 and checks[0].dtype == jnp.bool_
        with kernels.common_path():
            assert jnp.array_equal(jax.jit(fn)(*args), fn(*args))
    assert _branches(lambda t, i: kernels.take_rows((), t, i), table, ids) == 1  # and it ends with the context


@needs_libtpu
def test_a_plan_with_an_exact_kernel_is_figured_without_its_fallback():
    vocab = 4096
    table = jax.random.normal(jax.random.key(0), (vocab, 256))
    ids = jax.random.randint(jax.random.key(1), (4, 64), 0, vocab)
    work = Workload("embed", lambda t, i: jax.nn.one_hot(i, vocab) @ t, (table, ids), (), "")
    found = tpu_check.check(work)
    assert found.rewritten == {"Take": 1} and found.with_fallbacks and not found.plan.overflow_watch
    # the fallback, jax.jit's one-hot product, counted in the whole program; not in the plan alone, whose check
    # (one pass over the table) stays
    assert found.planned.flops >= found.original.flops and found.alone.flops < found.original.flops / 100
    assert found.alone.branches == 0 and found.alone.bytes >= table.nbytes
    assert "more XLA" not in " ".join(tpu_check.findings(found))


@needs_libtpu
def test_the_command_prints_both_programs_side_by_side(capsys):
    argv = ["tpu-check", "eqsat.tools.examples:distributivity", "--scale", "small", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "== distributivity: planned for tpu-v5e" in out
    assert out.count("compiled") >= 3 and "FAILED" not in out


@needs_libtpu
def test_an_unknown_topology_is_one_line(capsys):
    argv = ["tpu-check", "eqsat.tools.examples:matmul_chain", "--scale", "small", "--topology", "v9x:1x1"]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m eqsat tpu-check: error: no TPU topology 'v9x:1x1'") and err.count("\n") == 1


def _xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1).mean()


@needs_libtpu
def test_a_memory_budget_the_plan_meets_on_the_tpu_and_the_original_misses():
    # the loss's gradient over 250 MiB of logits: the original keeps the log-probabilities in a buffer of their own,
    # the plan does not (by XLA's peak, at 62.5 MiB the TPU compiler keeps a third copy in both)
    logits = jax.random.normal(jax.random.PRNGKey(0), (4, 512, 32000))
    labels = jnp.zeros((4, 512), jnp.int32)
    budget = 600 * 2**20  # the logits and their gradient fit, a third copy does not
    work = Workload("xent_grad", jax.value_and_grad(_xent), (logits, labels))
    found = tpu_check.check(work, memory_budget=budget)
    plan = tpu_check.plan_program(found)
    assert plan.resident <= plan.peak <= budget < found.original.peak
    notes = tpu_check.findings(found)
    assert any(note.startswith("budget 600.00 MiB: TPU peak") and "(under)" in note for note in notes), notes


def test_findings_name_more_xla_work_a_missed_budget_and_the_memory_model_off():
    # figures as the TPU compiler would give them, set beside a real plan's prediction (no libtpu needed)
    work = EXAMPLES["distributivity"]("small")
    plan = eqsat.optimize(work.fn, target="tpu-v5e").plan(*work.args)
    original = tpu_check.Compiled(fusions=2, flops=1e6, bytes=1e5, temp=4096, peak=2**20)
    planned = tpu_check.Compiled(fusions=3, flops=2e6, bytes=1e5, temp=0, peak=2**19)
    found = tpu_check.Check("d", plan, original, planned, model=MemoryReport(2**20, 2**20, 2**20), budget=2**19)
    notes = tpu_check.findings(found)
    assert notes[0].startswith("the plan has more XLA flops than the original (2e+06 > 1e+06); eqsat predicted")
    # where eqsat saw its gain, less what XLA contradicts: its kernels, as XLA counts more fusions (3 > 2)
    assert notes[0].endswith("its gain elsewhere: bytes 8.192e+04 -> 4.096e+04"), notes[0]
    worse = dataclasses.replace(planned, bytes=2e5)  # more of all three: the gain eqsat saw, XLA sees nowhere
    assert all(
        n.endswith("none that XLA agrees with")
        for n in tpu_check.findings(dataclasses.replace(found, planned=worse))[:2]
    )
    assert "budget 0.50 MiB: TPU peak 0.50 MiB with the plan (under), 1.00 MiB without (over)" in notes[1]
    assert notes[2] == "eqsat's memory model 1.00 MiB is +100% off the TPU buffer assigner's peak 0.50 MiB"
    failed = tpu_check.Check("d", plan, original, tpu_check.Compiled(error="XlaRuntimeError: no"))
    assert tpu_check.findings(failed) == ["the plan does not compile for TPU"]
    assert "FAILED: XlaRuntimeError: no" in tpu_check.side_by_side(failed)


def test_the_memory_model_keeps_what_the_target_fuses_in_no_buffer():
    # a target that fuses elementwise producers into dots and dots into their elementwise readers: exp(x) is fused
    # into the dot that reads it and the dot into the tanh that writes the result; between two dots one value is
    # written; a target that copies a dot's inputs into another layout holds that share of them while it runs
    x, w = jnp.ones((64, 128), jnp.float32), jnp.ones((128, 128), jnp.float32)
    mib, weights = 64 * 128 * 4, 128 * 128 * 4
    fuses = dataclasses.replace(load_bundled("cpu"), fuses_producers_into=("contraction",))
    fuses = dataclasses.replace(fuses, fuses_into_consumers=("contraction",))

    def peak(fn: Callable, profile: Profile) -> int:
        plan = eqsat.optimize(fn, background=False).plan(x, w)
        return M.lower_bound(M.liveness(plan, fused=fused_values(plan, profile)) + M.layout_copies(plan, profile))

    assert peak(lambda x, w: jnp.tanh(jnp.exp(x) @ w), fuses) == 2 * mib + weights  # x, the result and w
    assert peak(lambda x, w: jnp.tanh(jnp.tanh(jnp.exp(x) @ w) @ w), fuses) == 3 * mib + weights  # and one between
    assert peak(lambda x, w: jnp.tanh(jnp.exp(x) @ w), load_bundled("cpu")) > 2 * mib + weights  # cpu: no such lists
    copies = dataclasses.replace(fuses, layout_copies={"contraction": 0.5})
    assert peak(lambda x, w: jnp.tanh(jnp.exp(x) @ w), copies) == mib + weights + (mib + weights) // 2  # at the dot


def test_calibrating_a_target_that_is_no_tpu_is_one_line(capsys):
    for argv, said in ((["--target", "h100"], "is no TPU target"), (["--target", "tpu-v9"], "unknown target")):
        assert main(["calibrate", *argv, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("python -m eqsat calibrate: error: ") and err.count("\n") == 1 and said in err, err


@needs_libtpu
def test_calibration_measures_what_the_tpu_compiler_fuses(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))  # written where load_profile finds it, merged over the bundled
    assert main(["calibrate", "--target", "tpu-v5e", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "fuses producers into contraction" in out, out
    measured = load_profile("tpu-v5e")
    assert "contraction" in measured.fuses_into_consumers and measured.bandwidth == load_bundled("tpu-v5e").bandwidth
    assert "8 products of one input in 2 fusions" in out and "the matrix read 5 times" in out, out
    assert (measured.loop_contraction_rows, measured.matrix_reads) == (1, 5.0)  # as the bundled profile says
    bundled = load_bundled("tpu-v5e")
    assert (bundled.loop_contraction_rows, bundled.matrix_reads) == (1, 5.0)


def test_a_gemv_is_a_loop_and_a_product_of_more_rows_reads_its_matrix_as_xla_counts():
    """XLA's TPU compiler fuses one-row products with their siblings and counts a matrix product of more rows as
    reading its matrix 5 times (calibrated above): the tpu-v5e profile prices both so; the CPU's is unchanged."""
    tpu, cpu, matrix = load_bundled("tpu-v5e"), load_bundled("cpu"), 512 * 512 * 4
    gemv = node_cost("Dot", [(1, 512), (512, 512)], (1, 512), "float32", tpu)
    assert gemv.kernels == 0 and gemv.bytes == matrix + 2 * 512 * 4
    rows8 = node_cost("Dot", [(8, 512), (512, 512)], (8, 512), "float32", tpu)
    assert rows8.kernels == 1 and rows8.bytes == 5 * matrix + 2 * 8 * 512 * 4
    dense = node_cost("Dense", [(1, 512), (512, 512), (512,)], (1, 512), "float32", tpu, attrs=("tanh",))
    assert dense.kernels == 0
    for rows in (1, 8):
        on_cpu = node_cost("Dot", [(rows, 512), (512, 512)], (rows, 512), "float32", cpu)
        assert on_cpu.kernels == 1 and on_cpu.bytes == matrix + 2 * rows * 512 * 4


def test_the_checks_run_and_time_on_the_device_at_hand(capsys):
    # issue 43 item 5: the script for a lent TPU or GPU; here the CPU, planned for its own profile, is the dry run
    from benches import tpu_check as bench

    assert bench.here_target() == "cpu"
    assert bench.main(["--here", "--only", "matmul_chain", "--scale", "small", "--seconds", "0.1"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[-3].endswith("| measured here, us (jax.jit / eqsat) |"), table[-3]
    cells = [c.strip() for c in table[-1].split("|")]
    assert cells[1] == "matmul_chain" and cells[2] == "both" and cells[-2].endswith("x)"), cells
