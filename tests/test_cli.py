"""The CLI: `optimize` writes plans people can read and keep, `compare` prints them, errors are one paragraph."""

import io
import logging
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest
from rich.console import Console
from rich.progress import Progress

import eqsat
import eqsat.__main__
from eqsat.__main__ import main
from eqsat.plans import plan_json
from eqsat.support import progress


def tiny(x: jnp.ndarray, w1: jnp.ndarray, w2: jnp.ndarray) -> jnp.ndarray:
    """x @ W1 + x @ W2: factored into one GEMM by the built-in rules."""
    return x @ w1 + x @ w2


def test_optimize_function_with_arg_specs_writes_json_html_dot(tmp_path, capsys):
    out = {ext: tmp_path / f"plan.{ext}" for ext in ("json", "html", "dot")}
    argv = ["optimize", "test_cli:tiny", "--args", "f32[16,8]", "f32[8,8]", "f32[8,8]", "--no-progress"]
    assert main(argv + [f"--{ext}={path}" for ext, path in out.items()]) == 0
    printed = capsys.readouterr().out
    assert "plan for target 'cpu'" in printed and "dot-factor" in printed
    plan = plan_json.load_plan(out["json"])
    assert plan.target == "cpu" and plan.rewritten_ops()
    assert out["html"].read_text().count('class="pane"') == 2  # the two programs, drawn in the browser
    assert out["dot"].read_text().startswith('digraph "plan"')


def test_optimize_bench_then_compare_saved_plans(tmp_path, capsys):
    cpu, h100 = tmp_path / "cpu.json", tmp_path / "h100.json"
    assert main(["optimize", "--bench", "bert", "--scale", "small", "--json", str(cpu), "--no-validate"]) == 0
    argv = ["optimize", "--bench", "bert", "--scale", "small", "--target", "h100", "--params-argnums", "0"]
    assert main([*argv, "--json", str(h100), "--no-validate", "--iterations", "4"]) == 0
    assert "bert-small" in capsys.readouterr().out
    assert main(["compare", str(cpu), str(h100)]) == 0
    table = capsys.readouterr().out
    assert "eqsat plans" in table and "predicted time" in table and "h100" in table
    assert f"regions that differ, {cpu} -> {h100}: " in table and "  encoder/layer_" in table
    both = tmp_path / "both.html"
    assert main(["compare", str(cpu), str(h100), "--html", str(both)]) == 0
    assert f"eqsat plans {cpu} (cpu) and {h100} (h100)" in both.read_text()
    assert main(["compare", str(cpu), "--html", str(both)]) == 2
    assert "--html draws two plans" in capsys.readouterr().err
    assert main(["compare", str(cpu), str(cpu)]) == 2
    assert capsys.readouterr().err == f"python -m eqsat compare: error: {cpu} given twice\n"


