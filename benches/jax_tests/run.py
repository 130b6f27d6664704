"""JAX's own tests with jax.jit replaced by eqsat.optimize: every test that passes under jax.jit must pass.

    ./eqsat.sh jax-tests --tests PATH/TO/jax/tests [--files api_test.py lax_control_flow_test.py] [-k EXPR]

The tests are not in jax's wheel or sdist: PATH is the tests/ folder of a jax checkout, ideally at the tag of
the installed version (`git clone --branch jax-v$(python -c 'import jax; print(jax.__version__)')
https://github.com/jax-ml/jax`). Each file runs twice, under jax.jit and through benches/jax_tests/redirect.py;
the report lists the tests that pass under jax.jit and fail under eqsat, less the known ones (KNOWN, each with
its reason), and the exit code is 1 if any is left.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# tests that inspect jax.jit's own internals, which an eqsat.optimize object is not: test id prefix -> reason
_COUNTS = "counts traces or cache entries: eqsat traces once more to capture (and to validate)"
KNOWN: dict[str, str] = {
    "APITest::test_eval_shape_trace_cache_share": _COUNTS,
    "APITest::test_user_trace_context_hooks": _COUNTS,
    "JitTest::test_cache_key_defaults": "calls PjitFunction._cache_size()",
    "JitTest::test_static_args_equality": "calls PjitFunction._cache_size() and counts traces",
    "JitTest::test_jit_repr": "expects the repr '<PjitFunction of ...>'",
    "JitTest::test_jit_of_nonweakreferenceable_function": "expects jax.jit's weak-reference TypeError; eqsat runs it",
    "TracebackTest::test_jit_traceback": "counts Python stack frames under jax.jit; eqsat's dispatch adds some",
    "RematTest::test_saved_residuals_utility_jit": "names residuals by jax.jit's argument; eqsat's capture calls it "
    "a constant",
}


def outcomes(tests: Path, files: list[str], redirect: bool, extra: list[str]) -> dict[str, str]:
    """test id -> PASSED / FAILED / ERROR / SKIPPED / XFAIL, from one pytest run."""
    plugin = ["-p", "benches.jax_tests.redirect"] if redirect else []
    argv = [sys.executable, "-m", "pytest", *files, "-v", "-p", "no:cacheprovider", *plugin, *extra]
    env = {"PYTHONPATH": str(ROOT), "JAX_TRACEBACK_FILTERING": "off"}
    done = subprocess.run(argv, cwd=tests, capture_output=True, text=True, env={**os.environ, **env}, check=False)
    found = {}
    for line in done.stdout.splitlines():  # -v: "file.py::Class::test PASSED [ 1%]"
        match = re.match(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)
        if match:
            found[match.group(1)] = match.group(2)
    if not found:
        raise SystemExit(f"no test outcomes parsed; pytest said:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return found


def known_reason(test: str) -> str | None:
    return next((why for prefix, why in KNOWN.items() if test.split("::", 1)[-1].startswith(prefix)), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./eqsat.sh jax-tests", description=__doc__.splitlines()[0])
    parser.add_argument("--tests", required=True, type=Path, help="the tests/ folder of a jax checkout")
    parser.add_argument("--files", nargs="+", default=["api_test.py", "lax_control_flow_test.py"])
    parser.add_argument("--json", type=Path, help="write the outcomes here")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --), e.g. -n 2 or -k EXPR")
    args = parser.parse_args(argv)
    jit = outcomes(args.tests, args.files, False, args.pytest_args)
    eqsat = outcomes(args.tests, args.files, True, args.pytest_args)
    passing = {t for t, o in jit.items() if o == "PASSED"}
    lost = sorted(t for t in passing if eqsat.get(t) != "PASSED")
    unexplained = [t for t in lost if known_reason(t) is None]
    for test in lost:
        print(f"{eqsat.get(test, 'MISSING'):8} {test}  ({known_reason(test) or 'not explained'})")
    summary = {
        "files": args.files,
        "passed_under_jit": len(passing),
        "passed_under_eqsat": sum(o == "PASSED" for o in eqsat.values()),
        "passing_under_jit_failing_under_eqsat": len(lost),
        "known_internals": len(lost) - len(unexplained),
        "unexplained": len(unexplained),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "jit": jit, "eqsat": eqsat}, indent=1))
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
