"""Prometheus rules, alerts and the Grafana dashboard, checked with the real tools.

promtool checks and unit-tests the rules (every alert firing and not firing); every PromQL
expression of the dashboard passes promtool; every metric they use is exported by a live
agent; and a real Prometheus server scraping a live agent evaluates the recording rules to
the uncertainty and reject rates of the verdicts the agent actually produced.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_agent import JOB, start_broker
from locations import ROOT
from prometheus_client.parser import text_string_to_metric_families

from boxwatch.embedded_broker import free_loopback_port

REPO = ROOT
PROM_DIR = REPO / "deploy" / "prometheus"
RULES, ALERTS = PROM_DIR / "rules.yml", PROM_DIR / "alerts.yml"
RULE_TESTS = sorted((PROM_DIR / "tests").glob("*_test.yml"))
RUNBOOK = PROM_DIR / "RUNBOOK.md"
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)

# Series Prometheus makes itself rather than scraping them.
SYNTHETIC = {"up"}
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
}


# -- helpers ------------------------------------------------------------------------------
def rules(path: Path) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def walk_panels(panels: list[dict]) -> Iterator[dict]:
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def dashboard_exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every target, plus the selectors of the template queries."""
    out = [
        (p.get("title", ""), t["expr"])
        for p in walk_panels(dashboard["panels"])
        for t in p.get("targets", [])
        if t.get("expr")
    ]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else ""
        if m := re.fullmatch(r"label_values\((.+),\s*\w+\)", text.strip()):
            out.append((f"variable {var['name']}", m.group(1)))
    return out


