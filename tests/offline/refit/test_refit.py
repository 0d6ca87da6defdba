"""``refit`` (issue 41 points 2 and 3): the example's parent artifact, captures of a shifted
stream labelled as a reviewer would, and the child artifact the refit signs.

The shifted stream is the example's held-out digits moved one pixel to the right (a
writer-style shift the parent rejects most of); the reviewer labels the captures of two
classes by their true digit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from example_build import ExampleArtifact, resigned

from boxwatch.agent.artifact import load_artifact
from boxwatch.agent.boxes import ACCEPT, BoxRuntime, normalize_features
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.agent.members import BOXES_PREFIX, REFIT, REFIT_ROWS, TRAIN_PREDICTIONS
from boxwatch.agent.runtime import ModelResult, MonitorRuntime, load_runtime
from boxwatch.cli import cli
from boxwatch.commands.console import EXIT_OK
from boxwatch.offline.progress import Progress
from boxwatch.offline.refit.feedback import (
    CORRECT,
    UNKNOWN,
    WRONG,
    Captures,
    Label,
    LabelledCaptures,
)
from boxwatch.offline.refit.refit import RefitGuardError, RefitSummary, _train_rows, refit
from boxwatch.offline.refit.refit import _model as refit_model
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.monitor_stage import Tapped
from boxwatch.offline.release.pipeline import prepare_model
from boxwatch.offline.release.records import ModelInputs
from boxwatch.offline.release.train_predictions import stored_predictions

CLASSES = (6, 7)  # the classes whose captures the reviewer labels
CREATED_AT = 1_700_000_100


@dataclass(frozen=True)
class Shifted:
    """The shifted stream: raw inputs, true labels, the parent's results on them."""

    x: np.ndarray
    y: np.ndarray
    parent: ModelResult


@dataclass(frozen=True)
class Refitted:
    """One refit of the shifted stream's labelled captures, and what it wrote."""

    labelled: LabelledCaptures
    summary: RefitSummary
    child: Path
    parent: MonitorRuntime


def labelled_captures(
    x: np.ndarray, kinds: list[str], y_true: np.ndarray, y_pred: np.ndarray, prefix: str = "r"
) -> LabelledCaptures:
    """Labelled captures of the inputs ``x`` (the join's output, built directly)."""
    n = len(x)
    ids = [f"{prefix}{i}" for i in range(n)]
    captures = Captures(
        ids=ids,
        inputs=np.asarray(x, np.float32),
        timestamps_ms=np.arange(n, dtype=np.int64),
        verdicts=["reject"] * n,
        reasons=["outside_boxes"] * n,
        layers=[None] * n,
        nearest_classes=[None] * n,
    )
    labels = [
        Label(i, kind, str(int(t)) if kind == WRONG else None)
        for i, kind, t in zip(ids, kinds, y_true, strict=True)
    ]
    return LabelledCaptures(
        captures, labels, np.asarray(y_true, np.int64), np.asarray(y_pred, np.int64)
    )


def reviewed(shifted: Shifted, classes: tuple[int, ...] = CLASSES) -> LabelledCaptures:
    """The captures (inputs the parent did not accept) predicted as one of ``classes``,
    labelled by their true digit: ``correct`` where the model was right, else ``wrong``."""
    rows = np.flatnonzero(
        (shifted.parent.verdicts != ACCEPT) & np.isin(shifted.parent.predicted, classes)
    )
    pred, true = shifted.parent.predicted[rows], shifted.y[rows]
    kinds = [CORRECT if p == t else WRONG for p, t in zip(pred, true, strict=True)]
    return labelled_captures(shifted.x[rows], kinds, true, pred)


def run_refit(
    example: ExampleArtifact,
    labelled: LabelledCaptures,
    out: Path,
    *,
    parent: Path | None = None,
    config: Path | None = None,
    **kwargs,
) -> RefitSummary:
    """The example's refit (another parent or config where given), signed with its key."""
    kwargs.setdefault("created_at", CREATED_AT)
    return refit(
        example.artifact if parent is None else parent,
        [str(example.public_key)],
        example.config if config is None else config,
        labelled,
        private_key=example.private_key,
        out=out,
        **kwargs,
    )


