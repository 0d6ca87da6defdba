"""Bundled example content for ``boxwatch demo``: the digits model, the credit BN, rules."""

from importlib.resources import files
from pathlib import Path


def example_path(*parts: str) -> Path:
    """Filesystem path of a bundled example file, e.g. ``example_path("digits", "model.onnx")``."""
    return Path(str(files(__name__).joinpath(*parts)))