def test_help_of_every_subcommand_has_examples_and_the_common_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    names = re.search(r"\{([a-z,-]+)\}", capsys.readouterr().out).group(1).split(",")
    assert {"optimize", "compare", "demo", "fuzz", "rules"} <= set(names)
    for argv in [[name] for name in names] + [["rules", "check"]]:
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--help"])
        assert exit_.value.code == 0
        printed = capsys.readouterr().out
        assert "usage: python -m eqsat " + " ".join(argv) in printed
        assert "examples:\n  python -m eqsat " in printed and "--no-progress" in printed, argv
        assert "-v, --verbose" in printed, argv
    main_help = subprocess.run([sys.executable, "-m", "eqsat", "optimize", "--help"], capture_output=True, text=True)
    assert "--params-argnums" in main_help.stdout and "examples:" in main_help.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no_such_module_xyz:f", "--args", "f32[2]"], "cannot import module 'no_such_module_xyz'"),
        (["test_cli:nothing_here", "--args", "f32[2]"], "has no attribute 'nothing_here'"),
        (["test_cli", "--args", "f32[2]"], "expected MODULE:FUNCTION"),
        (["test_cli:tiny"], "not a zero-argument Workload factory"),
        (["--bench", "no_such_model"], "unknown benchmark 'no_such_model'"),
        (["test_cli:tiny", "--args", "f32[2,2]", "--target", "nope"], "unknown target 'nope'"),
    ],
)
def test_bad_target_is_one_paragraph_and_exit_code_2(argv, message, capsys):
    assert main(["optimize", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_bad_arg_spec_is_an_argparse_error():
    for argv in (["test_cli:tiny", "--args", "f32(64)"], ["test_cli:tiny", "--args", "q7[3]"]):
        with pytest.raises(SystemExit) as exit_:
            main(["optimize", *argv])
        assert exit_.value.code == 2
    done = subprocess.run(
        [sys.executable, "-m", "eqsat", "optimize", "x:y", "--args", "f32[a]"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "bad argument spec 'f32[a]'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["optimize", "eqsat.tools.examples:matmul_chain", "--iterations", "-3"], "--iterations"),
        (["optimize", "eqsat.tools.examples:matmul_chain", "--nodes", "1.5"], "--nodes"),
        (["optimize", "eqsat.tools.examples:matmul_chain", "--seconds", "nan"], "--seconds"),
        (["optimize", "eqsat.tools.examples:matmul_chain", "--measure", "0"], "--measure"),
        (["tune", "eqsat.tools.examples:matmul_chain", "--budget", "-1"], "--budget"),
        (["demo", "--seconds", "inf"], "--seconds"),
        (["calibrate", "--seconds", "0"], "--seconds"),
        (["rules", "check", "--examples", "0"], "--examples"),
        (["fuzz", "--n", "0"], "--n"),
        (["fuzz", "--seed", "-1"], "--seed"),
        (["fuzz", "--only", "x"], "--only"),
        (["fuzz", "--jobs", "0"], "--jobs"),
        (["fuzz", "--every", "0"], "--every"),
    ],
)
def test_a_bad_number_is_an_argument_error(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {flag}: expected a " in err and repr(argv[-1]) in err, err


def test_optimize_with_negative_iterations_prints_no_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "eqsat", "optimize", "eqsat.tools.examples:matmul_chain", "--iterations", "-3"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "argument --iterations: expected a whole number of at least 0, got '-3'" in done.stderr


def test_fuzz_takes_the_common_flags_and_no_progress_drops_its_progress_lines(capsys, monkeypatch):
    monkeypatch.setenv("EQSAT_PLAN_STORE", "off")  # what the command sets for itself
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the command's SIGTERM handler stays out of pytest
    verbosity: list[int] = []
    monkeypatch.setattr(eqsat.tools.main, "configure_logging", verbosity.append)  # no handler left behind
    assert main(["fuzz", "--n", "2", "--every", "1", "--no-progress", "-v"]) == 0
    quiet = capsys.readouterr().out
    assert "2 cases" in quiet and not re.search(r"^\d+ cases, \d\d:\d\d:\d\d$", quiet, re.M), quiet
    assert verbosity == [1]
    assert main(["fuzz", "--n", "2", "--every", "1"]) == 0
    assert re.search(r"^2 cases, \d\d:\d\d:\d\d$", capsys.readouterr().out, re.M)


def test_pipeline_reports_phases_as_log_records_and_stays_quiet_otherwise(capsys):
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    progress.LOG.addHandler(handler)
    progress.LOG.setLevel(logging.DEBUG)
    try:
        x = jnp.ones((16, 8))
        fast = eqsat.optimize(tiny)
        fast.clear_cache()  # plans are shared per function, as jax.jit's traces: another test may have planned tiny
        fast(x, jnp.ones((8, 8)), jnp.ones((8, 8)))
    finally:
        progress.LOG.removeHandler(handler)
        progress.LOG.setLevel(logging.NOTSET)
    phases = [r.eqsat_phase for r in records]
    assert {"capture", "saturate", "extract", "validate"} <= set(phases)
    assert any(r.eqsat_done for r in records if r.eqsat_phase == "saturate")  # one record per iteration
    eqsat.optimize(tiny)(x, jnp.ones((8, 8)), jnp.ones((8, 8)))
    assert capsys.readouterr() == ("", "")  # no handler installed: the library prints nothing


def test_progress_handler_nests_rows_by_depth():
    bar = Progress(console=Console(file=io.StringIO(), force_terminal=True))
    handler = progress.ProgressHandler(bar)
    progress.LOG.addHandler(handler)
    progress.LOG.setLevel(logging.DEBUG)
    try:
        progress.step("bench", "model 1/2", 0, 2, depth=0)
        progress.begin("capture", "capture")
        progress.begin("saturate", "saturate", total=12)
        progress.step("saturate", "iteration 3", 3, 12)
        assert [t.description.strip() for t in bar.tasks] == ["model 1/2", "capture", "iteration 3"]
        assert bar.tasks[1].finished and not bar.tasks[2].finished
        progress.step("bench", "model 2/2", 1, 2, depth=0)  # the next model: the previous one's rows go
        assert [t.description for t in bar.tasks] == ["model 2/2"]
    finally:
        progress.LOG.removeHandler(handler)
        progress.LOG.setLevel(logging.NOTSET)


def _bad_inputs(tmp: Path) -> list[list[str]]:
    """Each command with a missing file, a file that is not egglog, garbage JSON, the wrong number of --args and a
    negative number, wherever it takes one."""
    (tmp / "prose.egg").write_text("this is not egglog (((\n")
    (tmp / "garbage.json").write_text("{not json")
    (tmp / "a_file").write_text("")
    missing, prose, garbage = str(tmp / "missing.egg"), str(tmp / "prose.egg"), str(tmp / "garbage.json")
    fn, two, four = "test_cli:tiny", ["--args", "f32[16,8]", "f32[8,8]"], ["--args", *["f32[8,8]"] * 4]
    return [
        ["rules", "check", missing],
        ["rules", "check", prose],
        ["rules", "check", garbage],
        ["rules", "check", "--examples", "-1"],
        ["optimize", fn, *two],
        ["optimize", fn, *four],
        ["optimize", fn, *two, "f32[8,8]", "--rules", missing],
        ["optimize", fn, *two, "f32[8,8]", "--rules", prose],
        ["optimize", fn, *two, "f32[8,8]", "--iterations", "-1"],
        ["optimize", fn, "--args", "f32[-8,8]", "f32[8,8]", "f32[8,8]"],
        ["tune", fn, *two],
        ["tune", "--import", missing],
        ["tune", "--import", garbage],
        ["tune", fn, *two, "f32[8,8]", "--budget", "-1"],
        ["census", fn, *four],
        ["census", fn, *two, "f32[8,8]", "--seconds", "-1"],
        ["compare", missing],
        ["compare", garbage],
        ["compare", prose],
        ["calibrate", "--seconds", "-1"],
        ["calibrate", "--seconds", "0.01", "--out", str(tmp / "a_file" / "profile.json")],  # under a file
        ["demo", "--model", "no_such_example"],
        ["demo", "--seconds", "-1"],
        ["fuzz", "--n", "-1"],
        ["fuzz", "--jobs", "-2"],
    ]


def test_every_command_ends_bad_input_in_one_line_and_exit_code_2(tmp_path, capsys):
    for argv in _bad_inputs(tmp_path):
        try:
            code = main([*argv, "--no-progress"])
        except SystemExit as exit_:  # argparse's errors: its usage, then one line
            code = exit_.code
        err = capsys.readouterr().err
        command = " ".join(argv[:2] if argv[0] == "rules" else argv[:1])
        assert code == 2 and "Traceback" not in err, (argv, code, err)
        last = err.splitlines()[-1]
        assert last.startswith(f"python -m eqsat {command}: error: "), (argv, err)
        assert err.count("\n") == 1 or err.startswith("usage: "), (argv, err)


def test_wrong_arity_names_the_signature(capsys):
    assert main(["optimize", "test_cli:tiny", "--args", "f32[16,8]", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m eqsat optimize: error: --args gives 1 spec for test_cli:tiny(x: "), err
    assert err.endswith(": missing a required argument: 'w1'\n") and err.count("\n") == 1, err


def test_the_process_exits_2_with_one_line(tmp_path):
    # the reports, as a shell runs them: a process of its own (python -m eqsat), not main() in pytest
    for argv in (["rules", "check", str(tmp_path / "missing.egg")], ["optimize", "test_cli:tiny", "--args", "f32[2]"]):
        done = subprocess.run(
            [sys.executable, "-m", "eqsat", *argv], capture_output=True, text=True, cwd=Path(__file__).parent
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"python -m eqsat {' '.join(argv[:-1] if argv[0] == 'rules' else argv[:1])}")