def boxes_of(path: Path) -> BoxRuntime:
    art = load_artifact(path, None)
    return BoxRuntime.from_members(art.json, art.arrays, prefix=BOXES_PREFIX)


def features(runtime: MonitorRuntime, x: np.ndarray) -> dict[str, np.ndarray]:
    """Each monitored layer's normalised activations of the raw inputs ``x``."""
    assert runtime.tap is not None and runtime.preprocessing is not None
    assert runtime.boxes is not None
    _logits, acts = runtime.tap.run(runtime.preprocessing.apply(x))
    return {
        layer: normalize_features(np.asarray(a).reshape(len(x), -1), runtime.boxes.normalize)
        for layer, a in acts.items()
    }


@pytest.fixture(scope="module")
def shifted(model_example: ExampleArtifact) -> Shifted:
    stream = np.load(model_example.data / "stream.npz")
    x = np.roll(stream["x_known"].reshape(-1, 8, 8), 1, axis=2).reshape(-1, 64)
    x = x.astype(np.float32)
    return Shifted(x, stream["y_known"], model_example.runtime().run_model(x))


@pytest.fixture(scope="module")
def refitted(
    model_example: ExampleArtifact, shifted: Shifted, tmp_path_factory: pytest.TempPathFactory
) -> Refitted:
    labelled = reviewed(shifted)
    child = tmp_path_factory.mktemp("refit") / "child.bwa"
    summary = run_refit(model_example, labelled, child)
    return Refitted(labelled, summary, child, model_example.runtime())


def test_the_captures_are_rejected_and_hold_both_kinds_of_label(refitted):
    kinds = [label.kind for label in refitted.labelled.labels]
    assert kinds.count(CORRECT) >= 10 and kinds.count(WRONG) >= 10
    assert refitted.summary.captures == {
        CORRECT: kinds.count(CORRECT),
        WRONG: kinds.count(WRONG),
        UNKNOWN: 0,
        "new": 0,
        "left_out": 0,
    }


def test_unaffected_classes_keep_the_parents_boxes_byte_for_byte(model_example, refitted):
    old, new = boxes_of(model_example.artifact), boxes_of(refitted.child)
    assert [c.index for c in refitted.summary.classes] == list(CLASSES)
    for layer in old.layers:
        for kind in ("good", "bad"):
            before, after = getattr(old, kind)[layer], getattr(new, kind)[layer]
            for c in range(old.n_classes):
                if c in CLASSES:
                    continue
                for a, b in zip(before.boxes_of(c), after.boxes_of(c), strict=True):
                    assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (layer, kind, c)


def test_affected_classes_are_reclustered_around_their_captures(model_example, refitted):
    old, new = boxes_of(model_example.artifact), boxes_of(refitted.child)
    labelled = refitted.labelled
    kinds = np.asarray([label.kind for label in labelled.labels])
    feats = features(refitted.parent, labelled.captures.inputs)
    right, wrong = kinds == CORRECT, kinds == WRONG
    for layer in old.layers:
        x, pred = feats[layer], labelled.y_pred
        changed = [
            not np.array_equal(old.good[layer].boxes_of(c)[0], new.good[layer].boxes_of(c)[0])
            for c in CLASSES
        ]
        assert all(changed), layer
        before = old.good[layer].contains(x[right], pred[right]).mean()
        after = new.good[layer].contains(x[right], pred[right]).mean()
        assert after == 1.0 and before < 0.5, (layer, before, after)
        # A wrong label makes a bad box of the predicted class, which now holds the input.
        assert new.bad[layer].contains(x[wrong], pred[wrong]).all(), layer
        assert old.bad[layer].contains(x[wrong], pred[wrong]).mean() < 0.5, layer


