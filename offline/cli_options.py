"""Command-line options shared by the BN verbs (``compile-bn``, ``verify-bn``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

_CLASSIFIER_OPTIONS = (
    click.argument("network_file", metavar="FILE",
                   type=click.Path(dir_okay=False, path_type=Path)),
    click.option("--class", "class_variable", required=True, help="The class variable C."),
    click.option("--positive", required=True, help="The positive state of C (by name)."),
    click.option("--threshold", type=float, required=True,
                 help="Decide positive iff P(C = positive | x) >= T; T in (0, 1)."),
    click.option("--features", default=None,
                 help="Comma-separated feature variables (default: all leaves; when C is a "
                      "leaf, all other variables)."),
    click.option("--order", default=None,
                 help="Comma-separated variable order of the diagram (default: features in "
                      "the order a depth-first search from the class first reaches them)."),
)


def classifier_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """FILE, --class, --positive, --threshold, --features and --order, as the BN verbs take them."""
    for decorate in reversed(_CLASSIFIER_OPTIONS):
        command = decorate(command)
    return command
