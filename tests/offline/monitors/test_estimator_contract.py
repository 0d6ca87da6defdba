"""``BoxMonitor`` honours scikit-learn's estimator contract (issue 28, item 4)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.utils import estimator_checks

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.monitors.estimator import BoxMonitor, MonitorValueError


def synthetic(seed=0, n=200, d=4, n_classes=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, size=n)
    centres = np.random.default_rng(100).normal(scale=4.0, size=(n_classes, d))
    acts = {"a": centres[y] + rng.normal(size=(n, d))}
    return acts, y, y.copy()


def test_not_fitted_is_sklearns_error():
    acts, _y, pred = synthetic()
    mon = BoxMonitor(["a"])
    for call in (
        lambda: mon.predict(acts, pred),
        lambda: mon.score_samples(acts, pred),
        lambda: mon.outlier_score(acts, pred),
        lambda: mon.calibrate(acts, pred),
        lambda: mon.to_members(),
    ):
        with pytest.raises(NotFittedError):
            call()


def test_data_and_parameter_errors_are_value_errors():
    acts, y, pred = synthetic()
    with pytest.raises(ValueError, match="rows") as info:
        BoxMonitor(["a"], tau=0.5).fit({"a": acts["a"][:10]}, y, pred)
    assert isinstance(info.value, ConfigError)  # the builder lists it with other problems
    with pytest.raises(MonitorValueError, match="combine='vote'"):
        BoxMonitor(["a"], combine="vote").fit(acts, y, pred)


def test_empty_input_is_checked_first():
    with pytest.raises(ValueError, match="no inputs"):
        BoxMonitor(["a"]).fit({"a": np.zeros((0, 4))}, np.zeros(0, int), np.zeros(0, int))


def test_score_samples_has_sklearns_sign():
    acts, y, pred = synthetic()
    mon = BoxMonitor(["a"], tau=0.5, score="distance").fit(acts, y, pred)
    far = {"a": acts["a"] + 50.0}
    np.testing.assert_array_equal(mon.score_samples(acts, pred), -mon.outlier_score(acts, pred))
    # the lower, the more abnormal
    assert np.all(mon.score_samples(far, pred) < mon.score_samples(acts, pred))


def _boxes(mon: BoxMonitor):
    return {k: v for k, v in mon.to_members()["monitors/boxes.npz"].items()}


@pytest.mark.parametrize("make_state", [lambda: 7, lambda: np.random.RandomState(7)])
def test_random_state_is_resolved_once(make_state):
    """The same random_state (an int, or equal RandomState objects) gives the same boxes,
    with the tau search drawing from it too (tau='auto' without validation data)."""
    acts, y, pred = synthetic(3)
    first = BoxMonitor(["a"], random_state=make_state(), max_clusters=4).fit(acts, y, pred)
    again = BoxMonitor(["a"], random_state=make_state(), max_clusters=4).fit(acts, y, pred)
    a, b = _boxes(first), _boxes(again)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "check",
    [
        estimator_checks.check_parameters_default_constructible,
        estimator_checks.check_no_attributes_set_in_init,
        estimator_checks.check_get_params_invariance,
        estimator_checks.check_set_params,
    ],
    ids=lambda c: c.__name__,
)
def test_sklearn_estimator_checks_that_apply(check):
    """The checks that need no ``fit(X, y)``: BoxMonitor fits activations per layer and the
    network's predictions, which scikit-learn's generic checks cannot feed it."""
    check("BoxMonitor", BoxMonitor())
