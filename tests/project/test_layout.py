"""The design card's rules, checked: agent never imports offline or heavy libraries, every
package is declared, no module imports itself back through others (lazy imports included),
and package faces import their modules only when a name is read."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from locations import ROOT

HEAVY = {"sklearn", "pgmpy", "pysat", "torch", "matplotlib", "opt_einsum", "scipy"}
PACKAGE_DIR = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]


def _imports(nodes) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            # ``from package import submodule`` imports the submodule too.
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _module_level_imports(path: Path) -> set[str]:
    """Top-level imports (heavy libraries may be imported lazily inside functions)."""
    return _imports(ast.parse(path.read_text(), filename=str(path)).body)


def _all_imports(path: Path) -> set[str]:
    """Every import anywhere in the module, lazy ones included."""
    return _imports(ast.walk(ast.parse(path.read_text(), filename=str(path))))


def _modules() -> Iterator[tuple[str, Path]]:
    """Every project module, by its installed dotted name, found recursively."""
    for package, folder in PACKAGE_DIR.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path


def test_modules_are_found_in_subpackages():
    names = {name for name, _ in _modules()}
    assert "boxwatch.agent.kafka.base" in names
    assert "boxwatch.offline.bn.compile" in names
    assert "boxwatch.commands.console" in names


def test_agent_never_imports_offline_or_heavy_libraries():
    offenders = []
    for name, path in _modules():
        if not name.startswith("boxwatch.agent"):
            continue
        for imported in _module_level_imports(path):
            if imported.split(".")[0] in HEAVY:
                offenders.append(f"{name}: {imported}")
        for imported in _all_imports(path):
            if imported.startswith(("boxwatch.offline", "boxwatch.commands", "boxwatch.cli")):
                offenders.append(f"{name}: imports {imported}")
    assert offenders == []


def _import_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports anywhere (function-level imports included).

    An import names its target module only; the packages above it are not edges (importing
    ``a.b.c`` runs ``a.b``'s ``__init__`` first, but that is not a dependency of the code)."""
    modules = dict(_modules())
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    # ``from package import submodule`` depends on the submodule alone.
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in modules else node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(_import_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_every_package_folder_is_declared():
    declared = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    for package, folder in PACKAGE_DIR.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *rel.parts])
            assert name in declared, f"{init.parent} is a package but not listed in pyproject"


def test_public_api_names_resolve():
    import boxwatch.agent
    import boxwatch.offline.bn
    import boxwatch.offline.monitors
    import boxwatch.offline.refit
    import boxwatch.offline.release

    for package in (
        boxwatch.agent,
        boxwatch.offline.bn,
        boxwatch.offline.release,
        boxwatch.offline.monitors,
        boxwatch.offline.refit,
    ):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"


LAZY_FACES = (
    "boxwatch.agent",
    "boxwatch.offline.bn",
    "boxwatch.offline.monitors",
    "boxwatch.offline.refit",
    "boxwatch.offline.release",
)


def _type_checking_imports(package: str) -> dict[str, str]:
    """Name -> defining submodule, from the ``if TYPE_CHECKING:`` block of a package face."""
    init = importlib.import_module(package).__file__
    assert init is not None
    found = {}
    for node in ast.parse(Path(init).read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module, ast.unparse(imp)
                for alias in imp.names:
                    found[alias.name] = imp.module.removeprefix(f"{package}.")
    return found


def test_lazy_faces_table_type_checking_imports_and_all_agree():
    for package in LAZY_FACES:
        face = importlib.import_module(package)
        table = {name: module for module, names in face._EXPORTS.items() for name in names}
        assert _type_checking_imports(package) == table, package
        assert sorted(face.__all__) == sorted(table), package


def test_importing_the_agent_errors_loads_no_loop_kafka_or_prometheus():
    """The builder and the CLI import ``boxwatch.agent.errors``; that must stay light."""
    code = "import sys, json, boxwatch.agent.errors; print(json.dumps(sorted(sys.modules)))"
    loaded = set(
        json.loads(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
    )
    heavy = {"kafka", "confluent_kafka", "prometheus_client", "onnxruntime", "numpy"}
    assert {m.split(".")[0] for m in loaded} & heavy == set()
    assert {"boxwatch.agent.service", "boxwatch.agent.kafka"} & loaded == set()
    assert "boxwatch.agent.errors" in loaded


def test_a_lazy_face_refuses_an_unknown_name():
    import boxwatch.agent

    with pytest.raises(AttributeError, match="has no attribute 'load_nothing'"):
        boxwatch.agent.load_nothing  # noqa: B018


def test_no_pickle_on_the_agent_path():
    for name, path in _modules():
        if name.startswith("boxwatch.agent"):
            text = path.read_text()
            assert "import pickle" not in text and "allow_pickle=True" not in text, name


def test_test_files_mirror_the_packages_with_unique_names():
    """Test folders have no ``__init__.py`` (pytest imports each file by its basename), so two
    test files of one name in different folders break collection; and none sits at the top."""
    tests = ROOT / "tests"
    names: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert names, "no test files found"
    assert {n: p for n, p in names.items() if len(p) > 1} == {}
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    assert not any(tests.rglob("__init__.py"))
