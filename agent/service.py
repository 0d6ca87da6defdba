"""The agent's main loop: consume a micro-batch, monitor it, deliver outputs, then commit.

At-least-once: offsets are committed only after every output of the batch is acknowledged
(acks=all). When outputs cannot be delivered, consumption pauses (one batch in memory at
most), delivery is retried with exponential backoff and jitter, and resumes by itself.
An output refused for itself (too large for the producer or the broker) is never retried
forever: a couple of tries, then its digest stub, then it is dropped and counted.
A record that cannot be processed goes to the dead-letter topic; the loop never dies on one.
Verdict, gate and dead-letter metrics count what was delivered, once a batch is acknowledged.
Shutdown (:meth:`Agent.stop`) finishes the batch in hand, delivers, commits and closes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter as _Counter
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from boxwatch.agent.boxes import ACCEPT, set_box_kernel
from boxwatch.agent.config import AgentConfig
from boxwatch.agent.errors import BoxwatchError, ConfigError
from boxwatch.agent.gate import OUTCOME_NAMES
from boxwatch.agent.http import AgentHTTPServer
from boxwatch.agent.kafka import (
    Consumed,
    DeliveryFailure,
    GroupMoved,
    KafkaUnavailable,
    Partition,
    ensure_topics,
    make_consumer,
    make_producer,
    wait_for_broker,
)
from boxwatch.agent.kafka.headers import header_problem
from boxwatch.agent.metrics import AgentMetrics, observe_many
from boxwatch.agent.outputs import (
    Output,
    VerdictEncoder,
    copy_output,
    dead_letter_output,
    gate_output,
    omit_payload,
    output_bytes,
    reason_headers,
)
from boxwatch.agent.preprocessing import RANGE_WARN_SHARE, RangeWindow
from boxwatch.agent.records import BadRecord, decode_bn_input, decode_model_batch
from boxwatch.agent.runtime import MonitorRuntime, load_runtime

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.2
BACKOFF_CAP_S = 5.0
LAG_INTERVAL_S = 2.0
RATE_WINDOW_S = 60.0  # the status page's current rate: records over the last minute
FLUSH_TIMEOUT_S = 15.0
COMMIT_TIMEOUT_S = 3.0  # one commit round trip; failures are retried (a few times)
# Of ``shutdown_timeout_s``: the share that finishing the batch in hand may take, and what is
# kept back for the interpreter's exit; of the rest, the producer's close takes at most
# PRODUCER_CLOSE_SHARE (a delivered or abandoned batch leaves it little to flush), the
# consumer's (leaving the group) what remains.
DRAIN_SHARE = 0.3
EXIT_MARGIN_S = 3.0
PRODUCER_CLOSE_SHARE = 0.35
RANGE_NOTE_INTERVAL_S = 60.0  # the out-of-range warning is logged at most this often
MAX_REFUSALS = 2  # sends of one output the producer or broker refuses, before its stub / drop
# Outputs whose size the agent does not control (copies of consumed records, dead letters)
# are checked against max_output_bytes before sending; verdicts and gate records are small.
_FOREIGN_KINDS = frozenset({"dead_letter", "capture", "release", "review"})
_KIND = attrgetter("kind")
_TOPIC, _HEADERS, _TIMESTAMP = attrgetter("topic"), attrgetter("headers"), attrgetter("timestamp")


@dataclass
class BatchTally:
    """What a batch adds to the verdict and gate metrics, applied once it is delivered."""

    verdicts: _Counter = field(default_factory=_Counter)
    reasons: _Counter = field(default_factory=_Counter)  # (verdict, reason)
    layer_verdicts: _Counter = field(default_factory=_Counter)
    gate: _Counter = field(default_factory=_Counter)
    scores: list[np.ndarray] = field(default_factory=list)
    out_of_range: int = 0


@dataclass
class ReloadJob:
    """A candidate artifact loading in its own thread, and the wall-clock limit it has."""

    deadline: float
    done: threading.Event = field(default_factory=threading.Event)
    runtime: MonitorRuntime | None = None
    error: BaseException | None = None
    finished_at: float | None = None
    overrun: bool = False  # refused at its deadline: what it returns is dropped

    def run(self, load: Callable[[], MonitorRuntime]) -> None:
        try:
            self.runtime = load()
        except BaseException as exc:  # any failure of the candidate, reported by the loop
            self.error = exc
        finally:
            self.finished_at = time.monotonic()
            self.done.set()


@dataclass
class AgentStatus:
    """Live figures for the status page and the demo's table (updated by the loop thread)."""

    started: float = field(default_factory=time.time)
    records: int = 0
    verdicts: _Counter = field(default_factory=_Counter)
    reasons: _Counter = field(default_factory=_Counter)
    gate: _Counter = field(default_factory=_Counter)
    dead_letters: int = 0
    batches: int = 0
    last_batch_at: float = 0.0
    paused: bool = False
    broker_connected: bool = False
    reloads: int = 0
    reload_failures: int = 0
    out_of_range: int = 0
    # The last ~RANGE_WINDOW model inputs: how many fell outside the training range
    range_window: RangeWindow = field(default_factory=RangeWindow)
    lag: int | None = None  # records not yet consumed, all assigned partitions together
    # (time, records) of recent batches, for the rate over the last RATE_WINDOW_S seconds
    recent: deque = field(default_factory=deque)
    # (time, seconds) each recent batch took, decode to commit: the rate while busy
    busy: deque = field(default_factory=deque)

    def count_batch(self, n: int, now: float | None = None) -> None:
        """Add a consumed batch of ``n`` records to the totals and to the recent rate."""
        now = time.time() if now is None else now
        self.records += n
        self.recent.append((now, n))
        while self.recent and self.recent[0][0] < now - RATE_WINDOW_S:
            self.recent.popleft()

    def count_busy(self, seconds: float, now: float | None = None) -> None:
        """Add the ``seconds`` a handled batch took (decode to commit)."""
        now = time.time() if now is None else now
        self.busy.append((now, seconds))
        while self.busy and self.busy[0][0] < now - RATE_WINDOW_S:
            self.busy.popleft()

    def recent_rate(self, now: float | None = None) -> float:
        """Records per second over the last :data:`RATE_WINDOW_S` seconds (or since start)."""
        now = time.time() if now is None else now
        since = now - RATE_WINDOW_S
        n = sum(k for t, k in list(self.recent) if t >= since)
        return n / max(min(RATE_WINDOW_S, now - self.started), 1e-9)

    def busy_rate(self, now: float | None = None) -> float | None:
        """Records per second of batch handling over the last :data:`RATE_WINDOW_S` seconds:
        what the agent sustains while it has work (None: no batch handled in that time)."""
        now = time.time() if now is None else now
        since = now - RATE_WINDOW_S
        seconds = sum(s for t, s in list(self.busy) if t >= since)
        n = sum(k for t, k in list(self.recent) if t >= since)
        return n / seconds if seconds > 0 else None

    def snapshot(self) -> dict[str, Any]:
        """The figures of ``/status.json`` (docs/agent-config.md lists them)."""
        elapsed = max(time.time() - self.started, 1e-9)
        n = sum(self.verdicts.values())
        since_start = self.records / elapsed
        window = self.range_window
        return {
            "records": self.records,
            "verdicts": dict(self.verdicts),
            "reasons": dict(self.reasons),
            "gate": dict(self.gate),
            "dead_letters": self.dead_letters,
            "batches": self.batches,
            "records_per_second_1m": self.recent_rate(),
            "records_per_second_busy_1m": self.busy_rate(),
            "records_per_second_since_start": since_start,
            "records_per_second": since_start,  # the old name of the line above, kept
            "out_of_range": self.out_of_range,
            "out_of_range_rate": self.out_of_range / n if n else 0.0,
            "out_of_range_recent_share": window.share,
            "out_of_range_recent_inputs": window.inputs,
            "out_of_range_warning": window.alarming,
            "lag": self.lag,
            "uncertainty_rate": self.verdicts.get("uncertainty", 0) / n if n else 0.0,
            "reject_rate": self.verdicts.get("reject", 0) / n if n else 0.0,
            "paused": self.paused,
            "broker_connected": self.broker_connected,
            "reloads": self.reloads,
            "reload_failures": self.reload_failures,
        }