def to_promql(expr: str) -> str:
    """A Grafana target as plain PromQL: interval macros -> 5m, template variables -> '.*'."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (label matchers, ranges, grouping removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+\w+", " ", text)
    names = re.findall(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", text)
    return {n for n in names if n.lower() not in _KEYWORDS}


def runbook_anchors() -> set[str]:
    """GitHub-style anchors of the runbook's headings."""
    heads = re.findall(r"^#+\s+(.+?)\s*$", RUNBOOK.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def wait_until(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# -- static checks ------------------------------------------------------------------------
def test_metric_name_extraction():
    expr = (
        'sum by (job, le) (rate(boxwatch_agent_verdicts_total{verdict="reject", a=~"x|y"}[5m] '
        "offset 15m)) / ignoring (verdict) group_left job:recorded:rate5m > 0.5 and up == 0"
    )
    assert metric_names(expr) == {"boxwatch_agent_verdicts_total", "job:recorded:rate5m", "up"}
    assert metric_names(
        to_promql(
            'histogram_quantile(0.99, sum by (le) (rate(x_bucket{job=~"$job"}[$__rate_interval])))'
        )
    ) == {"x_bucket"}


@needs_promtool
def test_promtool_check_rules():
    result = run_promtool("check", "rules", str(RULES), str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize("test_file", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
def test_promtool_rule_unit_tests(test_file):
    result = run_promtool("test", "rules", test_file.name, cwd=test_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    alerts = {r["alert"] for r in rules(ALERTS)}
    seen: dict[str, set[bool]] = {a: set() for a in alerts}
    for test_file in RULE_TESTS:
        for case in yaml.safe_load(test_file.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                seen.setdefault(check["alertname"], set()).add(bool(check.get("exp_alerts")))
    assert set(seen) == alerts, f"tests name unknown alerts: {set(seen) - alerts}"
    missing = {a: sorted({True, False} - s) for a, s in seen.items() if s != {True, False}}
    assert not missing, f"alerts not tested firing (True) / not firing (False): {missing}"


def test_alert_annotations_and_runbook():
    anchors = runbook_anchors()
    issue_alerts = {
        "BoxwatchRejectRateSpike",
        "BoxwatchUncertaintyRateHigh",
        "BoxwatchAgentDown",
        "BoxwatchConsumerLagGrowing",
        "BoxwatchDeadLetters",
        "BoxwatchArtifactReloadFailed",
        "BoxwatchGateBlocked",
    }
    alerts = rules(ALERTS)
    assert issue_alerts <= {r["alert"] for r in alerts}
    for rule in alerts:
        ann = rule.get("annotations", {})
        assert {"summary", "description", "runbook_url"} <= set(ann), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        url = urllib.parse.urlparse(ann["runbook_url"])
        assert url.scheme == "https" and url.path.endswith("deploy/prometheus/RUNBOOK.md"), url
        assert url.fragment == rule["alert"].lower() and url.fragment in anchors, rule["alert"]
    alert_anchors = {r["alert"].lower() for r in alerts}
    stale = {a for a in anchors if a.startswith("boxwatch") and a != "boxwatch-agent-runbook"}
    assert stale <= alert_anchors, f"runbook sections without an alert: {stale - alert_anchors}"


def test_recording_rules_cover_the_issue_and_alerts_use_defined_ones():
    recorded = {r["record"] for r in rules(RULES)}
    for needed in (
        "job_instance:boxwatch_agent_uncertainty_ratio:rate5m",
        "job_instance_class:boxwatch_agent_reject_ratio:rate5m",
        "job_instance_verdict:boxwatch_agent_verdict_ratio:rate5m",
        "job_instance_kind:boxwatch_agent_inputs:rate5m",
        "job_instance:boxwatch_agent_end_to_end_latency_seconds:p99_5m",
    ):
        assert needed in recorded
    for rule in rules(ALERTS) + rules(RULES):
        used = {n for n in metric_names(rule["expr"]) if ":" in n}
        assert used <= recorded, f"{rule.get('alert', rule.get('record'))} uses {used - recorded}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_is_provisioning_ready(path):
    d = json.loads(path.read_text())
    assert d["uid"] and len(d["uid"]) <= 40 and isinstance(d["schemaVersion"], int)
    assert d["schemaVersion"] >= 36 and d["title"] and "__inputs" not in d
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query" and variables[name]["includeAll"]
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    panels = list(walk_panels(d["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = " | ".join(p["title"].lower() for p in panels)
    for needed in (
        "uncertainty rate",
        "reject rate by class",
        "reject rate by layer",
        "verdict mix",
        "throughput",
        "latency p50 / p99",
        "consumer lag",
        "dead letters by reason",
        "bn gate outcomes",
        "artifact",
    ):
        assert needed in titles, needed
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert "$job" in t["expr"] and "$instance" in t["expr"], (p["title"], t["expr"])
    exprs = " ".join(e for _, e in dashboard_exprs(d))
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs


def test_grafana_provisioning_files():
    prov = REPO / "dashboards" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load((prov / "dashboards" / "boxwatch.yaml").read_text())["providers"]
    assert providers[0]["type"] == "file" and providers[0]["options"]["path"].startswith("/")


@needs_promtool
def test_every_dashboard_and_rule_expression_passes_promtool(tmp_path):
    exprs = [
        to_promql(e)
        for path in DASHBOARDS
        for _, e in dashboard_exprs(json.loads(path.read_text()))
    ]
    assert len(exprs) > 10
    doc = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}:check", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    check = tmp_path / "dashboard_rules.yml"
    check.write_text(yaml.safe_dump(doc))
    result = run_promtool("check", "rules", str(check))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout
    broken = tmp_path / "broken.yml"
    broken.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "x",
                        "rules": [
                            {"record": "x:y:z", "expr": to_promql(exprs[0]).replace(")", "", 1)}
                        ],
                    }
                ]
            }
        )
    )
    assert run_promtool("check", "rules", str(broken)).returncode != 0


# -- live agent and live Prometheus ----------------------------------------------------------
class PrometheusServer:
    """Debian's ``prometheus`` on a free loopback port scraping one target every second."""

    def __init__(self, workdir: Path, target: str) -> None:
        self.workdir = workdir
        self.port = free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "prometheus.yml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES), str(ALERTS)],
                    "scrape_configs": [
                        {"job_name": JOB, "static_configs": [{"targets": [target]}]}
                    ],
                }
            )
        )
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_until(self._ready, timeout, f"Prometheus ready ({self.log_tail()})")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"prometheus exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture(scope="module")
def live(live_agent_factory, tmp_path_factory):
    """Broker + agent (+ Prometheus scraping it, when installed), then a known stream."""
    broker = start_broker()
    agent = prom = None
    try:
        agent = live_agent_factory(broker.bootstrap_servers, "alerting")
        uncertain = agent.uncertain_rows(5)
        agent.start()
        if PROMETHEUS is not None:
            prom = PrometheusServer(tmp_path_factory.mktemp("prometheus"), agent.address).start()
            # A first scrape of the primed zero series before any record: every counter's
            # first sample is 0, so rate() extrapolates all of them alike.
            wait_until(
                lambda: prom.query("boxwatch_agent_verdicts_total"),
                30,
                "the first scrape of the agent",
            )
        outcome = agent.stream(n_known=120, n_unknown=60, n_bn=40, extra=uncertain)
        yield agent, prom, outcome
    finally:
        if prom is not None:
            prom.stop()
        if agent is not None:
            agent.stop()
        broker.stop()


