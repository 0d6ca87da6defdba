"""Command-line options shared by the BN verbs (``compile-bn``, ``verify-bn``): the
classifier, and the limits of its compilation."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from boxwatch.offline.bn.limits import MEMORY_SHARE, parse_size

_CLASSIFIER_OPTIONS = (
    click.argument("network_file", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path)),
    click.option("--class", "class_variable", required=True, help="The class variable C."),
    click.option("--positive", required=True, help="The positive state of C (by name)."),
    click.option(
        "--threshold",
        type=float,
        required=True,
        help="Decide positive iff P(C = positive | x) >= T; T in (0, 1).",
    ),
    click.option(
        "--features",
        default=None,
        help="Comma-separated feature variables (default: all leaves; when C is a "
        "leaf, all other variables).",
    ),
    click.option(
        "--order",
        default=None,
        help="Comma-separated variable order of the diagram (default: features in "
        "the order a depth-first search from the class first reaches them).",
    ),
)


def classifier_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """FILE, --class, --positive, --threshold, --features and --order, as the BN verbs take them."""
    for decorate in reversed(_CLASSIFIER_OPTIONS):
        command = decorate(command)
    return command


class SizeParam(click.ParamType):
    """A size in bytes: ``4G``, ``512M``, ``1.5GiB``, ``100000``."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class SecondsParam(click.ParamType):
    """A positive, finite number of seconds (``nan`` and ``inf`` are refused)."""

    name = "SECONDS"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{str(value)[:40]!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{str(value)[:40]!r}: give a finite number of seconds > 0", param, ctx)
        return seconds


_LIMIT_OPTIONS = (
    click.option(
        "--max-memory",
        type=SizeParam(),
        default=None,
        help="Memory any compilation route may use, e.g. 4G or 512M (default: "
        f"{MEMORY_SHARE:.0%} of this machine's RAM). Routes estimated to need "
        "more are not started; with none left the command exits 2 naming "
        "the estimates.",
    ),
    click.option(
        "--max-seconds",
        type=SecondsParam(),
        default=None,
        help="Refuse routes estimated to take longer than this (default: no limit).",
    ),
)


def limit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--max-memory and --max-seconds, the limits every compilation route is held to."""
    for decorate in reversed(_LIMIT_OPTIONS):
        command = decorate(command)
    return command
