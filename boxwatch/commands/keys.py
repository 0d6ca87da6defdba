"""``boxwatch keygen``: the Ed25519 key pair that signs artifacts."""

from __future__ import annotations

from pathlib import Path

import click

from boxwatch.agent.errors import KeyFileError
from boxwatch.commands.console import EXIT_USAGE, echo_err, fail


@click.command()
@click.option(
    "--private",
    "private_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the private key (PEM, mode 0600). Keep it in your CI's secrets.",
)
@click.option(
    "--public",
    "public_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the public key (PEM) that agents trust.",
)
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
