"""The ``boxwatch`` command line: one entry point, verbs like git's.

Exit codes (decided here, by :func:`outcome`, the one place a verb's end becomes an exit
code; documented in ``boxwatch --help`` and the README):

* 0 -- success (artifact valid, all rules hold, build done);
* 1 -- the check ran and failed (invalid artifact, rule violated, build policy failed);
* 2 -- usage, configuration or input error (bad option, bad config, and a missing artifact,
  key or model file in every verb);
* 3 -- a feature's optional dependencies are not installed;
* 70 -- internal error: an unexpected exception, printed on one line with "internal error,
  please report" (never 1, which a release pipeline reads as "a rule is violated");
* 130 -- interrupted (Ctrl-C).

Human text goes to stderr, data (tables, JSON) to stdout. Offline verbs are imported only
when invoked, so the agent's light install never imports the builder.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from boxwatch import __version__
from boxwatch.agent.errors import (
    BoxwatchError,
    ConfigError,
    MissingDependencyError,
    MissingFileError,
)
from boxwatch.commands.artifact import inspect, verify_artifact
from boxwatch.commands.console import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_MISSING_EXTRA,
    EXIT_OK,
    EXIT_USAGE,
    VerbExit,
    echo_err,
)
from boxwatch.commands.keys import keygen

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_MISSING_EXTRA",
    "EXIT_OK",
    "EXIT_USAGE",
    "cli",
    "main",
    "outcome",
]

INTERNAL_ERROR = "internal error, please report"


def outcome(exc: BaseException) -> tuple[int, tuple[str, ...]]:
    """The exit code and the stderr lines for a verb that ended by raising ``exc``.

    A :class:`VerbExit` keeps its code, except that a missing input file (its cause) is a
    usage error in every verb; a missing optional dependency is :data:`EXIT_MISSING_EXTRA`;
    a boxwatch error no verb handled is a usage error; Ctrl-C is 130; anything else is a
    bug: one line and :data:`EXIT_INTERNAL`.
    """
    if isinstance(exc, VerbExit) and exc.code in EXIT_CODES:
        if isinstance(exc.__cause__, MissingFileError):
            return EXIT_USAGE, exc.lines
        return exc.code, exc.lines
    if isinstance(exc, KeyboardInterrupt | click.Abort):
        return EXIT_INTERRUPTED, ("interrupted",)
    if isinstance(exc, MissingDependencyError):
        return EXIT_MISSING_EXTRA, (f"error: {exc}",)
    if isinstance(exc, ConfigError):
        return EXIT_USAGE, tuple(f"error: {p}" for p in exc.problems)
    if isinstance(exc, BoxwatchError):
        return EXIT_USAGE, (f"error: {exc}",)
    reason = " ".join(str(exc).split()) or "(no message)"
    return EXIT_INTERNAL, (f"error: {type(exc).__name__}: {reason} -- {INTERNAL_ERROR}",)


# name -> (module, attribute, short help, extra that provides it). Imported on first use.
LAZY_COMMANDS: dict[str, tuple[str, str, str, str | None]] = {
    "demo": ("boxwatch.commands.demo", "demo", "Run the bundled end-to-end example.", None),
    "layers": (
        "boxwatch.commands.layers",
        "layers",
        "List a model's candidate layers to monitor, with shapes.",
        None,
    ),
    "compile-bn": (
        "boxwatch.commands.compile_bn",
        "compile_bn",
        "Compile a Bayesian-network classifier into an exact decision diagram.",
        "offline",
    ),
    "verify-bn": (
        "boxwatch.commands.verify_bn",
        "verify_bn",
        "Verify if-then rules and monotonicity of a BN classifier with SAT.",
        "offline",
    ),
    "repair-bn": (
        "boxwatch.commands.repair_bn",
        "repair_bn",
        "Propose minimal parameter changes that make a BN's violated rules hold.",
        "offline",
    ),
    "build-artifact": (
        "boxwatch.commands.build",
        "build_artifact",
        "Build the signed artifact and report from one config.",
        "offline",
    ),
    "refit": (
        "boxwatch.commands.refit",
        "refit_artifact",
        "Refit an artifact's monitors from labelled captures into a signed child.",
        "offline",
    ),
    "capture-report": (
        "boxwatch.commands.capture_report",
        "capture_report_cmd",
        "Cluster an artifact's captures: shift of known classes, or new kinds of input.",
        "offline",
    ),
    "export-captures": (
        "boxwatch.commands.export_captures",
        "export_captures",
        "Archive a capture topic as JSON Lines, for labelling offline.",
        None,
    ),
    "agent": (
        "boxwatch.commands.agent",
        "agent",
        "Run the online monitor on a Kafka stream.",
        None,
    ),
}


class LazyGroup(click.Group):
    """A group whose heavy sub-commands are imported only when called."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module, attr, _help, extra = LAZY_COMMANDS[cmd_name]
            try:
                return getattr(importlib.import_module(module), attr)
            except ModuleNotFoundError as exc:
                hint = f"; install it with: pip install 'boxwatch[{extra}]'" if extra else ""
                missing = exc.name or str(exc)
                raise VerbExit(
                    EXIT_MISSING_EXTRA,
                    (f"error: '{cmd_name}' needs the module {missing!r}, not installed{hint}",),
                ) from None
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the verb; however it ends, :func:`outcome` decides the exit code."""
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise  # --help, --version: click's own clean exit
        except click.ClickException as exc:
            exc.show()  # a bad option or argument of the verb
            ctx.exit(EXIT_USAGE)
        except (Exception, KeyboardInterrupt) as exc:
            code, lines = outcome(exc)
            for line in lines:
                echo_err(line)
            ctx.exit(code)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS:
                rows.append((name, LAZY_COMMANDS[name][2]))
            else:
                cmd = super().get_command(ctx, name)
                if cmd is not None and not cmd.hidden:
                    rows.append((name, cmd.get_short_help_str(limit=70)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=(
        "Exit codes: 0 success; 1 the check ran and failed (invalid artifact, violated rule, "
        "failed policy); 2 usage, config or input error (a missing artifact, key or model file "
        "included); 3 optional dependency missing; 70 internal error (please report); "
        "130 interrupted.\n\n"
        "Typical flow: 'boxwatch keygen', 'boxwatch build-artifact' in the release pipeline, "
        "'boxwatch verify-artifact' before deploying, 'boxwatch agent' beside the model."
    ),
)
@click.version_option(__version__, "-V", "--version", prog_name="boxwatch")
def cli() -> None:
    """boxwatch: runtime monitors for production classifiers.

    The offline half compiles and verifies Bayesian-network classifiers and trains box
    monitors on a neural network's layers; both go into one Ed25519-signed artifact that
    the online agent verifies and applies to a Kafka stream.
    """


cli.add_command(keygen)
cli.add_command(verify_artifact)
cli.add_command(inspect)


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point: click exits with the code :func:`outcome` chose."""
    return cli.main(args=argv, prog_name="boxwatch")


if __name__ == "__main__":
    main()
