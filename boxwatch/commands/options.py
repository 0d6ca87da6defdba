"""Command-line options shared by the offline verbs: the classifier and the limits of its
compilation (``compile-bn``, ``verify-bn``), and ``--quiet`` (these and ``build-artifact``)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.classifier import ClassifierSpec
from boxwatch.offline.bn.formats import formats_text
from boxwatch.offline.bn.limits import MEMORY_SHARE, parse_size
from boxwatch.offline.progress import DEFAULT_INTERVAL_S, INTERVAL_ENV, Progress

_CLASSIFIER_OPTIONS = (
    click.argument("network_file", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path)),
    click.option("--class", "class_variable", required=True, help="The class variable C."),
    click.option(
        "--decision",
        type=click.Choice(("threshold", "argmax")),
        default="threshold",
        show_default=True,
        help="threshold: decide --positive iff P(C = positive | x) >= --threshold; "
        "argmax: decide the most probable state of C (ties to the lowest state index in "
        "the network's order), without --positive or --threshold.",
    ),
    click.option(
        "--positive", default=None, help="The positive state of C (by name); threshold only."
    ),
    click.option(
        "--threshold",
        type=float,
        default=None,
        help="Decide positive iff P(C = positive | x) >= T; T in (0, 1); threshold only.",
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
        "the order a depth-first search from the class first reaches them, or a greedy "
        "order keeping few hidden variables between prefix and rest where its cuts are "
        "cheaper).",
    ),
)
_SPEC_PARAMETERS = ("class_variable", "decision", "positive", "threshold", "features", "order")
"""The parameters of :data:`_CLASSIFIER_OPTIONS` that :func:`classifier_spec` reads, in its order."""


def classifier_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """FILE, --class, --decision, --positive, --threshold, --features and --order, handed to
    the command as FILE and one ``wanted`` :class:`ClassifierSpec` (:func:`classifier_spec`);
    the command's help names FILE's formats where it says ``{formats}`` (the readers' table)."""

    @functools.wraps(command)
    def with_spec(*args: Any, **kwargs: Any) -> Any:
        wanted = classifier_spec(*(kwargs.pop(name) for name in _SPEC_PARAMETERS))
        return command(*args, wanted=wanted, **kwargs)

    with_spec.__doc__ = (command.__doc__ or "").replace("{formats}", formats_text())
    decorated: Callable[..., Any] = with_spec
    for decorate in reversed(_CLASSIFIER_OPTIONS):
        decorated = decorate(decorated)
    return decorated


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
        help="Memory reading, compiling and verifying may use, e.g. 4G or 512M (default: "
        f"{MEMORY_SHARE:.0%} of this machine's RAM). A network file may have 1/64 of it "
        "(decompressed) and its tables a quarter; routes estimated to need more are not "
        "started; with none left the command exits 2 naming the estimates.",
    ),
    click.option(
        "--max-seconds",
        type=SecondsParam(),
        default=None,
        help="Wall-clock limit, counted from when the network is read: routes estimated to "
        "take longer are not started, and whatever still runs when it passes (reading, "
        "planning, a route, verification) stops with exit 2 naming how far it got "
        "(default: no limit).",
    ),
)


def limit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--max-memory and --max-seconds, the limits every compilation route is held to."""
    for decorate in reversed(_LIMIT_OPTIONS):
        command = decorate(command)
    return command


def progress_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """--quiet/-q, handed to the command as ``progress``: the :class:`Progress` its long
    phases show on (stderr; nothing with --quiet). A bad $BOXWATCH_PROGRESS_INTERVAL is a
    usage error."""

    @functools.wraps(command)
    def with_progress(*args: Any, quiet: bool, **kwargs: Any) -> Any:
        try:
            progress = Progress(mode="off" if quiet else None)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
        return command(*args, progress=progress, **kwargs)

    return click.option(
        "--quiet",
        "-q",
        is_flag=True,
        help="Show no progress on stderr. Otherwise phases running over 2 s show a bar on a "
        f"terminal, else a line every {DEFAULT_INTERVAL_S:g} s (${INTERVAL_ENV} seconds).",
    )(with_progress)


def _names(value: str | None) -> list[str] | None:
    """``--features`` / ``--order``: comma-separated names, none empty."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",")]
    if any(not n for n in names):
        raise click.BadParameter(f"empty name in {value!r}; use comma-separated names")
    return names


def classifier_spec(
    class_variable: str,
    decision: str,
    positive: str | None,
    threshold: float | None,
    features: str | None,
    order: str | None,
) -> ClassifierSpec:
    """The spec the classifier options describe (``features`` and ``order`` as given on the
    command line, comma-separated); a usage error names what is missing."""
    if decision == "threshold":
        missing = [
            name
            for name, value in (("--positive", positive), ("--threshold", threshold))
            if value is None
        ]
        if missing:
            raise click.UsageError(
                f"{' and '.join(missing)} required with --decision threshold "
                "(or give --decision argmax)"
            )
    else:
        given = [
            name
            for name, value in (("--positive", positive), ("--threshold", threshold))
            if value is not None
        ]
        if given:
            raise click.UsageError(
                f"{' and '.join(given)} apply to --decision threshold only; --decision argmax "
                "decides the most probable state"
            )
    return ClassifierSpec(
        class_variable, positive, threshold, _names(features), _names(order), decision
    )
