"""``boxwatch verify-artifact`` and ``boxwatch inspect``: check and describe an artifact."""

from __future__ import annotations

import json
from pathlib import Path

import click

from boxwatch.agent.errors import ArtifactError, KeyFileError, MissingArtifactError
from boxwatch.commands.console import (
    EXIT_FAILED,
    EXIT_USAGE,
    echo_err,
    fail,
    trusted_keys_option,
)


@click.command("verify-artifact")
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@trusted_keys_option("Trusted public key (PEM); repeat to trust several during key rotation.")
def verify_artifact(artifact: Path, public_keys: tuple[Path, ...]) -> None:
    """Check an artifact's container, signature, schema and member digests.

    Exit 0 when valid, 1 when invalid (the reason is printed), 2 on usage or I/O errors
    (missing artifact or key file, an artifact path that is not a regular file), 70 on an
    internal error.
    """
    from boxwatch.agent.artifact import load_artifact
    from boxwatch.agent.keys import load_trusted_keys

    try:
        keys = load_trusted_keys(list(public_keys))
    except KeyFileError as exc:
        fail(exc, EXIT_USAGE)
    if not artifact.exists():
        fail(MissingArtifactError(f"{artifact}: no such file"), EXIT_USAGE)
    if not artifact.is_file():  # stat only: a FIFO or device is never opened
        fail(ArtifactError(f"{artifact}: not a regular file"), EXIT_USAGE)
    try:
        art = load_artifact(artifact, keys)
    except ArtifactError as exc:
        fail(exc, EXIT_FAILED)
    echo_err(f"{artifact}: valid, signed by key {art.key_id}")
    click.echo(art.artifact_id)


@click.command()
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also verify the signature with this trusted key (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def inspect(artifact: Path, public_keys: tuple[Path, ...], as_json: bool) -> None:
    """Show what an artifact holds: classes, layers, monitors, BN, rules, model digest.

    Digests and structure are always checked; the signature only when --public-key is given.
    Without it the manifest is untrusted: its strings are printed with control characters
    escaped.
    """
    from boxwatch.agent.artifact import load_artifact
    from boxwatch.agent.describe import describe, render_description
    from boxwatch.agent.keys import load_trusted_keys

    try:
        keys = load_trusted_keys(list(public_keys)) if public_keys else None
        art = load_artifact(artifact, keys)  # a missing file is exit 2, as in every verb
    except KeyFileError as exc:
        fail(exc, EXIT_USAGE)
    except ArtifactError as exc:
        fail(exc, EXIT_FAILED)
    info = describe(art, signature_checked=keys is not None)
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
    else:
        click.echo(render_description(info))
