"""Installing boxwatch prints no warnings from this project's packaging (issue 29, point 3).

Builds a wheel from a copy of the sources with the virtualenv's setuptools (no network, no
build isolation) and reads setuptools' verbose output for its warning categories: a TOML-table
license, example folders "absent from packages", any other deprecation of our configuration.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from locations import ROOT

SOURCES = ("pyproject.toml", "setup.py", "README.md", "boxwatch", "agent", "offline", "examples")
WARNING_MARKS = ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "is absent from the")


@pytest.mark.slow
def test_wheel_build_prints_no_setuptools_warnings(tmp_path: Path) -> None:
    major = int(version("setuptools").split(".")[0])
    if major < 77:
        pytest.skip(f"setuptools {major} predates SPDX license strings (pyproject needs >= 77)")
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
        + ["-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    noisy = [line for line in output.splitlines() if any(m in line for m in WARNING_MARKS)]
    assert not noisy, "\n".join(noisy)
    (wheel,) = (tmp_path / "dist").glob("boxwatch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in (
        "boxwatch/examples/digits/model.onnx",
        "boxwatch/examples/credit/credit.net",
        "boxwatch/examples/credit/rules.yaml",
        "boxwatch/examples/demo/build.yaml",
    ):
        assert data in names, f"{data} missing from the wheel"