def test_the_child_verifies_loads_and_accepts_the_captured_correct_inputs(model_example, refitted):
    res = CliRunner().invoke(
        cli,
        ["verify-artifact", str(refitted.child), "--public-key", str(model_example.public_key)],
        env={},
        catch_exceptions=False,
    )
    assert res.exit_code == EXIT_OK, res.output
    child = load_runtime(
        refitted.child, [str(model_example.public_key)], model_path=model_example.model
    )
    labelled = refitted.labelled
    right = np.asarray([label.kind == CORRECT for label in labelled.labels])
    x = labelled.captures.inputs[right]
    before = np.mean(refitted.parent.run_model(x).verdicts == ACCEPT)
    after = np.mean(child.run_model(x).verdicts == ACCEPT)
    assert before == 0.0 and after >= 0.8
    # The inputs labelled wrong stay unaccepted.
    assert not np.any(child.run_model(labelled.captures.inputs[~right]).verdicts == ACCEPT)


def test_the_child_records_its_parent_and_what_changed(model_example, refitted):
    child = load_artifact(refitted.child, None)
    record = child.json(REFIT)
    parent_bytes = model_example.artifact.read_bytes()
    parent = load_artifact(parent_bytes, None)
    assert record["parent"] == {
        "artifact_id": parent.artifact_id,
        "sha256": hashlib.sha256(parent_bytes).hexdigest(),
    }
    assert child.contents["refit"]["parent_sha256"] == record["parent"]["sha256"]
    assert child.manifest["model"] == parent.manifest["model"]
    assert child.manifest["config"] == parent.manifest["config"]
    assert set(child.members) == set(parent.members) | {REFIT, REFIT_ROWS}
    rows = child.arrays(REFIT_ROWS)  # the captured rows its boxes hold, for the next refit
    boxed = [label.kind in (CORRECT, WRONG) for label in refitted.labelled.labels]
    assert np.array_equal(rows["inputs"], refitted.labelled.captures.inputs[boxed])
    assert np.array_equal(rows["y_true"], refitted.labelled.y_true[boxed])
    labelled = refitted.labelled
    for change in record["classes"]:
        mine = labelled.y_pred == change["index"]
        kinds = [label.kind for label, m in zip(labelled.labels, mine, strict=True) if m]
        assert change["captures"] == {CORRECT: kinds.count(CORRECT), WRONG: kinds.count(WRONG)}
        assert set(change["boxes"]) == set(boxes_of(refitted.child).layers)
        counts = boxes_of(refitted.child).good
        for layer, boxes in change["boxes"].items():
            assert boxes["good"][1] == counts[layer].counts()[change["index"]]
    point = record["operating_point"]
    assert point["before"]["threshold"] == pytest.approx(parent.contents["monitors"]["threshold"])
    assert point["after"]["threshold"] == pytest.approx(child.contents["monitors"]["threshold"])
    rows = {(r["data"], r["measure"]): r for r in record["table"]}
    assert rows["captures", "correct_known"]["before"] == 0.0
    assert rows["captures", "correct_known"]["after"] >= 0.8
    assert rows["validation", "correct_known"]["before"] == pytest.approx(
        parent.contents["verdict_split"]["correct_known"]["accept"]
    )
    assert all(g["passed"] for g in record["guards"]) and record["overridden"] == []
    assert refitted.summary.child_sha256 == hashlib.sha256(refitted.child.read_bytes()).hexdigest()
    assert json.loads(json.dumps(refitted.summary.to_dict()))["child"]["path"] == str(
        refitted.child
    )
    assert refitted.summary.table_rows()[0] == ("data", "measure", "n", "before", "after")


def test_the_same_inputs_give_the_same_child_bytes(model_example, refitted, tmp_path):
    again = tmp_path / "again.bwa"
    run_refit(model_example, refitted.labelled, again)
    assert again.read_bytes() == refitted.child.read_bytes()


@pytest.fixture(scope="module")
def unknowns_labelled_correct(model_example: ExampleArtifact) -> LabelledCaptures:
    """Unknown digits (8 and 9) the parent rejects, labelled ``correct`` as predicted: boxes
    that learn them let the unknown set through."""
    x = np.load(model_example.data / "unknown_digits.npz")["x"][:80]
    res = model_example.runtime().run_model(x)
    rows = np.flatnonzero(res.verdicts != ACCEPT)
    pred = res.predicted[rows]
    return labelled_captures(x[rows], [CORRECT] * len(rows), pred, pred, prefix="u")


