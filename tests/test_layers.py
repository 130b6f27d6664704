"""The package's shape: one installed top-level package, every module importable on its own, and imports that only
go down the pipeline's layers, without cycles."""

import ast
import importlib
import os
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# bottom to top: a module may import from its own layer and the ones below it, never from above
LAYERS: list[tuple[str, set[str]]] = [
    ("ir and op table", {
        "eqsat", "eqsat.background", "eqsat.errors", "eqsat.graph_walk", "eqsat.guard", "eqsat.ir", "eqsat.lru",
        "eqsat.measure", "eqsat.ops", "eqsat.processes", "eqsat.progress", "eqsat.sample", "eqsat.tolerance",
        "eqsat.workload",
        "eqsat.widening",  # the float64 reference validation judges accuracy against
        "eqsat.shape_rules",  # the op table's shape and dtype rules, read from eqsat/shapes.egg
        "eqsat.backends.kernels",  # the alternative kernels the op table's entries lower through
        "eqsat.backends.cumulative",  # the op table's cumulative kernels
    }),
    ("capture", {"eqsat.capture", "eqsat.encode", "eqsat.rows"}),
    ("e-graph", {"eqsat.chains", "eqsat.rule_sources", "eqsat.saturate", "eqsat.egraph_check"}),
    ("extraction", {
        "eqsat.extract", "eqsat.extract.cost", "eqsat.extract.dag", "eqsat.extract.extractors",
        "eqsat.extract.greedy", "eqsat.extract.ilp", "eqsat.extract.plan", "eqsat.extract.timing",
        "eqsat.extract.provenance", "eqsat.extract.views", "eqsat.extract.changes", "eqsat.extract.widen",
    }),
    ("lowering", {"eqsat.backends", "eqsat.backends.lower"}),
    ("memory", {"eqsat.backends.memory"}),
    # the pipeline of plain values, one signature at a time; plans kept across processes are the report's JSON
    # (eqsat.extract.report), read and written here
    ("planning", {
        "eqsat.agreement", "eqsat.autotune", "eqsat.budget", "eqsat.refusals", "eqsat.extract.report", "eqsat.options",
        "eqsat.plan_cache", "eqsat.plan_life", "eqsat.plan_store", "eqsat.planning", "eqsat.repeats", "eqsat.sharding",
        "eqsat.signature", "eqsat.validate",
        "eqsat.buckets",  # an option's value (eqsat.options declares it), and how a call is padded to its bucket
    }),
    # the census is a tool, beside the API so that fast.profile() can take one (imported inside the method)
    ("API", {
        "eqsat.api", "eqsat.census", "eqsat.census_kernels", "eqsat.dispatcher", "eqsat.jit_dispatch",
        "eqsat.prepare", "eqsat.verdicts",
    }),
    # eqsat/tools/: the command line, examples, fuzzing, generators, rule verification, calibration, the HTML report
    ("tools", {
        "eqsat.__main__", "eqsat.tools", "eqsat.tools.main", "eqsat.tools.cli", "eqsat.tools.cli_measure",
        "eqsat.tools.examples", "eqsat.tools.calibrate", "eqsat.tools.html_report", "eqsat.tools.gen_algebra",
        "eqsat.tools.gen_conv", "eqsat.tools.generators", "eqsat.tools.program", "eqsat.tools.verify",
        "eqsat.tools.versus", "eqsat.tools.fuzz", "eqsat.tools.fuzz_cases", "eqsat.tools.gen_losses",
        "eqsat.tools.domain", "eqsat.tools.special", "eqsat.tools.tpu_check",
    }),
]  # fmt: skip
LAYER = {module: depth for depth, (_, modules) in enumerate(LAYERS) for module in modules}
PACKAGES = ("eqsat", "eqsat.extract", "eqsat.backends", "eqsat.tools")
BENCH_PACKAGES = ("benches", "benches.models", "benches.jax_tests")  # no layers, but no cycles either


def _modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        path = importlib.import_module(package).__path__
        found[package] = Path(path[0]) / "__init__.py"
        for info in pkgutil.iter_modules(path):
            if not info.ispkg:
                found[f"{package}.{info.name}"] = Path(path[0]) / f"{info.name}.py"
    return found


MODULES = _modules()
BENCH_MODULES = _modules(BENCH_PACKAGES)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(path: Path, known: dict[str, Path] = MODULES) -> set[str]:
    """The modules of `known`'s packages this file imports at run time, anywhere in it, inside functions too
    (imports only a type checker sees are not run, so they are left out)."""
    roots = {name.split(".")[0] for name in known}
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in roots:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in roots)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


GRAPH = {module: _imports(path) - {module} for module, path in MODULES.items()}
EVERY = {**MODULES, **BENCH_MODULES}
WHOLE_GRAPH = {module: _imports(path, EVERY) - {module} for module, path in EVERY.items()}


def test_every_module_has_a_layer():
    assert set(MODULES) == set(LAYER), "place new modules in LAYERS (and remove gone ones)"


