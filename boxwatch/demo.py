"""``boxwatch demo``: the bundled example end to end, on embedded defaults only.

Today it generates a signing key, builds a signed artifact around the bundled digits model,
verifies it as an agent would and prints what is inside. It grows into the full stream demo
(embedded broker, agent, live table) as those parts land.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from boxwatch.agent.artifact import (
    build_artifact_bytes,
    digest_files,
    load_artifact,
    write_artifact,
)
from boxwatch.agent.describe import describe, render_description
from boxwatch.agent.keys import generate_keypair, load_private_key, load_trusted_keys
from boxwatch.examples import example_path

DIGITS_CLASSES = [str(d) for d in range(8)]


def build_example_artifact(workdir: Path, created_at: int | None = None) -> tuple[Path, Path]:
    """Create a key pair and the example artifact in ``workdir``; return (artifact, public key)."""
    keys = workdir / "keys"
    private, public = keys / "demo.key", keys / "demo.pub"
    generate_keypair(private, public, force=True)
    model = example_path("digits", "model.onnx")
    preprocessing = {"input_name": "input", "shape": [64], "dtype": "float32", "scale": 1 / 16}
    data = build_artifact_bytes(
        {"model/preprocessing.json": preprocessing},
        private_key=load_private_key(private),
        created_at=created_at,
        model={"format": "onnx", **digest_files([model])},
        config={"example": "digits"},
        contents={"classes": DIGITS_CLASSES, "model_version": "digits-mlp-1"},
    )
    out = workdir / "example.bwa"
    write_artifact(out, data)
    return out, public


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-out"),
              show_default=True, help="Where keys and the artifact are written.")
def demo(workdir: Path) -> None:
    """Run the bundled example: key, signed artifact, verification, inspection.

    Needs nothing but this package: the example model ships inside it.
    """
    artifact_path, public = build_example_artifact(workdir)
    click.echo(f"built {artifact_path}", err=True)
    artifact = load_artifact(artifact_path, load_trusted_keys([public]))
    click.echo(f"verified {artifact_path} with {public} (key {artifact.key_id})", err=True)
    click.echo(render_description(describe(artifact, signature_checked=True)))
    sys.stdout.flush()