def test_a_guard_trips_when_labels_widen_boxes_over_unknowns(
    model_example, unknowns_labelled_correct, tmp_path
):
    out = tmp_path / "child.bwa"
    with pytest.raises(RefitGuardError) as caught:
        run_refit(model_example, unknowns_labelled_correct, out)
    err = caught.value
    assert "\n" not in str(err) and "unknown_acceptance:unknown_digits" in str(err)
    assert not out.exists()
    assert err.summary.child_id is None and err.summary.failed
    allowed = run_refit(model_example, unknowns_labelled_correct, out, allow_guard_failure=True)
    record = load_artifact(out, None).json(REFIT)
    assert record["overridden"] == [g.name for g in err.summary.failed] == allowed.overridden
    assert "unknown_acceptance:unknown_digits" in record["overridden"]
    rows = {(r["data"], r["measure"]): r for r in record["table"]}
    digits = rows["validation", "unknown:unknown_digits"]
    assert digits["after"] > digits["before"] + 0.01


def test_a_tampered_parent_stops_with_one_line(model_example, shifted, tmp_path):
    tampered = tmp_path / "tampered.bwa"
    data = bytearray(model_example.artifact.read_bytes())
    at = data.index(b"threshold")  # inside the signed manifest
    data[at] ^= 0x20
    tampered.write_bytes(bytes(data))
    with pytest.raises(ArtifactError) as caught:
        run_refit(model_example, reviewed(shifted), tmp_path / "child.bwa", parent=tampered)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "child.bwa").exists()


def test_a_config_other_than_the_parents_is_refused(model_example, shifted, tmp_path):
    raw = yaml.safe_load(model_example.config.read_text())
    raw["monitor"]["target_acceptance"] = 0.9
    other = tmp_path / "build.yaml"
    other.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as caught:
        run_refit(model_example, reviewed(shifted), tmp_path / "child.bwa", config=other)
    assert len(caught.value.problems) == 1 and "\n" not in str(caught.value)
    assert "monitor.target_acceptance" in str(caught.value)


def test_a_re_serialised_copy_of_the_config_is_accepted(model_example, refitted, tmp_path):
    raw = yaml.safe_load(model_example.config.read_text())
    copy = tmp_path / "copy.yaml"
    copy.write_text(yaml.safe_dump(raw, sort_keys=True, indent=4))
    shutil.copytree(model_example.data, tmp_path / "data")
    assert copy.read_bytes() != model_example.config.read_bytes()
    out = tmp_path / "child.bwa"
    run_refit(model_example, refitted.labelled, out, config=copy)
    assert out.read_bytes() == refitted.child.read_bytes()


def test_no_usable_label_is_refused(model_example, shifted, tmp_path):
    x = shifted.x[:5]
    pred = shifted.parent.predicted[:5]
    unknown = labelled_captures(x, [UNKNOWN] * 5, np.full(5, -1), pred)
    with pytest.raises(ConfigError, match="no usable label"):
        run_refit(model_example, unknown, tmp_path / "a.bwa")
    # The join's prediction disagrees with the model's: the labels cannot be trusted.
    misjoined = labelled_captures(x, [CORRECT] * 5, (pred + 1) % 8, (pred + 1) % 8)
    with pytest.raises(ConfigError, match="no usable label") as caught:
        run_refit(model_example, misjoined, tmp_path / "b.bwa")
    assert "5 left out" in str(caught.value)
    empty = labelled_captures(x[:0], [], np.zeros(0), np.zeros(0))
    with pytest.raises(ConfigError, match="no usable label"):
        run_refit(model_example, empty, tmp_path / "c.bwa")
    assert not any(tmp_path.iterdir())


