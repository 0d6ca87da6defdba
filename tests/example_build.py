"""Builds the bundled example artifact once for the agent tests (a faster tau list)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from boxwatch.agent.artifact import build_artifact_bytes, load_artifact, write_artifact
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.runtime import MonitorRuntime, load_runtime
from boxwatch.commands.demo import write_build_config
from boxwatch.examples import example_path
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import build, prepare
from boxwatch.offline.release.records import BuildSummary


@dataclass(frozen=True)
class ExampleArtifact:
    """Paths of a built example: artifact, keys, model, config and data folder."""

    artifact: Path
    private_key: Path
    public_key: Path
    model: Path
    config: Path
    data: Path
    summary: BuildSummary

    def runtime(self) -> MonitorRuntime:
        """The verified runtime of this artifact and model, as the agent loads it."""
        return load_runtime(self.artifact, [str(self.public_key)], model_path=self.model)


def build_example(
    workdir: Path,
    *,
    created_at: int = 1_700_000_000,
    taus: tuple[float, ...] = (1.0, 0.2, 0.05),
    without: str | None = None,
) -> ExampleArtifact:
    """Key pair, data, config and signed artifact of the example in ``workdir``.

    ``without="bn"`` builds the model half only, ``without="model"`` the BN half only.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    private, public = workdir / "keys" / "test.key", workdir / "keys" / "test.pub"
    generate_keypair(private, public, force=True)
    config = write_build_config(workdir)
    raw = yaml.safe_load(config.read_text())
    raw["monitor"]["tau"] = list(taus)
    if without == "model":
        for key in ("model", "classes", "layers", "data", "monitor"):
            raw.pop(key, None)
    elif without is not None:
        raw.pop(without)
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    outcome = build(prepare(load_config(config)), load_private_key(private), created_at=created_at)
    artifact = workdir / "example.bwa"
    write_artifact(artifact, outcome.artifact)
    return ExampleArtifact(
        artifact,
        private,
        public,
        example_path("digits", "model.onnx"),
        config,
        workdir / "data",
        outcome.summary,
    )


def resigned(example: ExampleArtifact, members: dict[str, Any]) -> bytes:
    """The example's artifact with ``members`` replaced (a value None removes the member),
    signed again with the example's key, its manifest otherwise unchanged: what a builder
    that wrote those members would sign."""
    art = load_artifact(example.artifact, None)
    out: dict[str, Any] = dict(art.members)
    for name, value in members.items():
        out.pop(name, None)
        if value is not None:
            out[name] = value
    return build_artifact_bytes(
        out,
        private_key=load_private_key(example.private_key),
        created_at=art.created_at,
        model=art.manifest.get("model"),
        config=art.manifest.get("config"),
        contents=art.contents,
    )