def test_the_runtime_imports_no_tool():
    """Everything outside eqsat/tools/ (and `python -m eqsat`'s entry) is the runtime: it never imports a tool."""
    runtime = [m for m in MODULES if m != "eqsat.__main__" and not m.startswith("eqsat.tools")]
    assert {m for m in MODULES if LAYERS[LAYER[m]][0] == "tools"} == set(MODULES) - set(runtime)
    found = [f"{m} imports {t}" for m in runtime for t in GRAPH[m] if t.startswith("eqsat.tools")]
    assert not found, "\n".join(found)


def test_imports_only_go_down():
    upward = [
        f"{module} ({LAYERS[LAYER[module]][0]}) imports {target} ({LAYERS[LAYER[target]][0]})"
        for module, targets in GRAPH.items()
        for target in targets
        if LAYER[target] > LAYER[module]
    ]
    assert not upward, "\n".join(upward)


def test_checks_do_not_plan():
    """Validation, the memory budget and the guard take a plan and values and return verdicts: they import nothing
    that builds, saturates or extracts (planning's answers to a refusal live in eqsat.refusals)."""
    planning = {"eqsat.planning", "eqsat.refusals", "eqsat.saturate", "eqsat.chains", "eqsat.agreement"}
    for check in ("eqsat.validate", "eqsat.budget", "eqsat.guard"):
        found = {t for t in GRAPH[check] if t in planning or t.startswith("eqsat.extract")}
        assert not found, f"{check} imports {sorted(found)}"


def test_only_the_dispatcher_moves_a_built_plan():
    """A plan's life moves in one place once the plan is built: the dispatcher's verdicts (eqsat/verdicts.py and
    eqsat/dispatcher.py) apply what checks and planning return; planning moves the entries it makes into their
    first state (eqsat/planning.py, eqsat/agreement.py)."""
    movers = {"eqsat.dispatcher", "eqsat.verdicts", "eqsat.plan_life", "eqsat.planning", "eqsat.agreement"}
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if called and node.func.attr in ("move", "apply") and module not in movers:
                target = ast.unparse(node.func.value)
                if "entry" in target or target in ("fresh", "replaced", "pending"):
                    found.append(f"{module}: {ast.unparse(node)[:80]}")
    assert not found, "\n".join(found)


def test_no_import_cycle():
    """Over eqsat/, extract/, backends/ and benches/, imports inside functions included: a lazy import that breaks a
    cycle at load time still ties the two modules together."""
    state: dict[str, bool] = {}  # False while on the path, True once finished

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) is False:
            pytest.fail("import cycle: " + " -> ".join([*path[path.index(module) :], module]))
        if module in state:
            return
        state[module] = False
        for target in sorted(WHOLE_GRAPH.get(module, ())):
            visit(target, [*path, module])
        state[module] = True

    for module in sorted(WHOLE_GRAPH):
        visit(module, [])


def test_one_top_level_package_is_installed():
    import eqsat.extract.cost

    # the folders install inside eqsat, wherever they sit in the repository
    assert eqsat.extract.cost.__name__ == "eqsat.extract.cost"
    assert importlib.util.find_spec("eqsat.rules") is not None


def test_every_module_imports_alone_in_a_fresh_interpreter(tmp_path):
    # run outside the repository, so that its folders cannot be imported as top-level packages by accident
    check = (
        "import importlib, sys; importlib.import_module(sys.argv[1]); "
        "leaked = sorted({m.split('.')[0] for m in sys.modules} & {'extract', 'backends', 'rules', 'benches'}); "
        "sys.exit(f'imported top-level {leaked}' if leaked else 0)"
    )
    env = {**os.environ, "PYTHONPATH": ""}

    def problem(module: str) -> str | None:
        run = subprocess.run([sys.executable, "-c", check, module], cwd=tmp_path, env=env, capture_output=True)
        return run.stderr.decode().strip().splitlines()[-1] if run.returncode else None

    with ThreadPoolExecutor(4) as pool:
        failed = {m: p for m, p in zip(MODULES, pool.map(problem, MODULES), strict=True) if p}
    assert not failed, failed


REPO = Path(__file__).resolve().parents[1]
SIZED = ("eqsat", "extract", "backends", "rules")  # the installed package's folders
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
LONG_FILES_ALLOWED = {"eqsat/ops.py"}  # the op table's data


def _sized_files() -> list[Path]:
    return sorted(p for folder in SIZED for p in (REPO / folder).rglob("*.py"))


def test_no_source_file_is_too_long():
    long = [
        f"{path.relative_to(REPO)}: {lines} lines"
        for path in _sized_files()
        if (lines := len(path.read_text().splitlines())) > MAX_FILE_LINES
        and path.relative_to(REPO).as_posix() not in LONG_FILES_ALLOWED
    ]
    assert not long, f"over {MAX_FILE_LINES} lines: split along a seam\n" + "\n".join(long)


def test_no_function_is_too_long():
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for path in _sized_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"over {MAX_FUNCTION_LINES} lines (docstring included): split along a seam\n" + "\n".join(long)