def test_captures_that_cannot_be_trusted_are_left_out_and_listed(model_example, refitted, tmp_path):
    labelled = refitted.labelled
    y_pred = labelled.y_pred.copy()
    y_pred[0] = (y_pred[0] + 1) % 8  # the join's prediction is not the model's
    y_true = labelled.y_true.copy()
    kinds = [label.kind for label in labelled.labels]
    contradicting = next(i for i, k in enumerate(kinds) if k == WRONG and i > 0)
    y_true[contradicting] = y_pred[contradicting]  # "wrong: <the predicted class>"
    broken = labelled_captures(labelled.captures.inputs, kinds, y_true, y_pred)
    summary = run_refit(model_example, broken, tmp_path / "child.bwa")
    assert summary.captures["left_out"] == 2
    assert summary.left_out[0].startswith("'r0': the model predicts class")
    assert "contradicts the prediction" in summary.left_out[1]
    record = load_artifact(tmp_path / "child.bwa", None).json(REFIT)
    assert record["left_out"] == summary.left_out


def test_a_child_refits_as_a_parent(model_example, refitted, shifted, tmp_path):
    grandchild = tmp_path / "grandchild.bwa"
    summary = run_refit(
        model_example, reviewed(shifted, classes=(4,)), grandchild, parent=refitted.child
    )
    record = load_artifact(grandchild, None).json(REFIT)
    assert record["parent"]["artifact_id"] == refitted.summary.child_id
    assert [c["index"] for c in record["classes"]] == [4]
    child, last = boxes_of(refitted.child), boxes_of(grandchild)
    for c in CLASSES:  # the first refit's classes keep its boxes
        assert np.array_equal(child.good["input"].boxes_of(c)[0], last.good["input"].boxes_of(c)[0])
    assert summary.failed == []


def test_refitting_a_class_again_keeps_the_earlier_captures(model_example, refitted, tmp_path):
    """A second refit of a class clusters the first refit's captured rows again (the child
    carries them), so the first widening stays: every first-round correct capture of the
    class lies in the grandchild's good boxes as in the child's."""
    first = refitted.labelled
    right = first.y_pred[first.y_true == first.y_pred]
    c = max(CLASSES, key=lambda k: int(np.sum(right == k)))
    mine = np.flatnonzero((first.y_pred == c) & (first.y_true == c))
    assert len(mine) >= 2
    again = labelled_captures(
        first.captures.inputs[mine[:1]], [CORRECT], first.y_true[mine[:1]], first.y_pred[mine[:1]]
    )
    grandchild = tmp_path / "grandchild.bwa"
    summary = run_refit(
        model_example, again, grandchild, parent=refitted.child, allow_guard_failure=True
    )
    assert [k.index for k in summary.classes] == [c]
    feats = features(refitted.parent, first.captures.inputs[mine])
    for path in (refitted.child, grandchild):
        boxes = boxes_of(path)
        for layer in boxes.layers:
            inside = boxes.good[layer].contains(feats[layer], np.full(len(mine), c))
            assert inside.all(), (path.name, layer, int(inside.sum()), len(mine))


def same_child(a: Path, b: Path) -> None:
    """``a`` and ``b`` hold the same boxes, rows, record and contents, but for the parent
    they name and the parent's stored predictions they carry."""
    first, second = load_artifact(a, None), load_artifact(b, None)
    names = set(first.members) | set(second.members)
    for name in names - {REFIT, TRAIN_PREDICTIONS}:
        assert first.members.get(name) == second.members.get(name), name
    records = [first.json(REFIT), second.json(REFIT)]
    contents = [dict(first.contents), dict(second.contents)]
    for record, content in zip(records, contents, strict=True):
        record.pop("parent")
        content["refit"] = {k: v for k, v in content["refit"].items() if "parent" not in k}
    assert records[0] == records[1] and contents[0] == contents[1]


def test_a_parent_without_stored_predictions_gives_the_same_child(
    model_example, refitted, tmp_path
):
    """A parent built before the training rows' predictions were stored (the member
    removed, signed again): the refit runs the whole training set through the model to
    find the rows, and makes the child the stored predictions made."""
    old = tmp_path / "old.bwa"
    old.write_bytes(resigned(model_example, {TRAIN_PREDICTIONS: None}))
    out = tmp_path / "child.bwa"
    run_refit(model_example, refitted.labelled, out, parent=old)
    assert TRAIN_PREDICTIONS not in load_artifact(out, None).members
    same_child(refitted.child, out)


