"""The ``boxwatch`` command line: one entry point, verbs like git's.

Exit codes (decided here, documented in ``boxwatch --help``):

* 0 -- success (artifact valid, all rules hold, build done);
* 1 -- the check ran and failed (invalid artifact, rule violated, build policy failed);
* 2 -- usage, configuration or input error (bad option, missing file, bad config);
* 3 -- a feature's optional dependencies are not installed.

Human text goes to stderr, data (tables, JSON) to stdout. Offline verbs are imported only
when invoked, so the agent's light install never imports the builder.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from boxwatch import __version__
from boxwatch.agent.errors import BoxwatchError, ConfigError
from boxwatch.commands.artifact import inspect, verify_artifact
from boxwatch.commands.console import (
    EXIT_FAILED,
    EXIT_MISSING_EXTRA,
    EXIT_OK,
    EXIT_USAGE,
    echo_err,
    fail,
)
from boxwatch.commands.keys import keygen

__all__ = ["EXIT_FAILED", "EXIT_MISSING_EXTRA", "EXIT_OK", "EXIT_USAGE", "cli", "main"]

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
    "build-artifact": (
        "boxwatch.commands.build",
        "build_artifact",
        "Build the signed artifact and report from one config.",
        "offline",
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
                echo_err(f"error: '{cmd_name}' needs the module {missing!r}, not installed{hint}")
                sys.exit(EXIT_MISSING_EXTRA)
        return super().get_command(ctx, cmd_name)

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
        "failed policy); 2 usage, config or input error; 3 optional dependency missing.\n\n"
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
    """Console-script entry point."""
    try:
        return cli.main(args=argv, prog_name="boxwatch")
    except ConfigError as exc:
        fail(exc, EXIT_USAGE)
    except BoxwatchError as exc:
        fail(exc, EXIT_USAGE)


if __name__ == "__main__":
    main()
