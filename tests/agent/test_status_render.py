"""The status page's content (issue 29, point 11), rendered without a browser: the current
rate, broker / lag / paused state, the build's verdict split beside the live one, and only
the sections the artifact has. ``test_status_page.py`` renders it in Chromium."""

from __future__ import annotations

import time

import pytest

from boxwatch.agent.http import render_status_page
from boxwatch.agent.service import RATE_WINDOW_S, AgentStatus

SPLIT = {
    "correct_known": {"accept": 0.9, "uncertainty": 0.06, "reject": 0.04, "n": 250},
    "unknown:noise": {"accept": 0.01, "uncertainty": 0.09, "reject": 0.9, "n": 100},
}


def info(**extra):
    status = AgentStatus(started=1000.0)
    status.verdicts.update({"accept": 8, "reject": 2})
    return {
        **status.snapshot(),
        "artifact_id": "art",
        "model_version": "v1",
        "ready": True,
        "monitors_model": True,
        "has_bn": True,
        **extra,
    }


def test_rate_is_over_the_last_minute_not_the_lifetime():
    status = AgentStatus(started=1000.0)
    for k in range(11):  # a burst of 2,500 records in 1.1 s, 100 s after start
        status.count_batch(2500 // 11 + (k < 2500 % 11), now=1100.0 + k * 0.11)
    assert status.records == 2500
    assert status.recent_rate(now=1101.2) == 2500 / RATE_WINDOW_S
    assert status.recent_rate(now=1100.0 + RATE_WINDOW_S + 5) == 0.0
    status.count_batch(30, now=1200.0)
    assert status.recent_rate(now=1201.0) == 30 / RATE_WINDOW_S


def test_a_burst_reads_at_its_own_rate_beside_the_minute_and_the_lifetime(monkeypatch):
    """Issue 39, point 7b: a burst of ~2,300 records/s, 100 s after start, reads as that
    while busy, as ~42/s over the last minute and ~25/s since start, each named so."""
    status = AgentStatus(started=1000.0)
    for k in range(11):  # 2,500 records in 11 batches of 0.1 s each
        now = 1100.0 + k * 0.11
        status.count_batch(2500 // 11 + (k < 2500 % 11), now=now)
        status.count_busy(0.1, now=now)
    assert status.busy_rate(now=1101.2) == pytest.approx(2500 / 1.1)
    assert status.busy_rate(now=1100.0 + RATE_WINDOW_S + 5) is None  # no batch in the window
    monkeypatch.setattr(time, "time", lambda: 1101.2)
    snap = status.snapshot()
    assert snap["records_per_second_busy_1m"] == pytest.approx(2500 / 1.1)
    assert snap["records_per_second_1m"] == pytest.approx(2500 / RATE_WINDOW_S)
    assert snap["records_per_second_since_start"] == pytest.approx(2500 / 101.2)
    assert snap["records_per_second"] == snap["records_per_second_since_start"]  # old name
    page = render_status_page(info(**snap))
    assert 'id="rate-busy">2272.7<' in page and 'id="rate-1m">41.7<' in page
    assert "records/s since start (average)" in page and 'id="rate-lifetime">24.7<' in page


def test_broker_lag_and_paused_state_are_shown():
    page = render_status_page(info(broker_connected=False, paused=True, lag=1234))
    assert 'id="broker">not connected<' in page
    assert 'id="paused">paused' in page and 'id="lag">1234<' in page
    page = render_status_page(info(broker_connected=True, paused=False))
    assert 'id="broker">connected<' in page and 'id="paused">running<' in page


def test_build_split_beside_the_live_one_only_when_recorded():
    page = render_status_page(info(build_verdict_split=SPLIT))
    assert "build: correct_known (n=250)" in page and "build: unknown:noise (n=100)" in page
    assert 'id="build-correct_known-accept">0.900<' in page
    assert 'id="build-unknown:noise-reject">0.900<' in page
    assert 'id="share-accept">0.800<' in page
    plain = render_status_page(info(build_verdict_split=None))
    assert "build:" not in plain and 'id="verdict-accept">8<' in plain


def test_every_reason_is_counted_on_the_page_zero_counts_included():
    page = render_status_page(info(reasons={"familiar": 8, "energy": 2}))
    assert 'id="reason-familiar">8<' in page and 'id="reason-energy">2<' in page
    assert 'id="reason-not_finite">0<' in page and "Reasons" in page
    assert "Reasons" not in render_status_page(info(monitors_model=False))


def test_bn_gate_table_only_with_a_bn_and_verdicts_only_with_a_model():
    assert "BN gate" in render_status_page(info())
    no_bn = render_status_page(info(has_bn=False))
    assert "BN gate" not in no_bn and "Verdicts" in no_bn
    bn_only = render_status_page(info(monitors_model=False))
    assert "Verdicts" not in bn_only and "BN gate" in bn_only
