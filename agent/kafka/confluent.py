"""confluent-kafka (librdkafka) behind the agent's Kafka interface (``kafka.library:
confluent-kafka``).

``kafka.client`` holds librdkafka properties here (``security.protocol``,
``sasl.mechanisms``, ``sasl.username``, ``ssl.ca.location``, ...), passed through unchanged;
the agent's reliability settings override them. librdkafka reconnects and retries by
itself; what it reports through ``error_cb`` is logged, and calls that time out raise
:class:`KafkaUnavailable` so the agent loop backs off as with kafka-python.

A quiet consumer is parked (see :class:`ConfluentConsumer`): librdkafka refetches in its own
thread as fast as the broker answers, and noida-db answers an empty fetch at once, so an idle
agent used 15-55 % of a core there until issue 24.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka.base import (
    FLUSH_SLICE_S,
    ClientAdapter,
    Consumed,
    DeliveryFailure,
    GroupMoved,
    IdlePacer,
    KafkaUnavailable,
    Outgoing,
    Partition,
    PartitionsCallback,
    Record,
)
from boxwatch.agent.kafka.headers import UNREADABLE

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("boxwatch.agent.librdkafka")

ADMIN_TIMEOUT_S = 10.0
QUERY_TIMEOUT_S = 1.0
LAG_PROBE_S = 2.0
# Delivery errors about the record itself: sending the same bytes again cannot succeed.
REFUSED_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        KafkaError._INVALID_ARG,
        KafkaError._BAD_MSG,
    }
)

# Commit errors of a rebalance that moved on: retrying cannot succeed (see GroupMoved).
MOVED_CODES = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError._ASSIGNMENT_LOST,
    }
)


def _error_cb(err: KafkaError) -> None:
    """librdkafka's own log (the ``logger`` option) already reports each failed connection;
    only its summary events are worth a warning here."""
    if err.code() == KafkaError._ALL_BROKERS_DOWN or err.fatal():
        log.warning("kafka: %s", err.str())
    else:
        log.debug("kafka: %s", err.str())


def _base(cfg: Mapping[str, Any], client_id: str) -> dict[str, Any]:
    return {
        **cfg["kafka.client"],
        "bootstrap.servers": cfg["kafka.bootstrap_servers"],
        "client.id": client_id,
        "error_cb": _error_cb,
        "logger": _librdkafka_log,
    }


def _all_brokers_down(err: KafkaError) -> bool:
    return err.code() == KafkaError._ALL_BROKERS_DOWN


def consumer_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Manual commits, no auto offset store, fetches held at most the batch wait."""
    return {
        **_base(cfg, "boxwatch-agent"),
        "group.id": cfg["kafka.group_id"],
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": min(cfg["batch.max_wait_ms"], 500),
        # End-of-partition events carry the offset the fetcher reached, past offsets that
        # hold no record for the agent (transaction markers): see ConfluentConsumer.
        "enable.partition.eof": True,
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
        # Bound what librdkafka prefetches per partition (KiB), so a paused agent holds little.
        "queued.max.messages.kbytes": 16_384,
    }


def producer_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """acks=all, one request in flight per connection (order kept without idempotence)."""
    return {
        **_base(cfg, "boxwatch-agent"),
        "acks": "all",
        "linger.ms": 1,
        "max.in.flight.requests.per.connection": 1,
        "enable.idempotence": False,
        "message.timeout.ms": 30_000,
        "request.timeout.ms": 10_000,
        "queue.buffering.max.messages": 200_000,
        "topic.metadata.refresh.interval.ms": 10_000,
    }


def _refuse(cfg: Mapping[str, Any], exc: Exception) -> ConfigError:
    return ConfigError(
        f"Kafka client options refused by librdkafka: {exc} (kafka.library is "
        f"confluent-kafka: kafka.client takes librdkafka property names)"
    )


def _admin(cfg: Mapping[str, Any]) -> AdminClient:
    try:
        return AdminClient(_base(cfg, "boxwatch-agent-admin"))
    except (KafkaException, ValueError, TypeError) as exc:
        raise _refuse(cfg, exc) from None


def list_topics(cfg: Mapping[str, Any]) -> set[str]:
    admin = _admin(cfg)
    try:
        meta = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise ConfigError(
            f"cannot reach Kafka at {cfg['kafka.bootstrap_servers']} "
            f"({exc.args[0].str() if exc.args else exc})"
        ) from None
    return set(meta.topics)


