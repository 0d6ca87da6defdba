"""The training set's predicted classes in the artifact (issue 41: a refit finds a class's
training rows without the model's pass): the digest, the member, and what the build stores."""

from __future__ import annotations

import numpy as np
import pytest
from example_build import ExampleArtifact, resigned

from boxwatch.agent.artifact import load_artifact
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.agent.members import TRAIN_PREDICTIONS
from boxwatch.offline.release.train_predictions import (
    PRED,
    SHA256,
    data_digest,
    predictions_member,
    stored_predictions,
)

RNG = np.random.default_rng(41)
X = RNG.normal(size=(50, 3, 4)).astype(np.float32)
Y = RNG.integers(0, 5, size=50)


def test_the_digest_reads_every_value_label_dtype_and_shape():
    base = data_digest(X, Y)
    assert data_digest(X.copy(), Y.copy()) == base and len(base) == 32
    moved = X.copy()
    moved[49, 2, 3] = np.nextafter(moved[49, 2, 3], np.inf)
    relabelled = Y.copy()
    relabelled[0] = (relabelled[0] + 1) % 5
    others = [
        data_digest(moved, Y),
        data_digest(X, relabelled),
        data_digest(X.astype(np.float64), Y),
        data_digest(X.reshape(50, 12), Y),
        data_digest(X, Y.astype(np.int32)),
        data_digest(X, None),
        data_digest(X[:49], Y[:49]),
    ]
    assert len({base, *others}) == len(others) + 1


def test_the_digest_of_a_strided_set_is_the_digest_of_its_values():
    wide = np.zeros((50, 3, 8), np.float32)
    wide[:, :, ::2] = X
    strided = wide[:, :, ::2]
    assert not strided.flags.c_contiguous
    assert data_digest(strided, Y) == data_digest(X, Y)


@pytest.mark.parametrize("n_classes, dtype", [(2, np.uint8), (256, np.uint8), (300, np.uint16)])
def test_the_member_holds_the_classes_in_the_smallest_type(n_classes, dtype):
    pred = np.arange(50) % n_classes
    member = predictions_member(X, Y, pred, n_classes)
    assert member[PRED].dtype == dtype and np.array_equal(member[PRED], pred)
    assert member[SHA256].dtype == np.uint8 and member[SHA256].tobytes() == data_digest(X, Y)


@pytest.mark.parametrize(
    "pred, n_classes", [(np.zeros(49, int), 5), (np.full(50, 5), 5), (np.full(50, -1), 5)]
)
def test_the_member_refuses_predictions_that_do_not_fit_the_set(pred, n_classes):
    with pytest.raises(ValueError):
        predictions_member(X, Y, pred, n_classes)


def test_the_build_stores_the_models_prediction_of_each_training_row(
    model_example: ExampleArtifact,
):
    art = load_artifact(model_example.artifact, None)
    train = np.load(model_example.data / "train.npz")
    x, y = train["x"], train["y"]
    stored = stored_predictions(art, x, y, 8)
    assert stored is not None and stored.dtype == np.int64
    assert np.array_equal(stored, model_example.runtime().run_model(x).predicted)
    assert art.arrays(TRAIN_PREDICTIONS)[PRED].dtype == np.uint8


@pytest.fixture(scope="module")
def train(model_example: ExampleArtifact) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The example's training inputs, labels and stored predictions."""
    data = np.load(model_example.data / "train.npz")
    art = load_artifact(model_example.artifact, None)
    return data["x"], data["y"], art.arrays(TRAIN_PREDICTIONS)[PRED]


def test_an_artifact_built_before_holds_none(model_example, train):
    old = load_artifact(resigned(model_example, {TRAIN_PREDICTIONS: None}), None)
    assert stored_predictions(old, train[0], train[1], 8) is None


def test_other_training_data_are_refused(model_example, train):
    x, y, _pred = train
    art = load_artifact(model_example.artifact, None)
    other = x.copy()
    other[3, 5] += 1
    with pytest.raises(ConfigError, match="data.train: not the training set the parent") as err:
        stored_predictions(art, other, y, 8)
    assert len(err.value.problems) == 1 and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="data.train"):
        stored_predictions(art, x, np.roll(y, 1), 8)


@pytest.mark.parametrize(
    "change, needle",
    [
        ("short", "predicted classes for"),
        ("class", "outside"),
        ("float", "not the training rows"),
        ("digest", "not the training rows"),
        ("missing", "not the training rows"),
        ("stale", "data.train: not the training set"),
    ],
)
def test_a_signed_member_that_does_not_fit_is_refused(model_example, train, change, needle):
    x, y, pred = train
    digest = np.frombuffer(data_digest(x, y), np.uint8)
    member = {
        "short": {PRED: pred[:-1], SHA256: digest},
        "class": {PRED: np.full_like(pred, 8), SHA256: digest},
        "float": {PRED: pred.astype(np.float32), SHA256: digest},
        "digest": {PRED: pred, SHA256: digest[:16]},
        "missing": {PRED: pred},
        "stale": {PRED: pred, SHA256: np.zeros(32, np.uint8)},
    }[change]
    art = load_artifact(resigned(model_example, {TRAIN_PREDICTIONS: member}), None)
    error = ConfigError if change == "stale" else ArtifactError
    with pytest.raises(error, match=needle):
        stored_predictions(art, x, y, 8)


def test_a_tampered_member_stops_the_load(model_example):
    data = bytearray(model_example.artifact.read_bytes())
    at = data.index(b"pred.npy")  # the member's own zip entry
    data[at + 200] ^= 0x01  # one of the stored classes
    with pytest.raises(ArtifactError, match=TRAIN_PREDICTIONS):
        load_artifact(bytes(data), None)