class Agent:
    """One agent process's consume-monitor-produce-commit loop."""

    def __init__(
        self,
        cfg: AgentConfig,
        runtime: MonitorRuntime,
        metrics: AgentMetrics,
        *,
        reload_runtime: Callable[[], MonitorRuntime] | None = None,
    ) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.metrics = metrics
        self.status = AgentStatus()
        self.stop_event = threading.Event()
        self._give_up = threading.Event()  # set once a stop request's drain time is spent
        self._stop_deadline: float | None = None
        self.reload_event = threading.Event()
        self._reload_runtime = reload_runtime
        self._reload_job: ReloadJob | None = None
        self._consumer: Any = None
        self._producer: Any = None
        self._last_lag = 0.0
        self._range_said = -RANGE_NOTE_INTERVAL_S
        self._install_runtime(runtime)

    # -- topics -----------------------------------------------------------------------
    def _topic_keys(self, model: tuple[str, ...], bn: tuple[str, ...]) -> list[str]:
        """Configured topics of ``model`` / ``bn`` keys, for the halves the artifact has.

        An artifact without a BN needs no gate, release, review or BN-input topic; one
        without a monitored model needs no input, verdict or capture topic.
        """
        rt = self.runtime
        keys = [*(model if rt.tap is not None else ()), *(bn if rt.diagram is not None else ())]
        return [self.cfg[f"topics.{k}"] for k in keys if self.cfg[f"topics.{k}"]]

    def input_topics(self) -> list[str]:
        return self._topic_keys(("inputs",), ("bn_inputs",))

    def output_topics(self) -> list[str]:
        used = self._topic_keys(("verdicts", "capture"), ("gate", "release", "review"))
        return [*used, self.cfg["topics.dead_letter"]]

    # -- lifecycle --------------------------------------------------------------------
    def check_topics(self) -> None:
        """Start-up check: the topics the artifact uses exist (or are created when allowed)."""
        if not self.input_topics():
            need = "topics.inputs" if self.runtime.tap is not None else "topics.bn_inputs"
            raise ConfigError(f"{need} is not set: the agent would have nothing to consume")
        wait_for_broker(self.cfg.values, stopped=self.stop_event.is_set)
        ensure_topics(self.cfg.values, [*self.input_topics(), *self.output_topics()])

    def stop(self) -> None:
        """Ask the loop to finish its batch, deliver, commit and close (idempotent).

        All of it fits in ``shutdown_timeout_s``: a delivery still unanswered after its
        share is abandoned (not committed: the batch comes again after restart).
        """
        if self.stop_event.is_set():
            return
        budget = self.cfg["shutdown_timeout_s"]
        self._stop_deadline = time.monotonic() + budget - EXIT_MARGIN_S
        timer = threading.Timer(budget * DRAIN_SHARE, self._give_up.set)
        timer.daemon = True
        timer.start()
        self.stop_event.set()

    def request_reload(self) -> None:
        """Load the artifact again beside the loop and swap it in between batches (SIGHUP)."""
        self.reload_event.set()

    def ready(self) -> bool:
        return self.status.broker_connected and not self.status.paused

    def alive(self) -> bool:
        return not self.stop_event.is_set() or self._consumer is not None

    def run(self) -> None:
        """Blocking loop until :meth:`stop`; closes the clients in ``finally``."""
        self._consumer = make_consumer(
            self.cfg.values, self.input_topics(), on_revoke=self.forget_partitions
        )
        self._producer = make_producer(self.cfg.values)
        wait_s = self.cfg["batch.max_wait_ms"] / 1000
        max_records = self.cfg["batch.max_records"]
        try:
            while not self.stop_event.is_set():
                self._poll_reload()
                try:
                    records = self._consumer.poll(max_records, wait_s)
                except KafkaUnavailable as exc:
                    self._set_connected(False)
                    log.warning("%s; retrying", exc)
                    self.stop_event.wait(BACKOFF_BASE_S)
                    continue
                if records:
                    self._handle_batch(records)
                self._maybe_update_lag()
        finally:
            self._close()

    def _left_s(self, default: float) -> float:
        """Seconds a blocking call may take: ``default``, or what shutdown leaves of it."""
        if self._stop_deadline is None:
            return default
        return max(min(default, self._stop_deadline - time.monotonic()), 0.1)

    def _close(self) -> None:
        total = self._left_s(self.cfg["shutdown_timeout_s"] - EXIT_MARGIN_S)
        try:
            if self._producer is not None:
                self._producer.close(total * PRODUCER_CLOSE_SHARE)
        finally:
            if self._consumer is not None:
                self._consumer.close(self._left_s(total))
            self._producer = self._consumer = None

    # -- one batch --------------------------------------------------------------------
    def _handle_batch(self, records: list[Consumed]) -> None:
        t0 = time.perf_counter()
        tally = BatchTally()
        outputs = self.process(records, tally)
        delivered = self._deliver(outputs)
        if delivered is None:
            return
        self._commit(records)
        self._count_delivered(tally, delivered)
        now = time.time()
        stamps = np.array(list(map(_TIMESTAMP, records)), dtype=np.float64)  # None: NaN
        observe_many(
            self.metrics.end_to_end_seconds, np.maximum(now - stamps[stamps > 0] / 1000.0, 0.0)
        )
        self.metrics.batch_size.observe(len(records))
        took = time.perf_counter() - t0
        self.metrics.batch_seconds.observe(took)
        self.status.count_busy(took, now)
        self.status.batches += 1
        self.status.last_batch_at = now

    def process(self, records: list[Consumed], tally: BatchTally | None = None) -> list[Output]:
        """Turn consumed records into outputs (pure: no Kafka calls; tests use it directly).

        Verdict and gate counts go into ``tally``, for the caller to apply once the outputs
        are delivered.
        """
        tally = BatchTally() if tally is None else tally
        model_topic, bn_topic = self.cfg["topics.inputs"], self.cfg["topics.bn_inputs"]
        outputs: list[Output] = []
        model_recs: list[Consumed] = []
        bn_recs: list[Consumed] = []
        topics = list(map(_TOPIC, records))
        problems = list(map(header_problem, map(_HEADERS, records)))
        n_model = topics.count(model_topic)
        if n_model == len(records) and problems.count(None) == len(records):
            model_recs = records  # the usual batch: model inputs only, all headers readable
        else:
            for rec, topic, problem in zip(records, topics, problems, strict=True):
                if problem is not None:
                    outputs.append(self._dead_letter(rec, "bad_header", problem))
                elif topic == model_topic:
                    model_recs.append(rec)
                elif topic == bn_topic:
                    bn_recs.append(rec)
        if n_model:
            self.metrics.series(self.metrics.inputs, "model").inc(n_model)
        if len(records) - n_model:
            self.metrics.series(self.metrics.inputs, "bn").inc(len(records) - n_model)
        if model_recs:
            outputs += self._process_model(model_recs, tally)
        if bn_recs:
            outputs += self._process_bn(bn_recs, tally)
        self.status.count_batch(len(records))
        return outputs

    def _dead_letter(self, rec: Consumed, reason: str, detail: str) -> Output:
        log.info(
            "dead letter %s/%s@%s: %s (%s)", rec.topic, rec.partition, rec.offset, reason, detail
        )
        return dead_letter_output(
            self.cfg["topics.dead_letter"],
            rec,
            reason,
            detail,
            store_payload=self.cfg["dead_letter.store_payload"],
        )

    def _process_model(self, recs: list[Consumed], tally: BatchTally) -> list[Output]:
        rt = self.runtime
        out: list[Output] = []
        if rt.tap is None or rt.preprocessing is None:
            return [
                self._dead_letter(r, "bad_schema", "the artifact monitors no model") for r in recs
            ]
        x, ids, rows, bad = decode_model_batch(
            [(r.value, r.headers) for r in recs],
            size=rt.preprocessing.size,
            max_bytes=self.cfg["max_record_bytes"],
        )
        out += [self._dead_letter(recs[i], exc.reason, exc.detail) for i, exc in bad]
        good = [recs[i] for i in rows]
        if not good:
            return out
        try:
            res = rt.run_model(x)
        except Exception as exc:  # a model failure must not kill the loop; keep the inputs
            log.exception("model call failed on a batch of %d", len(good))
            return out + [
                self._dead_letter(r, "model_error", f"{type(exc).__name__}: {exc}") for r in good
            ]
        self.metrics.inference_seconds.observe(res.inference_seconds)
        self.metrics.monitor_seconds.observe(res.monitor_seconds)
        assert res.reasons is not None  # run_model always says why
        encoder = self._verdicts
        heads = encoder.heads(res.predicted, res.verdicts, res.layer_verdicts, res.reasons)
        timings = {
            "inference_ms": round(res.inference_seconds * 1e3, 3),
            "monitor_ms": round(res.monitor_seconds * 1e3, 3),
            "batch_records": len(good),
        }
        scores = np.asarray(res.scores, dtype=np.float64)
        out += encoder.outputs(
            good,
            ids,
            heads,
            scores=scores.tolist(),
            accepted=None if res.accepted is None else res.accepted.tolist(),
            timings=timings,
        )
        capture = self.cfg["topics.capture"]
        if capture:
            for i in np.flatnonzero(res.verdicts != ACCEPT).tolist():
                h = heads.heads[heads.of[i]]
                out.append(
                    copy_output(
                        "capture",
                        capture,
                        good[i],
                        reason_headers(h.verdict, h.reason, h.layer, h.nearest),
                    )
                )
        verdict_counts, reason_counts, layer_counts = (
            tally.verdicts,
            tally.reasons,
            tally.layer_verdicts,
        )
        for (by_class, by_reason, by_layer), n in zip(heads.labels, heads.counts, strict=True):
            verdict_counts[by_class] += n
            reason_counts[by_reason] += n
            for labels in by_layer:
                layer_counts[labels] += n
        tally.scores.append(scores)
        if res.out_of_range is not None:
            tally.out_of_range += self._note_out_of_range(int(res.out_of_range.sum()), len(good))
        return out

    def _note_out_of_range(self, n: int, of: int) -> int:
        """Count a batch's inputs outside the training range in the recent window; say (at
        most once a minute) when more than :data:`RANGE_WARN_SHARE` of the window's are: a
        share honest unknown inputs do not reach, the wrong scale or units do."""
        window = self.status.range_window
        window.add(n, of)
        now = time.monotonic()
        if window.alarming and now - self._range_said >= RANGE_NOTE_INTERVAL_S:
            self._range_said = now
            log.warning(
                "%.1f%% of the last %d inputs lie outside the preprocessed training range the "
                "artifact records (warned above %.0f%%): wrong scale or units? (e.g. [0, 1] "
                "floats sent to a model whose preprocessing divides by 255)",
                100 * window.share,
                window.inputs,
                100 * RANGE_WARN_SHARE,
            )
        return n

    def _count_delivered(self, tally: BatchTally, delivered: list[Output]) -> None:
        """Metrics and status of a delivered batch: what reached the topics, counted once."""
        m = self.metrics
        kinds = _Counter(map(_KIND, delivered))
        for kind, n in kinds.items():
            m.series(m.outputs, kind).inc(n)
        if kinds["dead_letter"]:
            reasons = _Counter(out.reason for out in delivered if out.kind == "dead_letter")
            for reason, n in reasons.items():
                m.invalid_records.labels(reason).inc(n)
            self.status.dead_letters += sum(reasons.values())
        for (v, c), n in tally.verdicts.items():
            m.series(m.verdicts, v, c).inc(n)
            self.status.verdicts[v] += n
        for (v, reason), n in tally.reasons.items():
            m.series(m.verdict_reasons, v, reason).inc(n)
            self.status.reasons[reason] += n
        for (layer, v, c), n in tally.layer_verdicts.items():
            m.series(m.layer_verdicts, layer, v, c).inc(n)
        for (outcome, decision), n in tally.gate.items():
            m.series(m.gate_outcomes, outcome, decision).inc(n)
            self.status.gate[outcome] += n
        for scores in tally.scores:
            observe_many(m.score, scores[np.isfinite(scores)])
        if tally.out_of_range:
            m.out_of_range.inc(tally.out_of_range)
            self.status.out_of_range += tally.out_of_range

    def _process_bn(self, recs: list[Consumed], tally: BatchTally) -> list[Output]:
        rt = self.runtime
        if rt.diagram is None or rt.gate is None:
            return [
                self._dead_letter(r, "bad_schema", "the artifact holds no BN classifier")
                for r in recs
            ]
        d = rt.diagram
        out: list[Output] = []
        good, rows, ids = [], [], []
        for rec in recs:
            try:
                decoded = decode_bn_input(
                    rec.value,
                    features=d.features,
                    states=d.states,
                    max_bytes=self.cfg["max_record_bytes"],
                )
            except BadRecord as exc:
                out.append(self._dead_letter(rec, exc.reason, exc.detail))
                continue
            good.append(rec)
            rows.append(decoded.states)
            ids.append(decoded.record_id)
        if not good:
            return out
        x = np.stack(rows)
        decisions = d.predict(x)
        gated = rt.gate.apply(x, decisions)
        policy = self.cfg["gate_policy"]
        for i, rec in enumerate(good):
            decision = d.terminals[int(decisions[i])]
            outcome = OUTCOME_NAMES[int(gated.outcomes[i])]
            body = {
                "decision": decision,
                "outcome": outcome,
                "rules": gated.rule_ids[i],
                "class_variable": d.class_variable,
                "artifact_id": rt.artifact_id,
            }
            out.append(gate_output(self.cfg["topics.gate"], rec, ids[i], body))
            route = policy.get(outcome, "none")
            target = self.cfg[f"topics.{route}"] if route in ("release", "review") else None
            if target:
                out.append(
                    copy_output(
                        route,
                        target,
                        rec,
                        {"boxwatch-decision": decision, "boxwatch-gate": outcome},
                    )
                )
            tally.gate[(outcome, decision)] += 1
        return out

    # -- delivery and commits -----------------------------------------------------------
    def _deliver(self, outputs: list[Output]) -> list[Output] | None:
        """Send until every output is acknowledged; pause consumption while failing.

        Outputs larger than ``max_output_bytes`` go as their digest stub. Broker outages
        are retried with backoff for as long as they last (consumption paused); an output
        refused for itself is tried :data:`MAX_REFUSALS` times, then as its stub, then
        dropped (logged and counted). Returns what was delivered (stubs in place of the
        outputs they replace), or ``None`` only when shutdown interrupts the retries
        (nothing is committed then, so the batch is consumed again after restart).
        """
        limit = self.cfg["max_output_bytes"]
        final = list(outputs)
        stubbed: set[int] = set()
        if not _FOREIGN_KINDS.isdisjoint(map(_KIND, outputs)):
            for i, o in enumerate(outputs):
                if o.kind in _FOREIGN_KINDS and output_bytes(o) > limit:
                    final[i] = omit_payload(o)
                    stubbed.add(i)
        refusals: _Counter = _Counter()
        dropped: set[int] = set()
        todo = list(range(len(final)))
        attempt = 0
        while todo:
            sending = final if len(todo) == len(final) else [final[i] for i in todo]
            failures = self._producer.deliver(sending, FLUSH_TIMEOUT_S, self._give_up)
            if not failures:
                break
            at = {id(out): i for i, out in zip(todo, sending, strict=True)}
            self.metrics.produce_errors.inc()
            retry: set[int] = set()
            transient = 0
            for failure in failures:
                i = at[id(failure.output)]
                if failure.retriable:
                    transient += 1
                    retry.add(i)
                elif self._after_refusal(i, failure, final, refusals, stubbed):
                    retry.add(i)
                else:
                    dropped.add(i)
            todo = sorted(retry)
            if not transient:
                continue  # only refusals: each is bounded, no broker to wait for
            self._pause(True)
            self._set_connected(False)
            delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt) * random.uniform(0.5, 1.0)
            log.warning(
                "%d of %d outputs not delivered; retry %d in %.2fs",
                transient,
                len(final),
                attempt + 1,
                delay,
            )
            if self.stop_event.wait(delay):
                return None
            self._consumer.keep_membership()
            attempt += 1
        self._pause(False)
        self._set_connected(True)
        for i in stubbed - dropped:
            self.metrics.outputs_omitted.labels(final[i].kind).inc()
        if not dropped:
            return final
        return [out for i, out in enumerate(final) if i not in dropped]

    def _after_refusal(
        self,
        i: int,
        failure: DeliveryFailure,
        final: list[Output],
        refusals: _Counter,
        stubbed: set[int],
    ) -> bool:
        """One more refused send of output ``i``: whether to send it (or its stub) again."""
        refusals[i] += 1
        out = final[i]
        if refusals[i] < MAX_REFUSALS:
            return True
        if i not in stubbed:
            log.warning(
                "%s output to %s refused %d times (%s); sending its digest stub",
                out.kind,
                out.topic,
                refusals[i],
                failure.error,
            )
            final[i] = omit_payload(out)
            stubbed.add(i)
            refusals[i] = 0
            return True
        log.error(
            "dropping a %s output to %s: refused %d times even as a stub (%s)",
            out.kind,
            out.topic,
            refusals[i],
            failure.error,
        )
        self.metrics.outputs_dropped.labels(out.kind).inc()
        return False

    def _pause(self, paused: bool) -> None:
        if paused == self.status.paused:
            return
        if paused:
            self._consumer.pause()
        else:
            self._consumer.resume()
        self.status.paused = paused
        self.metrics.paused.set(1 if paused else 0)
        log.warning(
            "consumption %s", "paused: outputs cannot be delivered" if paused else "resumed"
        )

    def _commit(self, records: list[Consumed]) -> None:
        # A partition's records come in offset order: its last one sets the commit.
        offsets: dict[Partition, int] = {(r.topic, r.partition): r.offset + 1 for r in records}
        attempt = 0
        while True:
            try:
                self._consumer.commit(offsets, self._left_s(COMMIT_TIMEOUT_S))
                self.metrics.commits.inc()
                return
            except GroupMoved as exc:
                # Never retried: waiting would only hold up this member's rejoin, and with
                # it the whole group's rebalance.
                log.warning(
                    "%s; a rebalance moved on: the partitions' next owner reads the batch "
                    "again from the last commit",
                    exc,
                )
                return
            except KafkaUnavailable as exc:
                if attempt >= 5 or self.stop_event.is_set():
                    log.warning("%s; the batch may be redelivered", exc)
                    return
                self.stop_event.wait(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
                attempt += 1

    # -- health, lag, reload ----------------------------------------------------------
    def _set_connected(self, up: bool) -> None:
        self.status.broker_connected = up
        self.metrics.broker_connected.set(1 if up else 0)
        self.metrics.ready.set(1 if self.ready() else 0)

    def _maybe_update_lag(self) -> None:
        now = time.monotonic()
        if now - self._last_lag < LAG_INTERVAL_S or self.stop_event.is_set():
            return
        self._last_lag = now
        try:
            lags = self._consumer.lag()
        except KafkaUnavailable as exc:
            log.warning("broker unreachable (%s)", exc)
            self._set_connected(False)
            return
        for (topic, partition), lag in lags.items():
            self.metrics.consumer_lag.labels(topic, str(partition)).set(lag)
        self.status.lag = sum(lags.values())
        self._set_connected(True)

    def forget_partitions(self, partitions: list[Partition]) -> None:
        for topic, partition in partitions:
            try:
                self.metrics.consumer_lag.remove(topic, str(partition))
            except KeyError:
                pass

    def _install_runtime(self, runtime: MonitorRuntime) -> None:
        self.runtime = runtime
        self._verdicts = VerdictEncoder(
            self.cfg["topics.verdicts"],
            runtime.classes,
            artifact_id=runtime.artifact_id,
            model_version=runtime.model_version,
        )
        m = runtime.artifact.manifest
        self.metrics.set_artifact(
            runtime.artifact_id,
            runtime.model_version,
            str(m.get("schema_version")),
            runtime.artifact.created_at,
        )
        layers = list(runtime.boxes.layers) if runtime.boxes else []
        decisions = list(runtime.diagram.terminals) if runtime.diagram else []
        self.metrics.prime_classes(runtime.classes, layers, decisions)

    def _poll_reload(self) -> None:
        """Start a requested reload, or settle the one loading (called between batches).

        The candidate loads in a daemon thread (:class:`ReloadJob`), so neither the loop nor
        the HTTP thread nor the signal handlers wait for it. Past ``reload.timeout_s`` it is
        refused and counted; a thread cannot be interrupted, so its load is left to finish
        (the readers before the signature are linear in their input, so it does) and what it
        returns is dropped. One candidate at a time: a SIGHUP meanwhile waits for it.
        """
        job = self._reload_job
        if job is not None:
            late = (job.finished_at or time.monotonic()) > job.deadline
            if not job.overrun and late:
                job.overrun = True
                self._reload_refused(
                    "timeout",
                    f"loading the candidate took more than {self.cfg['reload.timeout_s']} s "
                    "(reload.timeout_s)",
                )
            if not job.done.is_set():
                return
            self._reload_job = None
            if not job.overrun:
                self._finish_reload(job)
        if self.reload_event.is_set() and self._reload_runtime is not None:
            self.reload_event.clear()
            job = ReloadJob(deadline=time.monotonic() + self.cfg["reload.timeout_s"])
            self._reload_job = job
            threading.Thread(
                target=job.run, args=(self._reload_runtime,), name="boxwatch-reload", daemon=True
            ).start()

    def _reload_refused(self, result: str, reason: str) -> None:
        self.metrics.artifact_reloads.labels(result).inc()
        self.status.reload_failures += 1
        log.error("artifact reload failed, keeping %s: %s", self.runtime.artifact_id, reason)

    def _finish_reload(self, job: ReloadJob) -> None:
        """Swap in a loaded candidate; keep the running artifact on any failure."""
        if job.error is not None:
            exc = job.error
            reason = str(exc) if isinstance(exc, BoxwatchError) else _one_line(exc)
            self._reload_refused("failure", reason)
            return
        new = job.runtime
        assert new is not None  # set whenever the load did not raise
        if (
            new.artifact.created_at < self.runtime.artifact.created_at
            and not self.cfg["allow_rollback"]
        ):
            self.metrics.artifact_reloads.labels("refused_rollback").inc()
            self.status.reload_failures += 1
            log.error(
                "artifact reload refused: %s is older than the running %s (set "
                "allow_rollback to accept)",
                new.artifact_id,
                self.runtime.artifact_id,
            )
            return
        self._install_runtime(new)
        self.metrics.artifact_reloads.labels("success").inc()
        self.status.reloads += 1
        log.info("artifact reloaded: now %s", new.artifact_id)


def _one_line(exc: BaseException) -> str:
    """An unexpected exception as one short line (its type and the start of its message)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def build_agent(cfg: AgentConfig, metrics: AgentMetrics | None = None) -> Agent:
    """Load and verify the artifact named by ``cfg`` and make an :class:`Agent` (no I/O yet)."""
    set_box_kernel(cfg["box_kernel"])

    def load():
        return load_runtime(
            cfg["artifact"],
            cfg["public_keys"],
            model_path=cfg["model"],
            threads=cfg["inference_threads"],
        )

    return Agent(cfg, load(), metrics or AgentMetrics(), reload_runtime=load)


def serve(agent: Agent) -> AgentHTTPServer:
    """Start the HTTP endpoints of ``agent`` on its configured address."""

    def status() -> dict[str, Any]:
        rt = agent.runtime
        return {
            **agent.status.snapshot(),
            "artifact_id": rt.artifact_id,
            "model_version": rt.model_version,
            "ready": agent.ready(),
            "monitors_model": rt.tap is not None,
            "has_bn": rt.diagram is not None,
            "input_range_checked": rt.input_range is not None,
            # What the build measured on validation data (absent in older artifacts).
            "build_verdict_split": rt.artifact.contents.get("verdict_split"),
        }

    return AgentHTTPServer(
        agent.cfg["metrics.address"],
        agent.metrics.registry,
        healthy=agent.alive,
        ready=agent.ready,
        status=status,
        request_timeout_s=agent.cfg["metrics.request_timeout_s"],
        max_connections=agent.cfg["metrics.max_connections"],
    ).start()
