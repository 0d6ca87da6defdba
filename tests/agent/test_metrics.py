"""The agent's metric objects: series looked up once are the registry's own series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from boxwatch.agent.metrics import AgentMetrics


def test_a_series_looked_up_once_counts_in_the_registry():
    registry = CollectorRegistry()
    m = AgentMetrics(registry)
    child = m.series(m.verdicts, "reject", "3")
    assert child is m.series(m.verdicts, "reject", "3")
    assert child is m.verdicts.labels("reject", "3")
    child.inc(2)
    m.series(m.verdicts, "accept", "3").inc(5)
    sample = {"verdict": "reject", "class_name": "3"}
    assert registry.get_sample_value("boxwatch_agent_verdicts_total", sample) == 2
    sample["verdict"] = "accept"
    assert registry.get_sample_value("boxwatch_agent_verdicts_total", sample) == 5
