"""Every Prometheus metric the agent exports, declared in one place.

Names follow ``boxwatch_agent_<name>_<unit>``; counters end in ``_total``; durations are
``_seconds`` histograms. Label values come from small known sets: verdicts, their reasons
(:data:`~boxwatch.agent.vocab.VERDICT_REASONS`), gate outcomes, output kinds
(:data:`~boxwatch.agent.vocab.AGENT_OUTPUTS`), invalid-record reasons
(:data:`INVALID_REASONS`), and the class / layer names of the loaded artifact. Tests pass
their own ``CollectorRegistry``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.metrics import MetricWrapperBase

from boxwatch import __version__
from boxwatch.agent.boxes import box_kernel
from boxwatch.agent.vocab import (
    AGENT_OUTPUTS,
    DEAD_LETTER_REASONS,
    GATE_OUTCOMES,
    REASON_VERDICTS,
    VERDICTS,
)

INPUT_KINDS = ("model", "bn")
INVALID_REASONS = DEAD_LETTER_REASONS
RELOAD_RESULTS = ("success", "failure", "refused_rollback", "timeout")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class AgentMetrics:
    """The agent's metric objects, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.build_info = Info(
            "boxwatch_agent_build",
            "boxwatch version of this agent and its box-test kernel (native or numpy).",
            registry=r,
        )
        self.build_info.info({"version": __version__, "box_kernel": box_kernel()})
        self.artifact_info = Gauge(
            "boxwatch_agent_artifact_info",
            "The artifact in use (value 1): its id, model version and schema version.",
            ["artifact_id", "model_version", "schema_version"],
            registry=r,
        )
        self.artifact_created = Gauge(
            "boxwatch_agent_artifact_created_timestamp_seconds",
            "Creation time of the artifact in use.",
            registry=r,
        )
        self.artifact_reloads = Counter(
            "boxwatch_agent_artifact_reloads_total",
            "Artifact reload attempts by result.",
            ["result"],
            registry=r,
        )
        self.inputs = Counter(
            "boxwatch_agent_inputs_total", "Records consumed, by input kind.", ["kind"], registry=r
        )
        self.verdicts = Counter(
            "boxwatch_agent_verdicts_total",
            "Combined monitor verdicts by verdict and predicted class.",
            ["verdict", "class_name"],
            registry=r,
        )
        self.verdict_reasons = Counter(
            "boxwatch_agent_verdict_reasons_total",
            "Combined monitor verdicts by verdict and reason (why the input got it).",
            ["verdict", "reason"],
            registry=r,
        )
        self.layer_verdicts = Counter(
            "boxwatch_agent_layer_verdicts_total",
            "Per-layer monitor verdicts by layer, verdict and predicted class.",
            ["layer", "verdict", "class_name"],
            registry=r,
        )
        self.gate_outcomes = Counter(
            "boxwatch_agent_gate_outcomes_total",
            "BN gate outcomes by outcome and decided class.",
            ["outcome", "decision"],
            registry=r,
        )
        self.invalid_records = Counter(
            "boxwatch_agent_invalid_records_total",
            "Malformed records sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=r,
        )
        self.outputs = Counter(
            "boxwatch_agent_outputs_total",
            "Records produced and acknowledged, by output kind.",
            ["kind"],
            registry=r,
        )
        self.outputs_omitted = Counter(
            "boxwatch_agent_outputs_payload_omitted_total",
            "Outputs sent as a digest stub (sha256 and size) because the whole record was too "
            "large to send, by output kind.",
            ["kind"],
            registry=r,
        )
        self.outputs_dropped = Counter(
            "boxwatch_agent_outputs_dropped_total",
            "Outputs given up after bounded retries because the broker refused even their "
            "stub, by output kind.",
            ["kind"],
            registry=r,
        )
        self.out_of_range = Counter(
            "boxwatch_agent_inputs_out_of_range_total",
            "Model inputs whose preprocessed values lie outside the training range the "
            "artifact records (some unknown inputs do; a large share: wrong scale or units?).",
            registry=r,
        )
        self.produce_errors = Counter(
            "boxwatch_agent_produce_errors_total",
            "Failed attempts to deliver a batch's outputs (retried).",
            registry=r,
        )
        self.commits = Counter(
            "boxwatch_agent_commits_total", "Offset commits after a delivered batch.", registry=r
        )
        self.batch_size = Histogram(
            "boxwatch_agent_batch_records",
            "Records per micro-batch.",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "boxwatch_agent_batch_duration_seconds",
            "Time to process one micro-batch, decode to commit.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_seconds = Histogram(
            "boxwatch_agent_inference_duration_seconds",
            "Model call (with layer taps) per micro-batch.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.monitor_seconds = Histogram(
            "boxwatch_agent_monitor_duration_seconds",
            "Box-monitor verdicts and scores per micro-batch.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.end_to_end_seconds = Histogram(
            "boxwatch_agent_end_to_end_latency_seconds",
            "From the record's Kafka timestamp to its verdict being acknowledged.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.score = Histogram(
            "boxwatch_agent_score",
            "Out-of-box score of each monitored input (unitless).",
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5),
            registry=r,
        )
        self.consumer_lag = Gauge(
            "boxwatch_agent_consumer_lag_records",
            "Records behind the high watermark, per assigned partition.",
            ["topic", "partition"],
            registry=r,
        )
        self.broker_connected = Gauge(
            "boxwatch_agent_broker_connected",
            "1 while the last broker round trip succeeded, else 0.",
            registry=r,
        )
        self.paused = Gauge(
            "boxwatch_agent_consumption_paused",
            "1 while consumption is paused because outputs cannot be delivered.",
            registry=r,
        )
        self.ready = Gauge(
            "boxwatch_agent_ready",
            "1 when the agent is ready (artifact loaded, broker up).",
            registry=r,
        )
        self._series: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}
        self._prime()

    def series(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: each batch adds to the same few
        series, and ``labels`` checks and locks on every call. Only for metrics whose
        series are never removed (the verdict, reason, gate, input and output counters)."""
        key = (metric, labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*labels)
        return child

    def _prime(self) -> None:
        """Create the fixed-label series at zero so rates and alerts see them from the start."""
        for kind in INPUT_KINDS:
            self.inputs.labels(kind)
        for kind in AGENT_OUTPUTS:
            self.outputs.labels(kind)
            self.outputs_omitted.labels(kind)
            self.outputs_dropped.labels(kind)
        for reason in INVALID_REASONS:
            self.invalid_records.labels(reason)
        for result in RELOAD_RESULTS:
            self.artifact_reloads.labels(result)
        for reason, verdicts in REASON_VERDICTS.items():
            for verdict in verdicts:
                self.verdict_reasons.labels(verdict, reason)

    def prime_classes(self, classes: list[str], layers: list[str], decisions: list[str]) -> None:
        """Create per-class / per-layer series at zero for the loaded artifact."""
        for c in classes:
            for v in VERDICTS:
                self.verdicts.labels(v, c)
                for layer in layers:
                    self.layer_verdicts.labels(layer, v, c)
        for d in decisions:
            for o in GATE_OUTCOMES:
                self.gate_outcomes.labels(o, d)

    def set_artifact(
        self, artifact_id: str, model_version: str, schema_version: str, created: int
    ) -> None:
        """Point ``artifact_info`` at the artifact now in use (only one series is 1)."""
        self.artifact_info.clear()
        self.artifact_info.labels(artifact_id, model_version, schema_version).set(1)
        self.artifact_created.set(created)


def observe_many(histogram: Histogram, values: np.ndarray) -> None:
    """``histogram.observe(v)`` for every value, in one vectorised step per batch.

    Uses the histogram's bucket bounds and values (prometheus_client keeps them as
    ``_upper_bounds`` / ``_buckets`` / ``_sum``); falls back to one call per value if a
    future prometheus_client lays them out differently.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if not values.size:
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values.tolist():
            histogram.observe(v)
        return
    index = np.searchsorted(np.asarray(bounds, dtype=np.float64), values, side="left")
    for i, n in enumerate(np.bincount(index, minlength=len(bounds)).tolist()):
        if n:
            buckets[i].inc(n)
    total.inc(float(values.sum()))
