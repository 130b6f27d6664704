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

# bottom to top, one folder (package) each: a module may import from its own folder and those below it, never above
LAYERS: list[tuple[str, str]] = [
    ("support", "eqsat.support"),  # errors, background threads, worker processes, progress, small caches
    ("numerics", "eqsat.numerics"),  # samples, timings and the guard's statistics, tolerances, the float64 reference
    ("op table", "eqsat.ops"),  # every op once (shape rule, cost class, lowering) with its kernels
    ("capture", "eqsat.capture"),  # the graph IR; jaxpr -> IR; IR -> egglog
    ("e-graph", "eqsat.egraph"),  # rules from data files, saturation, the e-graph checked against values
    ("extraction", "eqsat.extract"),  # cost model, timing cache, extractors, the plan
    ("backends", "eqsat.backends"),  # plan -> jax function; memory
    ("plans", "eqsat.plans"),  # options, signatures, a plan's life, caches and stores
    ("checks", "eqsat.checks"),  # validation and the memory budget: verdicts
    ("planning", "eqsat.planning"),  # the pipeline, tuning, repeated blocks, answers to a refusal
    ("census", "eqsat.census"),  # where a program's time goes, kernel by kernel
    ("dispatch", "eqsat.dispatch"),  # which program each call runs; verdicts applied
    ("front", "eqsat"),  # optimize() and Optimized (eqsat/api.py), the package's names
    ("tools", "eqsat.tools"),  # the command line (and `python -m eqsat`), examples, fuzzing, reports, calibration
]
FOLDER_DEPTH = {folder: depth for depth, (_, folder) in enumerate(LAYERS)}


def _folder(module: str) -> str:
    """The layer's package a module sits in: its own package for a package, `python -m eqsat` with the tools."""
    if module == "eqsat.__main__":
        return "eqsat.tools"
    return module if module in FOLDER_DEPTH else module.rsplit(".", 1)[0]


def _all_packages(root: str = "eqsat") -> tuple[str, ...]:
    """eqsat and every subpackage with modules (data folders such as rules/ and profiles/ have none)."""
    package = importlib.import_module(root)
    found = [root]
    for info in pkgutil.iter_modules(package.__path__):
        folder = Path(package.__path__[0]) / info.name
        if info.ispkg and any(p.name != "__init__.py" for p in folder.glob("*.py")):
            found += _all_packages(f"{root}.{info.name}")
    return tuple(found)


def _modules(packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for package in packages:
        path = importlib.import_module(package).__path__
        found[package] = Path(path[0]) / "__init__.py"
        for info in pkgutil.iter_modules(path):
            if not info.ispkg:
                found[f"{package}.{info.name}"] = Path(path[0]) / f"{info.name}.py"
    return found


# extract/ and backends/ sit beside eqsat/ in the repository and install inside it (pyproject's package-dir)
MODULES = _modules(_all_packages() + _all_packages("eqsat.extract") + _all_packages("eqsat.backends"))
LAYER = {module: FOLDER_DEPTH.get(_folder(module), -1) for module in MODULES}
BENCH_MODULES = _modules(_all_packages("benches"))  # no layers, but no cycles either


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
    unplaced = sorted(m for m, depth in LAYER.items() if depth < 0)
    assert not unplaced, f"give these modules' folders a layer in LAYERS: {unplaced}"


def test_imports_only_go_down():
    upward = [
        f"{module} ({LAYERS[LAYER[module]][0]}) imports {target} ({LAYERS[LAYER[target]][0]})"
        for module, targets in GRAPH.items()
        for target in targets
        if LAYER[target] > LAYER[module]
    ]
    assert not upward, "\n".join(upward)


def test_checks_do_not_plan():
    """Validation, the memory budget and the timing guard take a plan and values and return verdicts: they import
    nothing that builds, saturates or extracts (planning's answers to a refusal live in eqsat/planning/refusals.py)."""
    planning = ("eqsat.planning", "eqsat.egraph", "eqsat.extract")
    for check in [m for m in MODULES if _folder(m) == "eqsat.checks"] + ["eqsat.numerics.guard"]:
        found = {t for t in GRAPH[check] if _folder(t) in planning}
        assert not found, f"{check} imports {sorted(found)}"


def test_only_the_dispatcher_moves_a_plan():
    """A plan's life moves in one place: the dispatcher (eqsat/dispatch/dispatcher.py and its verdicts,
    eqsat/dispatch/verdicts.py) applies what planning (a new entry's first events), the checks and planning's
    answers to a refusal return; no other module moves an entry, not even into its first state."""
    movers = {"eqsat.dispatch.dispatcher", "eqsat.dispatch.verdicts", "eqsat.plans.plan_life"}
    found = []
    for module, path in MODULES.items():
        if module in movers:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node)
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            target = ast.unparse(node.func.value).lower() if called else ""
            moved = called and node.func.attr == "move" and ("Event." in text or "entry" in target)
            applied = called and node.func.attr == "apply" and "entry" in target
            assigned = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr in ("state", "history") for t in node.targets
            )
            if moved or applied or assigned:
                found.append(f"{module}: {text[:80]}")
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
LONG_FILES_ALLOWED = {"eqsat/ops/table.py"}  # the op table's data


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