def create_topics(cfg: Mapping[str, Any], names: list[str], partitions: int) -> None:
    admin = _admin(cfg)  # kept referenced until every result is in
    futures = admin.create_topics(
        [NewTopic(t, partitions, 1) for t in names], operation_timeout=ADMIN_TIMEOUT_S
    )
    for name, fut in futures.items():
        try:
            fut.result(ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise ConfigError(
                f"creating topic {name} failed on {cfg['kafka.bootstrap_servers']}: {exc}"
            ) from None
    log.info("created topics %s", names)


def _headers(m: Any) -> list[tuple[str, bytes | None]]:
    """The message's headers, or :data:`headers.UNREADABLE` when the binding cannot read them.

    On a header name that is not UTF-8, ``Message.headers()`` raises ``SystemError``, or
    returns with the decoding error still set, which the next checked C call raises: the
    ``tuple`` built here is that call, so the error surfaces inside this ``try``.
    """
    try:
        headers = m.headers()
        tuple.__new__(tuple, (headers,))
    except (UnicodeDecodeError, SystemError, ValueError):
        return list(UNREADABLE)
    return headers or []


class _CommitJob:
    """One commit handed to the commit thread, and its outcome."""

    def __init__(self, offsets: list[TopicPartition]) -> None:
        self.offsets = offsets
        self.done = threading.Event()
        self.error: KafkaException | None = None


_NEW = tuple.__new__  # builds a Record from a tuple without the NamedTuple's Python-level call


def _record(m: Any) -> Record:
    ts_type, ts = m.timestamp()
    return _NEW(
        Record,
        (
            m.topic(),
            m.partition(),
            m.offset(),
            ts if ts_type else 0,
            m.key(),
            m.value(),
            _headers(m),
        ),
    )


class _Parking:
    """Where each partition of a parked consumer stands: ``start`` is the next offset to
    read (the consumer's position, else its committed offset, else the low watermark, which
    ``auto.offset.reset: earliest`` starts from); a high watermark past it means news."""

    def __init__(self, start: dict[Partition, int]) -> None:
        self.start = start


class ConfluentConsumer:
    """A subscribed librdkafka consumer with the agent's pause and commit semantics.

    Idle parking: after :data:`~boxwatch.agent.kafka.base.IDLE_AFTER_S` without a record
    (partitions assigned, not paused for backpressure) the consumer pauses its partitions, so
    librdkafka stops fetching, and at each :class:`IdlePacer` slot asks the broker for the high
    watermarks (one small request per partition). When one is past the partition's position
    the partitions are resumed and each is sought to its position, so nothing fetched before
    the pause is skipped or read twice; consumption then runs unpaced until the next quiet
    spell. Polls while parked wait in librdkafka, so rebalance callbacks are served at once.

    A position moves only with what the fetcher reached: a record, or an end-of-partition
    event (its offset is past a transaction marker, which a high watermark counts but no
    record carries, so the marker wakes the consumer at most once). A wake-up whose fetch has
    brought nothing by the next quiet spell leaves the position where it was, so the next
    check wakes the consumer again: nothing below the high watermark is taken as read
    because of the watermark itself, however the broker counts it (Tansu's counts batches)
    and however late the fetch comes.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        topics: list[str],
        *,
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None:
        self._down = False
        try:
            self.raw = Consumer({**consumer_options(cfg), "error_cb": self._on_error})
        except (KafkaException, ValueError, TypeError) as exc:
            raise _refuse(cfg, exc) from None
        self.paused = False
        self._on_assign, self._on_revoke = on_assign, on_revoke
        # Lag: the loop thread records positions; a probe thread with its own librdkafka
        # handle (never shared across threads) asks the broker for high watermarks.
        self._probe_options = {
            **_base(cfg, "boxwatch-agent-lag"),
            "log_level": 0,
            "group.id": f"{cfg['kafka.group_id']}.lag-probe",
            "enable.auto.commit": False,
        }
        for key in ("error_cb", "logger"):  # served only by poll(), which the probe never calls
            self._probe_options.pop(key)
        self._commits: queue.SimpleQueue[_CommitJob | None] = queue.SimpleQueue()
        self._committer: threading.Thread | None = None
        self._assignment: set[Partition] = set()
        self._positions: dict[Partition, int] = {}
        self._closing = threading.Event()
        self._prober: threading.Thread | None = None
        self._last_lag: tuple[bool, dict[Partition, int] | str] = (True, {})
        self._pacer = IdlePacer()
        self._parked: _Parking | None = None
        self.raw.subscribe(
            topics, on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked
        )

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka reconnects by itself; remember when every broker is down."""
        if _all_brokers_down(err):
            self._down = True
        _error_cb(err)

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %d partitions", len(partitions))
        consumer.assign(partitions)
        self._assignment = {(tp.topic, tp.partition) for tp in partitions}
        if self.paused and partitions:
            consumer.pause(partitions)  # still backpressured: stay paused
        elif self._parked is not None and partitions:
            consumer.resume(partitions)  # a partition paused while parked may come back
        self._parked = None
        self._pacer.restart()
        if self._on_assign:
            self._on_assign([(tp.topic, tp.partition) for tp in partitions])

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self._assignment = self._assignment - gone
        self._positions = {tp: o for tp, o in self._positions.items() if tp not in gone}
        if self._parked is not None:
            for tp in gone:
                self._parked.start.pop(tp, None)
        if self._on_revoke:
            self._on_revoke([(tp.topic, tp.partition) for tp in partitions])

    def poll(self, max_records: int, timeout_s: float) -> list[Consumed]:
        """Up to ``max_records`` records; parks a quiet consumer and, while parked, checks
        the high watermarks at each idle slot (waiting in librdkafka until then)."""
        if not self.paused:
            if self._parked is not None:
                if self._pacer.take_slot() and self._news(self._parked):
                    self._unpark(self._parked)
            elif self._pacer.idle(assigned=bool(self._assignment)):
                self._park()
        if self._parked is not None:
            timeout_s = min(timeout_s, self._pacer.until_slot())
        try:
            msgs = self.raw.consume(max_records, timeout_s)
        except KafkaException as exc:
            raise KafkaUnavailable(f"poll failed: {exc}") from exc
        out: list[Consumed] = []
        append = out.append
        ends: list[Any] = []  # end-of-partition events, taken after the records before them
        for m in msgs:
            err = m.error()
            if err is None:
                append(_record(m))
            elif err.code() == KafkaError._PARTITION_EOF:
                ends.append(m)
            else:
                log.warning("consume: %s", err.str())
        if out:
            self._down = False
            # A partition's records come in offset order: its last one is where it stands.
            self._positions.update({(r.topic, r.partition): r.offset + 1 for r in out})
            self._pacer.saw(len(out))
        for event in ends:
            self._reached_end(event)
        return out

    def _reached_end(self, event: Any) -> None:
        """Take the offset of an end-of-partition event as the partition's position: the
        fetcher stood there, every record before it already delivered (the event is queued
        after them), so offsets that hold no record (transaction markers) count as read."""
        topic, partition, offset = event.topic(), event.partition(), event.offset()
        if topic is not None and partition is not None and offset is not None and offset >= 0:
            self._positions[(topic, partition)] = offset

    def _park(self) -> None:
        """Pause every assigned partition and note where each stands (see the class doc).

        On a broker error the consumer stays unparked and tries again after another quiet
        spell."""
        tps = [TopicPartition(t, p) for t, p in sorted(self._assignment)]
        # The positions this consumer recorded: librdkafka's own position() is unset again
        # after a seek until the next record, and a pause then makes resume start over at
        # the committed offset.
        start = {tp: o for tp, o in self._positions.items() if tp in self._assignment and o >= 0}
        try:
            unknown = [tp for tp in tps if (tp.topic, tp.partition) not in start]
            if unknown:
                for tp in self.raw.committed(unknown, timeout=QUERY_TIMEOUT_S):
                    if tp.offset >= 0:
                        start[(tp.topic, tp.partition)] = tp.offset
            for tp in tps:
                if (tp.topic, tp.partition) not in start:
                    low, _ = self.raw.get_watermark_offsets(
                        tp, timeout=QUERY_TIMEOUT_S, cached=False
                    )
                    start[(tp.topic, tp.partition)] = low
        except KafkaException as exc:
            log.debug("not parking: %s", exc)
            self._pacer.restart()
            return
        self.raw.pause(tps)
        self._parked = _Parking(start)
        self._pacer.take_slot()  # the first check one interval from now

    def _news(self, parked: _Parking) -> bool:
        """Whether some parked partition's high watermark is past where it stands (a broker
        error counts as news: librdkafka's own fetching and error reporting then take over)."""
        try:
            for (topic, partition), start in sorted(parked.start.items()):
                _, high = self.raw.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=QUERY_TIMEOUT_S, cached=False
                )
                if high > start:
                    return True
        except KafkaException as exc:
            log.debug("idle check failed: %s", exc)
            return True
        return False

    def _unpark(self, parked: _Parking) -> None:
        """Resume every assigned partition and seek it to where it stands: librdkafka drops
        what it fetched before the pause, and a resume alone waits for its fetcher's next
        round (about 1 s here); a seek starts the fetch at once."""
        self._parked = None
        self._pacer.restart()
        tps = [TopicPartition(t, p) for t, p in sorted(self._assignment)]
        self.raw.resume(tps)
        for (topic, partition), offset in sorted(parked.start.items()):
            if (topic, partition) in self._assignment:
                try:
                    self.raw.seek(TopicPartition(topic, partition, offset))
                except KafkaException as exc:  # not fetching yet: resume alone restarts it
                    log.debug("seek %s[%d] after idle: %s", topic, partition, exc)

    def pause(self) -> None:
        self.paused = True
        self.raw.pause(self.raw.assignment())

    def resume(self) -> None:
        self.paused = False
        if self._parked is not None:
            self._unpark(self._parked)
        else:
            self.raw.resume(self.raw.assignment())

    def keep_membership(self) -> None:
        """Serve callbacks while paused; anything a rebalance let through is sought back."""
        try:
            msgs = self.raw.consume(1_000, 0)
        except KafkaException:
            return
        first: dict[Partition, int] = {}
        for m in msgs:
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            if m.error() is None and topic is not None and partition is not None:
                first.setdefault((topic, partition), -1 if offset is None else offset)
        for (t, p), o in first.items():
            self.raw.seek(TopicPartition(t, p, o))
            self._positions[(t, p)] = o
        self.raw.pause(self.raw.assignment())

    def commit(self, offsets: Mapping[Partition, int], timeout_s: float) -> None:
        """A synchronous commit, waited for at most ``timeout_s``.

        librdkafka bounds a synchronous commit only by ``socket.timeout.ms`` (60 s), so it
        runs on a commit thread; one still unanswered after ``timeout_s`` is reported as a
        failure (the batch may then come again, as after any failed commit).
        """
        if self._committer is None:
            self._committer = threading.Thread(
                target=self._commit_loop, name="kafka-commit", daemon=True
            )
            self._committer.start()
        job = _CommitJob([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        self._commits.put(job)
        if not job.done.wait(timeout_s):
            raise KafkaUnavailable(f"commit not answered in {timeout_s:.1f}s")
        if job.error is not None:
            err = job.error.args[0] if job.error.args else None
            if isinstance(err, KafkaError) and err.code() in MOVED_CODES:
                raise GroupMoved(f"commit refused: {err.str()}") from job.error
            raise KafkaUnavailable(f"commit failed: {job.error}") from job.error

    def _commit_loop(self) -> None:
        while (job := self._commits.get()) is not None:
            try:
                self.raw.commit(offsets=job.offsets, asynchronous=False)
            except KafkaException as exc:
                job.error = exc
            job.done.set()

    def lag(self) -> dict[Partition, int]:
        """The latest figures of a background probe (its round trips never stall the loop),
        for the partitions assigned now: a probe begun before a rebalance never reports
        partitions this member no longer holds."""
        if self._prober is None:
            self._prober = threading.Thread(target=self._probe, name="kafka-lag", daemon=True)
            self._prober.start()
        ok, value = self._last_lag
        if self._down:
            raise KafkaUnavailable("all brokers are down")
        if not ok or isinstance(value, str):
            raise KafkaUnavailable(str(value))
        return {tp: n for tp, n in value.items() if tp in self._assignment}

    def _probe(self) -> None:
        try:
            handle = Consumer(self._probe_options)
        except (KafkaException, ValueError, TypeError) as exc:
            self._last_lag = (False, f"lag probe cannot start ({exc})")
            return
        try:
            while not self._closing.is_set():
                self._last_lag = self._query(handle)
                self._closing.wait(LAG_PROBE_S)
        finally:
            handle.close()

    def _query(self, handle: Consumer) -> tuple[bool, dict[Partition, int] | str]:
        """High watermark minus position for every assigned partition."""
        positions = dict(self._positions)
        out: dict[Partition, int] = {}
        try:
            for topic, partition in sorted(self._assignment):
                if self._closing.is_set():
                    break
                _, high = handle.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=QUERY_TIMEOUT_S, cached=False
                )
                self._down = False  # a broker answered
                if (topic, partition) in positions:
                    out[(topic, partition)] = max(high - positions[(topic, partition)], 0)
        except KafkaException as exc:
            return False, f"lag query failed ({exc})"
        return True, out

    def close(self, timeout_s: float) -> None:
        """Leave the group; librdkafka's close may block a session timeout, so bound it."""
        deadline = time.monotonic() + timeout_s
        self._closing.set()
        self._commits.put(None)
        if self._prober is not None:  # at most one query in flight; never close under it
            self._prober.join(min(QUERY_TIMEOUT_S + 0.5, timeout_s / 2))
        closer = threading.Thread(target=self.raw.close, name="kafka-close", daemon=True)
        closer.start()
        closer.join(max(deadline - time.monotonic(), 0.5))
        if closer.is_alive():
            log.warning("consumer close did not finish in %.1fs; leaving it", timeout_s)


class ConfluentProducer:
    """A librdkafka producer (acks=all) delivering lists of outputs."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        # Only failures are reported (one callback per failed message, none per success):
        # a batch is acknowledged when flush() leaves nothing outstanding and none failed.
        self._failed: dict[tuple[str, bytes | None, bytes | None], KafkaError] = {}
        try:
            self.raw = Producer(
                {
                    **producer_options(cfg),
                    "delivery.report.only.error": True,
                    "on_delivery": self._on_failure,
                }
            )
        except (KafkaException, ValueError, TypeError) as exc:
            raise _refuse(cfg, exc) from None

    def _on_failure(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._failed[(msg.topic(), msg.key(), msg.value())] = err
            log.warning("delivery failed: %s", err.str())

    def deliver(
        self, outputs: Sequence[Outgoing], timeout_s: float, stop: threading.Event | None = None
    ) -> list[DeliveryFailure]:
        """Produce all, flush, and report what is not known to be acknowledged.

        Failures arrive through :meth:`_on_failure` while flushing. An output that
        ``produce`` refuses for itself (too large, a value it cannot write) is reported
        not retriable and the others still go; when some are still unanswered at the
        timeout, or when ``stop`` is set (the flush waits in slices), all of them are
        reported (redelivery is at-least-once anyway).
        """
        failed: dict[tuple[str, bytes | None, bytes | None], KafkaError] = {}
        self._failed = failed
        refused: list[DeliveryFailure] = []
        produce = self.raw.produce
        sent = 0
        for out in outputs:
            try:
                if out.headers:
                    produce(out.topic, out.value, out.key, headers=out.headers)  # type: ignore[arg-type]  # the stub's list is invariant
                else:
                    produce(out.topic, out.value, out.key)
            except BufferError:
                self.raw.poll(0.1)  # queue full: serve callbacks; the rest is retried later
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() in REFUSED_CODES:
                    refused.append(DeliveryFailure(out, err.str(), False))
                    sent += 1
                    continue
                log.warning("send to %s failed: %s", out.topic, exc)
                self._refresh_metadata(out.topic)
                break
            except (TypeError, ValueError) as exc:
                refused.append(DeliveryFailure(out, f"{type(exc).__name__}: {exc}", False))
                sent += 1
                continue
            sent += 1
        deadline = time.monotonic() + timeout_s
        left = self.raw.flush(min(FLUSH_SLICE_S, timeout_s))
        while left and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            left = self.raw.flush(min(FLUSH_SLICE_S, max(deadline - time.monotonic(), 0.0)))
        if left:
            return [DeliveryFailure(out, "not acknowledged in time", True) for out in outputs]
        if sent == len(outputs) and not failed:
            return refused
        out_failures = list(refused)
        for k, out in enumerate(outputs):
            err = failed.get((out.topic, out.key, out.value))
            if k >= sent:
                out_failures.append(DeliveryFailure(out, "not sent", True))
            elif err is not None:
                out_failures.append(
                    DeliveryFailure(out, err.str(), err.code() not in REFUSED_CODES)
                )
        return out_failures

    def _refresh_metadata(self, topic: str) -> None:
        """Ask for ``topic``'s metadata now: librdkafka otherwise keeps a deleted (then
        re-created) topic unknown until its periodic refresh."""
        try:
            self.raw.list_topics(topic, timeout=QUERY_TIMEOUT_S)
        except KafkaException:
            pass

    def close(self, timeout_s: float) -> None:
        self.raw.flush(timeout_s)


ADAPTER = ClientAdapter(
    consumer=ConfluentConsumer,
    producer=ConfluentProducer,
    list_topics=list_topics,
    create_topics=create_topics,
)
"""This library behind the agent's Kafka interface (a row of
:data:`boxwatch.agent.kafka.clients.LIBRARIES` names it)."""
