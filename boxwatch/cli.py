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
import json
import sys
from pathlib import Path
from typing import Any

import click

from boxwatch import __version__
from boxwatch.agent.errors import ArtifactError, BoxwatchError, ConfigError, KeyFileError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_MISSING_EXTRA = 3

# name -> (module, attribute, short help, extra that provides it). Imported on first use.
LAZY_COMMANDS: dict[str, tuple[str, str, str, str | None]] = {
    "demo": ("boxwatch.demo", "demo", "Run the bundled end-to-end example.", None),
    "layers": ("boxwatch.agent.cli_layers", "layers",
               "List a model's candidate layers to monitor, with shapes.", None),
    "compile-bn": ("boxwatch.offline.cli_compile_bn", "compile_bn",
                   "Compile a Bayesian-network classifier into an exact decision diagram.",
                   "offline"),
    "verify-bn": ("boxwatch.offline.cli_verify_bn", "verify_bn",
                  "Verify if-then rules and monotonicity of a BN classifier with SAT.",
                  "offline"),
    "build-artifact": ("boxwatch.offline.cli_build", "build_artifact",
                       "Build the signed artifact and report from one config.", "offline"),
    "agent": ("boxwatch.agent.cli_agent", "agent",
              "Run the online monitor on a Kafka stream.", None),
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


def echo_err(message: str) -> None:
    """Human-facing text goes to stderr."""
    click.echo(message, err=True)


def fail(exc: BoxwatchError, code: int) -> None:
    """Print a one-line reason and exit with ``code`` (no traceback for expected errors)."""
    echo_err(f"error: {exc}")
    sys.exit(code)


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


@cli.command()
@click.option("--private", "private_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the private key (PEM, mode 0600). Keep it in your CI's secrets.")
@click.option("--public", "public_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the public key (PEM) that agents trust.")
@click.option("--force", is_flag=True, help="Overwrite existing key files.")
def keygen(private_path: Path, public_path: Path, force: bool) -> None:
    """Create an Ed25519 signing key pair for artifacts.

    \b
    Example:
      boxwatch keygen --private keys/boxwatch.key --public keys/boxwatch.pub
    """
    from boxwatch.agent.keys import generate_keypair

    try:
        kid = generate_keypair(private_path, public_path, force=force)
    except KeyFileError as exc:
        fail(exc, EXIT_USAGE)
    echo_err(f"wrote private key {private_path} (mode 0600) and public key {public_path}")
    click.echo(kid)


@cli.command("verify-artifact")
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--public-key", "public_keys", multiple=True, required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Trusted public key (PEM); repeat to trust several during key rotation.")
def verify_artifact(artifact: Path, public_keys: tuple[Path, ...]) -> None:
    """Check an artifact's container, signature, schema and member digests.

    Exit 0 when valid, 1 when invalid (the reason is printed), 2 on usage or I/O errors
    (missing artifact or key file).
    """
    from boxwatch.agent.artifact import load_artifact
    from boxwatch.agent.keys import load_trusted_keys

    try:
        keys = load_trusted_keys(list(public_keys))
    except KeyFileError as exc:
        fail(exc, EXIT_USAGE)
    if not artifact.is_file():
        fail(ArtifactError(f"{artifact}: no such file"), EXIT_USAGE)
    try:
        art = load_artifact(artifact, keys)
    except ArtifactError as exc:
        fail(exc, EXIT_FAILED)
    echo_err(f"{artifact}: valid, signed by key {art.key_id}")
    click.echo(art.artifact_id)


@cli.command()
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--public-key", "public_keys", multiple=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Also verify the signature with this trusted key (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def inspect(artifact: Path, public_keys: tuple[Path, ...], as_json: bool) -> None:
    """Show what an artifact holds: classes, layers, monitors, BN, rules, model digest.

    Digests and structure are always checked; the signature only when --public-key is given.
    """
    from boxwatch.agent.artifact import load_artifact
    from boxwatch.agent.describe import describe, render_description
    from boxwatch.agent.keys import load_trusted_keys

    try:
        keys = load_trusted_keys(list(public_keys)) if public_keys else None
        art = load_artifact(artifact, keys)
    except KeyFileError as exc:
        fail(exc, EXIT_USAGE)
    except ArtifactError as exc:
        fail(exc, EXIT_FAILED)
    info = describe(art, signature_checked=keys is not None)
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
    else:
        click.echo(render_description(info))


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
