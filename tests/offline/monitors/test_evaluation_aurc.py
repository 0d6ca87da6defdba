"""AURC, the area under the risk-coverage curve: hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from boxwatch.offline.monitors.evaluation import aurc


def test_aurc_is_the_mean_risk_over_coverages():
    # Trusted order 0.1, 0.2, 0.3, 0.4 with errors F T F T: risks 0, 1/2, 1/3, 2/4.
    scores = np.array([0.3, 0.1, 0.4, 0.2])
    errors = np.array([False, False, True, True])
    assert aurc(scores, errors) == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4)


def test_aurc_rewards_ranking_the_errors_last():
    errors = np.array([False, False, True, True])
    best = aurc(np.array([1.0, 2.0, 3.0, 4.0]), errors)  # risks 0, 0, 1/3, 2/4
    worst = aurc(np.array([4.0, 3.0, 2.0, 1.0]), errors)  # risks 1, 1, 2/3, 2/4
    assert best == pytest.approx((1 / 3 + 1 / 2) / 4)
    assert worst == pytest.approx((1 + 1 + 2 / 3 + 1 / 2) / 4)


def test_aurc_shares_errors_among_tied_scores_and_ranks_nan_last():
    # One score for all: every coverage has the overall error rate, whatever the order.
    assert aurc(np.zeros(4), np.array([True, False, False, False])) == pytest.approx(0.25)
    assert aurc(np.zeros(4), np.array([False, False, False, True])) == pytest.approx(0.25)
    assert aurc(np.array([np.nan, 0.0]), np.array([True, False])) == pytest.approx(0.25)


def test_aurc_refuses_mismatched_or_non_bool_errors():
    with pytest.raises(ValueError, match="2 scores and 3 errors"):
        aurc(np.zeros(2), np.zeros(3, bool))
    with pytest.raises(ValueError, match="dtype int64"):
        aurc(np.zeros(2), np.array([0, 1]))
