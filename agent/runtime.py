"""What the agent applies to a batch, loaded from one verified artifact.

Artifact members (written by ``boxwatch build-artifact``):

* ``model/spec.json`` -- model format, input preprocessing, pooling, monitored layers,
  class names and model version;
* ``monitors/boxes.json`` + ``.npz`` -- the fitted box monitors (:class:`BoxRuntime`);
* ``bn/diagram.json`` + ``.npz`` -- the compiled BN classifier (:class:`DecisionDiagram`);
* ``bn/rules.json`` -- verified rules for the gate (:class:`RuleGate`).

A :class:`MonitorRuntime` is immutable: reloads build a new one and swap it in whole.
It fails closed: an input whose logits, monitored activations or score are not finite is
rejected, whatever the box tests said. Every verdict comes with its reason
(:class:`~boxwatch.agent.boxes.Reasons`): ``not_finite`` for those, ``out_of_range`` for an
input outside the training range the artifact records, else what the monitor found.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from boxwatch.agent.artifact import Artifact, digest_files, load_artifact
from boxwatch.agent.boxes import NOT_FINITE, OUT_OF_RANGE, REJECT, BoxRuntime, Reasons
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
from boxwatch.agent.preprocessing import InputRange, Preprocessing
from boxwatch.agent.taps import ONNX_SUFFIXES, Tap, open_tap


@dataclass(frozen=True)
class ModelResult:
    """Per-input outcome of one model batch, all arrays of shape (n_samples,)."""

    predicted: np.ndarray
    verdicts: np.ndarray
    layer_verdicts: dict[str, np.ndarray]
    scores: np.ndarray
    inference_seconds: float
    monitor_seconds: float
    # Inputs outside the preprocessed training range (None: the artifact records no range).
    out_of_range: np.ndarray | None = None
    # The score within the calibrated threshold (None: the monitor has no threshold).
    accepted: np.ndarray | None = None
    # Why each input got its verdict (None only where a caller built the result without it).
    reasons: Reasons | None = None


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
    input_range: InputRange | None = None

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
            pre = self.preprocessing.apply(x)
            logits, acts = self.tap.run(pre)
            t1 = time.perf_counter()
            logits = np.asarray(logits)
            predicted = logits.argmax(axis=1)
            verdicts, per_layer, scores, reasons = self.boxes.explain(
                acts, predicted, logits=logits
            )
        broken = _non_finite_rows(logits, acts)
        fail_closed = broken
        if scores is not None:
            fail_closed = broken | ~np.isfinite(np.asarray(scores, dtype=np.float64))
        if fail_closed.any():  # fail closed: NaN compares false, so it must never reach "accept"
            verdicts = np.where(fail_closed, REJECT, verdicts).astype(np.int8)
            per_layer = {
                layer: np.where(fail_closed, REJECT, v).astype(np.int8)
                for layer, v in per_layer.items()
            }
        if scores is None:
            scores = np.full(len(predicted), np.nan)
        accepted = None if self.boxes.threshold is None else self.boxes.decide(scores)
        outside = None if self.input_range is None else self.input_range.outside(pre)
        if outside is not None:  # the likelier cause, whatever the verdict; not_finite wins
            reasons = reasons.override(outside, OUT_OF_RANGE)
        reasons = reasons.override(broken, NOT_FINITE)
        t2 = time.perf_counter()
        return ModelResult(
            predicted, verdicts, per_layer, scores, t1 - t0, t2 - t1, outside, accepted, reasons
        )


def _non_finite_rows(logits: np.ndarray, acts: Mapping[str, np.ndarray]) -> np.ndarray:
    """Rows of a batch whose logits or tapped activations hold a NaN or infinity."""
    bad = ~np.isfinite(logits.reshape(len(logits), -1)).all(axis=1)
    for a in acts.values():
        a = np.asarray(a)
        bad |= ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
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
    try:
        return _runtime(artifact, model_path, threads)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError) as exc:
        # Signed, but not what this agent reads (a builder bug or a foreign signer's file).
        raise ArtifactError(
            f"{artifact_path}: artifact content is malformed ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]})"
        ) from None


def _runtime(artifact: Artifact, model_path: str | Path | None, threads: int) -> MonitorRuntime:
    members = artifact.members
    contents = artifact.contents
    spec: Mapping[str, Any] = artifact.json(MODEL_SPEC) if MODEL_SPEC in members else {}
    classes = [str(c) for c in spec.get("classes", contents.get("classes", []))]
    tap = boxes = preprocessing = input_range = None
    if spec:
        if model_path is None:
            raise ConfigError(
                "the artifact monitors a model: give its file (model / BOXWATCH_MODEL)"
            )
        model_path = check_model_digest(artifact, model_path)
        preprocessing = Preprocessing.from_dict(spec["preprocessing"])
        tap = open_tap(
            model_path, spec["layers"], pooling=spec.get("pooling", "flatten"), threads=threads
        )
        boxes = BoxRuntime.from_members(artifact.json, artifact.arrays, prefix=BOXES_PREFIX)
        if "input_range" in spec:
            try:
                input_range = InputRange.from_dict(spec["input_range"], preprocessing.size)
            except ConfigError as exc:
                raise ArtifactError(f"{MODEL_SPEC}: {exc}") from None
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
        input_range=input_range,
    )


def check_model_digest(artifact: Artifact, model_path: str | Path) -> Path:
    """The model file and every file recorded with it must match the artifact's digest.

    A symlink is resolved (the builder records the real file's name). The recorded files
    are hashed first; only then, for ONNX, is the graph read to confirm that the files it
    references are exactly the recorded ones (an artifact from an older builder may have
    signed the graph without its external weights). Returns the real model path, the one
    to open.
    """
    recorded = artifact.manifest.get("model")
    if not isinstance(recorded, dict):
        raise ArtifactError("the artifact records no model digest")
    if not Path(model_path).exists():
        raise MissingModelError(f"{model_path}: no such model file")
    real = _real_model_file(Path(model_path))
    folder = real.parent
    entries = recorded.get("files")
    if not isinstance(entries, list) or not all(
        isinstance(f, dict) and isinstance(f.get("name"), str) for f in entries
    ):
        raise ArtifactError("the artifact's model record has no valid file list")
    names = [f["name"] for f in entries]
    files: list[tuple[str, Path]] = [(real.name, real)]
    for name in names:
        if name == real.name:
            continue
        location = _inside(folder, name, f"model file {name!r} named in the artifact")
        if not location.is_file():
            raise ArtifactError(f"model weight file named in the artifact is missing: {location}")
        files.append((name, location))
    actual = digest_files(files)
    if actual["digest"] != recorded.get("digest"):
        raise ArtifactError(
            f"{model_path}: model digest {actual['digest'][:23]}… does not match the artifact's "
            f"{str(recorded.get('digest'))[:23]}…"
        )
    if real.suffix in ONNX_SUFFIXES:
        referenced = {name for name, _ in model_files(real)} - {real.name}
        unrecorded = sorted(referenced - set(names))
        if unrecorded:
            raise ArtifactError(
                f"{real}: the model loads files the artifact's digest does not cover: "
                f"{unrecorded} (rebuild the artifact)"
            )
    return real


def model_files(
    model_path: str | Path, *, declared: Sequence[str | Path] | None = None
) -> list[tuple[str, Path]]:
    """Every file the model loads, as ``(recorded name, real path)``: what its digest covers.

    The model file is resolved (symlinks followed) and recorded by its real name; a directory
    is refused. For ONNX the graph is read without its weights and every external-data
    reference is listed by its location, relative to the model's folder: a missing file, or
    one outside that folder (``..``, absolute, or a symlink leading out) is refused. A torch
    ``.pt2`` holds its weights: it is hashed whole. ``declared`` (the build config's
    ``model.external_data``), when given, must name exactly the referenced files.
    """
    real = _real_model_file(Path(model_path), error=ConfigError)
    files: list[tuple[str, Path]] = [(real.name, real)]
    if real.suffix in ONNX_SUFFIXES:
        for location in sorted(_onnx_external_locations(real)):
            files.append((location, _inside(real.parent, location, location, ConfigError)))
    if declared is not None:
        listed = {Path(p).resolve() for p in declared}
        referenced = {path for _, path in files[1:]}
        problems = []
        if listed - referenced:
            extra = sorted(str(p) for p in listed - referenced)
            problems.append(f"lists files the model does not reference: {extra}")
        if referenced - listed:
            missing = sorted(name for name, path in files[1:] if path not in listed)
            problems.append(f"omits files the model references: {missing}")
        if problems:
            raise ConfigError(f"model.external_data {'; '.join(problems)}")
    return files


def _real_model_file(path: Path, error: type[Exception] = ConfigError) -> Path:
    try:
        real = path.resolve(strict=True)
        mode = real.stat().st_mode
    except FileNotFoundError:
        raise error(f"{path}: no such file (the model)") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise error(f"{path}: cannot read the model ({exc})") from None
    if stat.S_ISDIR(mode):
        raise error(f"{path}: is a directory; give the model file")
    if not stat.S_ISREG(mode):
        raise error(f"{path}: the model is not a regular file")
    return real


def _inside(folder: Path, location: str, what: str, error: type[Exception] = ArtifactError) -> Path:
    """``folder / location`` resolved; refused when it leads outside ``folder``."""
    rel = PurePosixPath(location)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\\" in location:
        raise error(f"{what}: {location!r} is outside the model's folder")
    path = (folder / rel).resolve()
    if not path.is_relative_to(folder):
        raise error(f"{what}: {location!r} leads outside the model's folder (to {path})")
    if error is ConfigError and not path.is_file():
        raise error(f"model: external data {location!r} of the model: no such file ({path})")
    return path


def _onnx_external_locations(model_path: Path) -> set[str]:
    """The ``location`` of every external-data tensor of an ONNX graph (weights not loaded)."""
    try:
        import onnx
    except ImportError:
        raise ConfigError(
            "reading an ONNX model needs the 'onnx' package: pip install onnx"
        ) from None
    try:
        proto = onnx.load_model(str(model_path), load_external_data=False)
    except Exception as exc:  # onnx raises several unrelated types for bad files
        raise ConfigError(f"{model_path}: not a readable ONNX model ({exc})") from None
    locations = set()
    for tensor in _all_tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            if "location" not in entries:
                raise ConfigError(f"{model_path}: tensor {tensor.name!r} has no data location")
            locations.add(entries["location"])
    return locations


def _all_tensors(graph: Any) -> Iterator[Any]:
    """Initializers, sparse initializers and attribute tensors of a graph and its subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            yield from (s.values for s in attr.sparse_tensors)
            yield from (s.indices for s in attr.sparse_tensors)
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)
