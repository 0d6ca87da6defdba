"""What the agent applies to a batch, loaded from one verified artifact.

Artifact members (written by ``boxwatch build-artifact``):

* ``model/spec.json`` -- model format, input preprocessing, pooling, monitored layers,
  class names and model version;
* ``monitors/boxes.json`` + ``.npz`` -- the fitted box monitors (:class:`BoxRuntime`);
* ``bn/diagram.json`` + ``.npz`` -- the compiled BN classifier (:class:`DecisionDiagram`);
* ``bn/rules.json`` -- verified rules for the gate (:class:`RuleGate`).

A :class:`MonitorRuntime` is immutable: reloads build a new one and swap it in whole.
It fails closed: an input whose logits, monitored activations or score are not finite is
rejected, whatever the box tests said.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boxwatch.agent.artifact import Artifact, digest_files, load_artifact
from boxwatch.agent.boxes import REJECT, BoxRuntime
from boxwatch.agent.diagram import DecisionDiagram
from boxwatch.agent.errors import ArtifactError, ConfigError, MissingModelError
from boxwatch.agent.gate import RuleGate
from boxwatch.agent.keys import load_trusted_keys
from boxwatch.agent.members import (
    BOXES_PREFIX,
    DIAGRAM_ARRAYS,
    DIAGRAM_META,
    MODEL_SPEC,
    RULES,
)
from boxwatch.agent.preprocessing import Preprocessing
from boxwatch.agent.taps import Tap, open_tap


@dataclass(frozen=True)
class ModelResult:
    """Per-input outcome of one model batch, all arrays of shape (n_samples,)."""

    predicted: np.ndarray
    verdicts: np.ndarray
    layer_verdicts: dict[str, np.ndarray]
    scores: np.ndarray
    inference_seconds: float
    monitor_seconds: float


@dataclass(frozen=True)
class MonitorRuntime:
    """A verified artifact made runnable: model tap, box monitors, BN diagram and gate."""

    artifact: Artifact
    classes: list[str]
    model_version: str
    preprocessing: Preprocessing | None
    tap: Tap | None
    boxes: BoxRuntime | None
    diagram: DecisionDiagram | None
    gate: RuleGate | None

    @property
    def artifact_id(self) -> str:
        return self.artifact.artifact_id

    def run_model(self, x: np.ndarray) -> ModelResult:
        """Model call with taps, then vectorised verdicts and scores for a batch.

        Parameters
        ----------
        x : ndarray of shape (n_samples, input_size), raw (not yet preprocessed) inputs
        """
        if self.tap is None or self.boxes is None or self.preprocessing is None:
            raise ConfigError("this artifact monitors no model")
        t0 = time.perf_counter()
        with np.errstate(over="ignore", invalid="ignore"):  # non-finite rows are rejected below
            logits, acts = self.tap.run(self.preprocessing.apply(x))
            t1 = time.perf_counter()
            logits = np.asarray(logits)
            predicted = logits.argmax(axis=1)
            verdicts, per_layer, scores = self.boxes.assess(acts, predicted)
        broken = _non_finite_rows(logits, acts, scores)
        if broken.any():  # fail closed: NaN compares false, so it must never reach "accept"
            verdicts = np.where(broken, REJECT, verdicts).astype(np.int8)
            per_layer = {
                layer: np.where(broken, REJECT, v).astype(np.int8) for layer, v in per_layer.items()
            }
        if scores is None:
            scores = np.full(len(predicted), np.nan)
        t2 = time.perf_counter()
        return ModelResult(predicted, verdicts, per_layer, scores, t1 - t0, t2 - t1)


def _non_finite_rows(
    logits: np.ndarray, acts: Mapping[str, np.ndarray], scores: np.ndarray | None
) -> np.ndarray:
    """Rows of a batch whose logits, tapped activations or score hold a NaN or infinity."""
    bad = ~np.isfinite(logits.reshape(len(logits), -1)).all(axis=1)
    for a in acts.values():
        a = np.asarray(a)
        bad |= ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
    if scores is not None:
        bad |= ~np.isfinite(np.asarray(scores, dtype=np.float64))
    return bad


def load_runtime(
    artifact_path: str | Path,
    public_keys: list[str],
    *,
    model_path: str | Path | None = None,
    threads: int = 1,
) -> MonitorRuntime:
    """Verify the artifact (signature, digests), check the model digest, build the runtime.

    Raises :class:`ArtifactError` (untrusted or tampered artifact, model digest mismatch) or
    :class:`ConfigError` (missing model file, unreadable model).
    """
    artifact = load_artifact(artifact_path, load_trusted_keys(list(public_keys)))
    members = artifact.members
    contents = artifact.contents
    spec: Mapping[str, Any] = artifact.json(MODEL_SPEC) if MODEL_SPEC in members else {}
    classes = [str(c) for c in spec.get("classes", contents.get("classes", []))]
    tap = boxes = preprocessing = None
    if spec:
        if model_path is None:
            raise ConfigError(
                "the artifact monitors a model: give its file (model / BOXWATCH_MODEL)"
            )
        check_model_digest(artifact, model_path)
        preprocessing = Preprocessing.from_dict(spec["preprocessing"])
        tap = open_tap(
            model_path, spec["layers"], pooling=spec.get("pooling", "flatten"), threads=threads
        )
        boxes = BoxRuntime.from_members(artifact.json, artifact.arrays, prefix=BOXES_PREFIX)
    diagram = gate = None
    if DIAGRAM_META in members:
        diagram = DecisionDiagram.from_members(
            artifact.json(DIAGRAM_META),
            artifact.arrays(DIAGRAM_ARRAYS),
            where="bn",
        )
        rules = artifact.json(RULES) if RULES in members else []
        gate = RuleGate.from_json(
            rules, features=diagram.features, states=diagram.states, terminals=diagram.terminals
        )
    return MonitorRuntime(
        artifact=artifact,
        classes=classes,
        model_version=str(spec.get("model_version", contents.get("model_version", "unknown"))),
        preprocessing=preprocessing,
        tap=tap,
        boxes=boxes,
        diagram=diagram,
        gate=gate,
    )


def check_model_digest(artifact: Artifact, model_path: str | Path) -> None:
    """The model file (and its recorded external weight files) must match the artifact."""
    recorded = artifact.manifest.get("model") or {}
    names = [f["name"] for f in recorded.get("files", [])]
    model_path = Path(model_path)
    if not model_path.is_file():
        raise MissingModelError(f"{model_path}: no such model file")
    paths = [model_path] + [model_path.parent / n for n in names if n != model_path.name]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ArtifactError(f"model weight files named in the artifact are missing: {missing}")
    actual = digest_files(paths)
    if actual["digest"] != recorded.get("digest"):
        raise ArtifactError(
            f"{model_path}: model digest {actual['digest'][:23]}… does not match the artifact's "
            f"{str(recorded.get('digest'))[:23]}…"
        )
