"""Type-check the project as it is installed: ``boxwatch.agent`` is ``agent/``, and so on.

mypy finds modules by their folders, and the installed names differ from the folders
(``[tool.setuptools] package-dir`` in pyproject.toml maps them), so this script builds a tree
of symbolic links in the installed layout under ``build/typecheck`` and runs mypy there, with
the settings of ``[tool.mypy]``. Arguments are passed on to mypy. Used by ``make test`` and
``make lint``.
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


def main(argv: list[str]) -> int:
    link_tree()
    mypy = Path(sys.executable).with_name("mypy")
    command = [str(mypy), "--config-file", str(ROOT / "pyproject.toml"), *(argv or ["boxwatch"])]
    return subprocess.call(command, cwd=TREE, env={**os.environ, "MYPYPATH": "tests"})


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
