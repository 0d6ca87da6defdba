"""Run a snippet under several ``PYTHONHASHSEED`` values: results that must not depend on
Python's string hashing (set and dict orders) print the same under each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def outputs_under_hash_seeds(code: str, seeds: tuple[str, ...] = ("1", "2", "3")) -> set[str]:
    """The distinct standard outputs of ``python -c code`` under each hash seed (one element
    when the snippet is deterministic); ``tests/`` is on the path, for the helpers there."""
    return {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(Path(__file__).parent)},
        ).stdout
        for seed in seeds
    }
