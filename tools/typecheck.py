"""Type-check the project as it is installed: ``boxwatch.agent`` is ``agent/``, and so on.

mypy finds modules by their folders, and the installed names differ from the folders
(``[tool.setuptools] package-dir`` in pyproject.toml maps them), so this script builds a tree
of symbolic links in the installed layout under ``build/typecheck`` and runs mypy there, with
the settings of ``[tool.mypy]``. Without arguments it checks the package, then the benches
(``bench/*.py``, scripts that import each other and the tests' helpers: a bench that calls
another's function with the wrong arguments fails here, not hours into ``make bench``);
arguments are passed on to mypy instead. Used by ``make test`` and ``make lint``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"


def link_tree() -> None:
    """``TREE/boxwatch/...`` links to the project's folders as the installed package has them."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    shutil.rmtree(TREE, ignore_errors=True)
    top = TREE / "boxwatch"
    top.mkdir(parents=True)
    for entry in sorted((ROOT / package_dir["boxwatch"]).iterdir()):
        if entry.suffix == ".py" or (entry / "__init__.py").is_file():
            (top / entry.name).symlink_to(entry)
    for package, folder in package_dir.items():
        if package != "boxwatch":
            (TREE / package.replace(".", "/")).symlink_to(ROOT / folder)
    (TREE / "tests").symlink_to(ROOT / "tests")
    (TREE / "bench").symlink_to(ROOT / "bench")


def mypy(args: list[str], path: str) -> int:
    """mypy with the project's settings on ``args``, in the tree, ``path`` as MYPYPATH."""
    command = [
        str(Path(sys.executable).with_name("mypy")),
        "--config-file",
        str(ROOT / "pyproject.toml"),
        *args,
    ]
    return subprocess.call(command, cwd=TREE, env={**os.environ, "MYPYPATH": path})


def main(argv: list[str]) -> int:
    link_tree()
    if argv:
        return mypy(argv, "tests")
    benches = sorted(f"bench/{p.name}" for p in (ROOT / "bench").glob("*.py"))
    # The benches import each other by module name (bench/ first, as when one is run).
    return mypy(["boxwatch"], "tests") or mypy(benches, "bench:tests")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