@pytest.mark.integration
@pytest.mark.slow
def test_every_metric_used_is_exported_by_a_live_agent(live):
    agent, _, outcome = live
    assert outcome.verdicts and outcome.gates and outcome.dead_letter_reasons

    def scrape_with_lag() -> str | None:
        text = agent.get("/metrics")  # the lag gauge appears once partitions are assigned
        return text if "boxwatch_agent_consumer_lag_records{" in text else None

    text = wait_until(scrape_with_lag, 15, "the consumer-lag gauge")
    exported = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    recorded = {r["record"] for r in rules(RULES)}
    used: dict[str, set[str]] = {}
    for rule in rules(RULES) + rules(ALERTS):
        for name in metric_names(rule["expr"]) - recorded:
            used.setdefault(name, set()).add(rule.get("record") or rule["alert"])
    for path in DASHBOARDS:
        for title, expr in dashboard_exprs(json.loads(path.read_text())):
            for name in metric_names(to_promql(expr)):
                used.setdefault(name, set()).add(f"{path.name}: {title}")
    assert "boxwatch_agent_verdicts_total" in used and len(used) > 15
    missing = {n: sorted(w) for n, w in used.items() if n not in exported | SYNTHETIC}
    assert not missing, f"metrics used but not exported by the agent: {missing}"


def _values(prom: PrometheusServer, record: str, instance: str, key: str) -> dict[str, float]:
    return {
        r["metric"].get(key, ""): float(r["value"][1])
        for r in prom.query(f'{record}{{job="{JOB}",instance="{instance}"}}')
    }


def _close(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or math.isclose(
        got, want, rel_tol=1e-9, abs_tol=1e-12
    )


@pytest.mark.integration
@pytest.mark.slow
def test_live_prometheus_recording_rules_match_the_verdicts(live):
    agent, prom, outcome = live
    if prom is None:
        pytest.skip("the prometheus server is not installed (Debian: apt-get install prometheus)")
    n = len(outcome.verdicts)
    counts = outcome.verdict_counts
    assert min(counts[v] for v in ("accept", "uncertainty", "reject")) > 0, counts
    per_class, rejects = Counter(), Counter()
    per_layer, layer_rejects = Counter(), Counter()
    for v in outcome.verdicts:
        per_class[v["predicted_class"]] += 1
        rejects[v["predicted_class"]] += v["verdict"] == "reject"
        for layer, lv in v["layers"].items():
            per_layer[layer] += 1
            layer_rejects[layer] += lv == "reject"
    classes = agent.agent.runtime.classes
    want = {
        "job_instance:boxwatch_agent_uncertainty_ratio:rate5m": {"": counts["uncertainty"] / n},
        "job_instance:boxwatch_agent_reject_ratio:rate5m": {"": counts["reject"] / n},
        "job_instance_class:boxwatch_agent_reject_ratio:rate5m": {
            c: rejects[c] / per_class[c] if per_class[c] else math.nan for c in classes
        },
        "job_instance_layer:boxwatch_agent_layer_reject_ratio:rate5m": {
            layer: layer_rejects[layer] / per_layer[layer] for layer in per_layer
        },
    }
    keys = {
        "job_instance_class:boxwatch_agent_reject_ratio:rate5m": "class_name",
        "job_instance_layer:boxwatch_agent_layer_reject_ratio:rate5m": "layer",
    }
    instance = agent.address
    wait_until(
        lambda: [
            r
            for r in prom.query(
                f'sum(boxwatch_agent_verdicts_total{{job="{JOB}",instance="{instance}"}}) == {n}'
            )
        ],
        30,
        f"Prometheus to scrape all {n} verdicts",
    )
    got: dict[str, dict[str, float]] = {}

    def rules_agree() -> bool:
        for record, expected in want.items():
            got[record] = _values(prom, record, instance, keys.get(record, "__none__"))
            if set(got[record]) != set(expected) or not all(
                _close(got[record][k], expected[k]) for k in expected
            ):
                return False
        return True

    deadline = time.monotonic() + 20
    while not rules_agree() and time.monotonic() < deadline:
        time.sleep(0.5)
    for record, expected in want.items():
        assert set(got[record]) == set(expected), (record, got[record], expected)
        for key, value in expected.items():
            assert _close(got[record][key], value), (record, key, got[record][key], value)