class CountingTap:
    """The real tap, counting the rows it runs."""

    def __init__(self, tap: Any):
        self.tap, self.rows = tap, 0

    def run(self, x: np.ndarray) -> Any:
        self.rows += len(x)
        return self.tap.run(x)


@pytest.fixture(scope="module")
def prepared(model_example: ExampleArtifact) -> tuple[ModelInputs, np.ndarray]:
    """The model as the refit prepares it, and the parent's stored predictions."""
    art = load_artifact(model_example.artifact, None)
    mi = refit_model(prepare_model(load_config(model_example.config)), art, model_example.model)
    stored = stored_predictions(art, *mi.data["train"], len(mi.classes))
    assert stored is not None
    return mi, stored


def train_rows(mi: ModelInputs, stored: np.ndarray | None) -> tuple[Tapped, int]:
    """:func:`_train_rows` of :data:`CLASSES`, and the rows the model ran."""
    counted = CountingTap(mi.tap)
    n = len(mi.data["train"][0])
    with Progress(mode="off").phase("rows", n) as bar:
        rows = _train_rows(dataclasses.replace(mi, tap=counted), list(CLASSES), stored, bar)
        assert bar.done == n
    return rows, counted.rows


def same_rows(a: Tapped, b: Tapped) -> bool:
    return (
        np.array_equal(a.pred, b.pred)
        and np.array_equal(a.labels, b.labels)
        and a.logits.tobytes() == b.logits.tobytes()
        and all(a.acts[k].tobytes() == b.acts[k].tobytes() for k in a.acts)
    )


def test_stored_predictions_send_only_the_affected_rows_through_the_model(prepared):
    mi, stored = prepared
    fast, ran = train_rows(mi, stored)
    slow, ran_all = train_rows(mi, None)
    assert ran == int(np.isin(stored, CLASSES).sum()) < ran_all / 2
    assert ran_all == len(stored)
    assert set(fast.pred) == set(CLASSES) and same_rows(fast, slow)


def test_stored_predictions_the_model_contradicts_fall_back_to_the_full_pass(prepared):
    """A row stored as an affected class that the model predicts otherwise (as outputs that
    depend on the batch would): the rows are found by the model's pass over the whole set."""
    mi, stored = prepared
    wrong = stored.copy()
    wrong[np.flatnonzero(~np.isin(stored, CLASSES))[0]] = CLASSES[0]
    found, ran = train_rows(mi, wrong)
    assert ran == int(np.isin(wrong, CLASSES).sum()) + len(stored)
    assert same_rows(found, train_rows(mi, None)[0])


def test_training_data_other_than_the_parents_are_refused(model_example, refitted, tmp_path):
    config = tmp_path / "build.yaml"
    shutil.copy(model_example.config, config)
    shutil.copytree(model_example.data, tmp_path / "data")
    train = dict(np.load(tmp_path / "data" / "train.npz"))
    train["y"][0] = (train["y"][0] + 1) % 8  # one relabelled training input
    np.savez(tmp_path / "data" / "train.npz", **train)
    out = tmp_path / "child.bwa"
    with pytest.raises(ConfigError, match="data.train: not the training set") as caught:
        run_refit(model_example, refitted.labelled, out, config=config)
    assert "\n" not in str(caught.value) and not out.exists()


def test_a_class_no_training_row_is_predicted_as_gets_no_row(prepared):
    mi, stored = prepared
    none = np.where(np.isin(stored, CLASSES), 0, stored)
    with Progress(mode="off").phase("rows", len(stored)) as bar:
        rows = _train_rows(mi, list(CLASSES), none, bar)
    some, _ran = train_rows(mi, stored)
    assert len(rows.pred) == len(rows.labels) == len(rows.logits) == 0
    assert rows.logits.shape[1:] == some.logits.shape[1:]
    for layer in mi.layers:
        assert rows.acts[layer].shape == (0, some.acts[layer].shape[1]), layer
        assert rows.acts[layer].dtype == some.acts[layer].dtype
