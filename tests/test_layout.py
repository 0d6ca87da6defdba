"""The design card's rules, checked: agent never imports offline or heavy libraries."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"sklearn", "pgmpy", "pysat", "torch", "matplotlib", "opt_einsum", "scipy"}


def _imports(nodes) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _module_level_imports(path: Path) -> set[str]:
    """Top-level imports (heavy libraries may be imported lazily inside functions)."""
    return _imports(ast.parse(path.read_text(), filename=str(path)).body)


def _all_imports(path: Path) -> set[str]:
    """Every import anywhere in the module, lazy ones included."""
    return _imports(ast.walk(ast.parse(path.read_text(), filename=str(path))))


def test_agent_never_imports_offline_or_heavy_libraries():
    offenders = []
    for path in sorted((ROOT / "agent").glob("*.py")):
        for name in _module_level_imports(path):
            if name.split(".")[0] in HEAVY:
                offenders.append(f"{path.name}: {name}")
        for name in _all_imports(path):
            if name.startswith("boxwatch.offline"):
                offenders.append(f"{path.name}: imports {name}")
    assert offenders == []


def test_every_package_folder_is_declared():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    mapping = config["package-dir"]
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *rel.parts])
            assert name in declared, f"{init.parent} is a package but not listed in pyproject"


def test_no_pickle_on_the_agent_path():
    for path in sorted((ROOT / "agent").glob("*.py")):
        text = path.read_text()
        assert "import pickle" not in text and "allow_pickle=True" not in text, path.name
