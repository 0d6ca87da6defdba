"""kafka-python behind the agent's Kafka interface (``kafka.library: kafka-python``).

The client options of the config (``kafka.client``: SASL, SSL...) pass through unchanged to
every kafka-python client that knows them (so a consumer-only option such as
``group_instance_id``, for static group membership, reaches only the consumer); the agent's
own reliability settings override them.

kafka-python fails on a header name that is not UTF-8 (a ``CorruptRecordError`` that stalls
its partition for good); :func:`install_lenient_header_names` makes it read such names as
:class:`headers.UndecodableName` instead, so the record reaches the agent and becomes a
dead letter.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as TP
from kafka.admin import NewTopic
from kafka.coordinator.base import MemberState
from kafka.errors import (
    CommitFailedError,
    CorruptRecordError,
    IllegalGenerationError,
    InvalidRecordError,
    KafkaConfigurationError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RebalanceInProgressError,
    RecordListTooLargeError,
    TopicAlreadyExistsError,
    UnknownMemberIdError,
    UnsupportedForMessageFormatError,
)
from kafka.partitioner.default import DefaultPartitioner, murmur2
from kafka.record import default_records
from kafka.structs import OffsetAndMetadata

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka.base import (
    FLUSH_SLICE_S,
    IDLE_CHECK_TIMEOUT_S,
    ClientAdapter,
    Consumed,
    DeliveryFailure,
    GroupMoved,
    IdlePacer,
    KafkaUnavailable,
    Outgoing,
    Partition,
    PartitionsCallback,
)
from boxwatch.agent.kafka.headers import UndecodableName

log = logging.getLogger(__name__)

# A poll while the group join is in progress waits at least this long. kafka-python 3.0
# forgets a JoinGroup + SyncGroup that completes while no poll is waiting for it and sends a
# fresh JoinGroup, which restarts the rebalance for every member: with 20 ms polls a member
# joining a group could loop so for minutes (seen on noida-db). The join waits for the other
# members' next heartbeat (1 s apart), so a few seconds cover it.
JOIN_POLL_S = 3.0
# Errors after which a poll, delivery or commit is retried rather than fatal.
RETRYABLE = (KafkaError, TimeoutError, ConnectionError, OSError)
# A commit refused because a rebalance moved on (kafka-python reports the broker's
# ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID and REBALANCE_IN_PROGRESS as CommitFailedError, and
# refuses by itself while the member is unjoined or joining): retrying cannot succeed.
MOVED = (CommitFailedError, RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError)
# What a send refuses for good, whatever the broker's state: the output itself is at fault
# (local checks, and the broker's answers about the record). Every other failure is retried.
REFUSED = (
    TypeError,
    ValueError,
    AssertionError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    InvalidRecordError,
    CorruptRecordError,
    UnsupportedForMessageFormatError,
)


def _read_record_lenient(batch: Any) -> Any:
    """One v2 record from ``batch`` at its position; names that are not UTF-8 kept as bytes.

    The record layout of kafka-python's ``DefaultRecordBatch._read_msg`` (Kafka's message
    format v2), used only where that method failed on a header name.
    """
    decode_varint = default_records.decode_varint
    buffer, pos = batch._buffer, batch._pos
    length, pos = decode_varint(buffer, pos)
    start = pos
    _, pos = decode_varint(buffer, pos)
    ts_delta, pos = decode_varint(buffer, pos)
    timestamp = (
        batch.max_timestamp
        if batch.timestamp_type == batch.LOG_APPEND_TIME
        else batch.first_timestamp + ts_delta
    )
    offset_delta, pos = decode_varint(buffer, pos)
    fields = []
    for _ in range(2):  # key, value: nullable bytes
        n, pos = decode_varint(buffer, pos)
        fields.append(bytes(buffer[pos : pos + n]) if n >= 0 else None)
        pos += max(n, 0)
    count, pos = decode_varint(buffer, pos)
    headers = []
    for _ in range(max(count, 0)):
        n, pos = decode_varint(buffer, pos)
        raw = bytes(buffer[pos : pos + n])
        try:
            name: str = raw.decode("utf-8")
        except UnicodeDecodeError:
            name = UndecodableName(raw)
        pos += n
        n, pos = decode_varint(buffer, pos)
        headers.append((name, bytes(buffer[pos : pos + n]) if n >= 0 else None))
        pos += max(n, 0)
    if count < 0 or pos - start != length:
        raise default_records.CorruptRecordError("invalid record structure")
    batch._pos = pos
    kind = (
        default_records.ControlRecord if batch.is_control_batch else default_records.DefaultRecord
    )
    return kind(
        length,
        batch.base_offset + offset_delta,
        timestamp,
        batch.timestamp_type,
        fields[0],
        fields[1],
        headers,
    )


def install_lenient_header_names() -> None:
    """Make kafka-python read non-UTF-8 header names instead of failing the partition."""
    cls = default_records.DefaultRecordBatch
    strict = cls._read_msg
    if getattr(strict, "boxwatch_lenient", False):
        return

    def read_msg(self, *args, **kwargs):
        try:
            return strict(self, *args, **kwargs)
        except UnicodeDecodeError:  # strict moves the position only on success
            return _read_record_lenient(self)

    read_msg.boxwatch_lenient = True  # type: ignore[attr-defined]  # marks the patch as applied
    cls._read_msg = read_msg


def client_options(
    cfg: Mapping[str, Any], client: type[KafkaConsumer | KafkaProducer | KafkaAdminClient]
) -> dict[str, Any]:
    """The ``kafka.client`` options meant for ``client`` (a kafka-python client class).

    An option no kafka-python client knows is passed on, so the client refuses it loudly.
    """
    known = (
        KafkaConsumer.DEFAULT_CONFIG,
        KafkaProducer.DEFAULT_CONFIG,
        KafkaAdminClient.DEFAULT_CONFIG,
    )
    return {
        k: v
        for k, v in cfg["kafka.client"].items()
        if k in client.DEFAULT_CONFIG or not any(k in d for d in known)
    }


def consumer_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Options of the agent's consumer: manual commits, bounded batches, quick rebalance."""
    return {
        **client_options(cfg, KafkaConsumer),
        "bootstrap_servers": cfg["kafka.bootstrap_servers"].split(","),
        "group_id": cfg["kafka.group_id"],
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": cfg["batch.max_records"],
        # The broker may hold a fetch this long waiting for data; keep it within the batch
        # wait, or an idle-ish stream pays up to kafka-python's 500 ms default per record.
        "fetch_max_wait_ms": min(cfg["batch.max_wait_ms"], 500),
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
        "client_id": "boxwatch-agent",
    }


def producer_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Options of the agent's producer: acks=all, ordered retries, bounded blocking."""
    return {
        # A micro-batch's outputs for one partition fit one record batch (256 verdicts of
        # ~420 bytes over 1-6 partitions: 18-110 KB; kafka-python's default is 16 KB): each
        # new batch wakes the sender thread, which then competes with the loop for the GIL.
        # Far below the brokers' 1 MB default message limit. kafka.client may change it.
        "batch_size": 128 * 1024,
        **client_options(cfg, KafkaProducer),
        "bootstrap_servers": cfg["kafka.bootstrap_servers"].split(","),
        "acks": "all",
        # deliver() flushes every batch of outputs at once; until then the sender need not
        # start on part of it (a full record batch still goes at once).
        "linger_ms": 100,
        "max_in_flight_requests_per_connection": 1,
        # kafka-python 3's idempotent producer never delivers again after a batch times out
        # during a broker outage (seen on both test brokers); one in-flight request keeps
        # per-partition order without it, and redelivery is at-least-once anyway.
        "enable_idempotence": False,
        "retries": 5,
        "request_timeout_ms": 10_000,
        "delivery_timeout_ms": 30_000,
        # A send waits this long for metadata or buffer space: it bounds how long a stop
        # request can wait behind it.
        "max_block_ms": 2_000,
        "client_id": "boxwatch-agent",
    }


def _create(client: type, options: dict[str, Any]) -> Any:
    """``client(**options)``, with refused options reported as one clear ConfigError."""
    try:
        return client(**options)
    except (KafkaConfigurationError, ValueError, TypeError, AssertionError) as exc:
        raise ConfigError(
            f"Kafka client options refused by kafka-python: {exc} (kafka.client "
            "takes kafka-python option names with kafka.library: kafka-python)"
        ) from None


def _admin(cfg: Mapping[str, Any]) -> KafkaAdminClient:
    try:
        return _create(
            KafkaAdminClient,
            {
                **client_options(cfg, KafkaAdminClient),
                "bootstrap_servers": cfg["kafka.bootstrap_servers"].split(","),
                "client_id": "boxwatch-agent-admin",
                "request_timeout_ms": 10_000,
            },
        )
    except KafkaError as exc:
        raise ConfigError(
            f"cannot reach Kafka at {cfg['kafka.bootstrap_servers']} ({type(exc).__name__})"
        ) from None


def list_topics(cfg: Mapping[str, Any]) -> set[str]:
    admin = _admin(cfg)
    try:
        return set(admin.list_topics())
    except KafkaError as exc:
        raise ConfigError(
            f"topic check failed on {cfg['kafka.bootstrap_servers']}: {exc}"
        ) from None
    finally:
        admin.close()


def create_topics(cfg: Mapping[str, Any], names: list[str], partitions: int) -> None:
    admin = _admin(cfg)
    try:
        admin.create_topics([NewTopic(t, partitions, 1) for t in names])
        log.info("created topics %s", names)
    except TopicAlreadyExistsError:
        pass
    except KafkaError as exc:
        raise ConfigError(
            f"creating {names} failed on {cfg['kafka.bootstrap_servers']}: {exc}"
        ) from None
    finally:
        admin.close()


class KafkaPythonConsumer:
    """A subscribed :class:`KafkaConsumer` with the agent's pause and commit semantics."""

    def __init__(
        self,
        cfg: Mapping[str, Any],
        topics: list[str],
        *,
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None:
        install_lenient_header_names()
        self.raw = _create(KafkaConsumer, consumer_options(cfg))
        self.paused = False
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._pacer = IdlePacer()
        self._parked = False
        self.raw.subscribe(topics, listener=_Listener(self))

    def poll(self, max_records: int, timeout_s: float) -> list[Consumed]:
        """Up to ``max_records`` records.

        A quiet consumer parks: while parked a poll waits inside kafka-python until the
        next idle slot (a kafka-python poll costs about a millisecond of CPU even with
        nothing to fetch), and at each slot the end offsets are checked. A group join in
        progress is polled for at least :data:`JOIN_POLL_S` (see there).
        """
        if self._rebalancing():
            timeout_s = max(timeout_s, JOIN_POLL_S)
        elif not self.paused:
            if self._parked:
                if self._pacer.take_slot() and self._news():
                    self._unpark()
                else:
                    timeout_s = max(self._pacer.until_slot(), 0.001)
            elif self._pacer.idle(assigned=bool(self.raw.assignment())):
                self._park()
        try:
            polled = self.raw.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except RETRYABLE as exc:
            raise KafkaUnavailable(f"poll failed: {exc}") from exc
        records = [r for recs in polled.values() for r in recs]
        if records:
            self._pacer.saw(len(records))
        return records

    def _rebalancing(self) -> bool:
        """Whether the group coordinator has a join to finish: the consumer does not park
        in the middle of one."""
        coordinator = getattr(self.raw, "_coordinator", None)
        if coordinator is None:
            return False
        try:
            return bool(coordinator.need_rejoin()) or coordinator.state != MemberState.STABLE
        except Exception:  # a private API: on any surprise, never park
            return True

    def _park(self) -> None:
        """Pause every assigned partition: kafka-python then sends no fetch, and ``poll``
        waits in ``select`` while still serving heartbeats and rebalances. Records fetched
        before the pause are not returned and the positions stay, so a resume fetches them
        again: nothing is skipped or read twice."""
        self.raw.pause(*self.raw.assignment())
        self._parked = True
        self._pacer.take_slot()  # the first check one interval from now

    def _news(self) -> bool:
        """Whether some assigned partition's end offset is past the consumer's position (a
        broker error counts as news: the normal fetch path then reports it).

        kafka-python moves the position past a transaction marker when it fetches one, so
        the marker wakes the consumer at most once. A wake-up whose fetch has brought
        nothing by the next quiet spell leaves the position where it was, so the next check
        wakes it again: nothing below the end offset is taken as read because of the end
        offset itself, however the broker counts it and however late the fetch comes."""
        assigned = list(self.raw.assignment())
        try:
            ends = self.raw.end_offsets(assigned, timeout_ms=int(IDLE_CHECK_TIMEOUT_S * 1000))
            for tp in assigned:
                position = self.raw.position(tp, timeout_ms=int(IDLE_CHECK_TIMEOUT_S * 1000))
                end = ends.get(tp)
                if position is None or end is None:
                    return True
                if end > position:
                    return True
        except RETRYABLE as exc:
            log.debug("idle check failed: %s", exc)
            return True
        return False

    def _unpark(self) -> None:
        """Resume every assigned partition; consumption is unpaced until the next quiet
        spell."""
        self._parked = False
        self._pacer.restart()
        self.raw.resume(*self.raw.assignment())

    def pause(self) -> None:
        self.paused = True
        self.raw.pause(*self.raw.assignment())

    def resume(self) -> None:
        self.paused = False
        self._parked = False
        self._pacer.restart()
        self.raw.resume(*self.raw.assignment())

    def keep_membership(self) -> None:
        """Poll while paused so the group keeps this member; never consume records here.

        A rebalance during the poll hands out partitions unpaused (kafka-python resets the
        pause state): anything it returns is sought back (fetched again after recovery, not
        skipped) and every partition paused again. A join in progress gets
        :data:`JOIN_POLL_S` to finish.
        """
        wait_ms = int(JOIN_POLL_S * 1000) if self._rebalancing() else 0
        try:
            polled = self.raw.poll(timeout_ms=wait_ms)
        except RETRYABLE:
            return
        for tp, recs in polled.items():
            if recs:
                self.raw.seek(tp, recs[0].offset)
        self.raw.pause(*self.raw.assignment())

    def commit(self, offsets: Mapping[Partition, int], timeout_s: float) -> None:
        try:
            self.raw.commit(
                {TP(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()},
                timeout_ms=int(timeout_s * 1000),
            )
        except MOVED as exc:
            raise GroupMoved(f"commit refused: {exc}") from exc
        except RETRYABLE as exc:
            raise KafkaUnavailable(f"commit failed: {exc}") from exc

    def lag(self) -> dict[Partition, int]:
        assigned = list(self.raw.assignment())
        if not assigned:
            return {}
        try:
            ends = self.raw.end_offsets(assigned, timeout_ms=2000)
            out = {}
            for tp in assigned:
                pos = self.raw.position(tp, timeout_ms=1000)
                if pos is not None and tp in ends:
                    out[(tp.topic, tp.partition)] = max(ends[tp] - pos, 0)
            return out
        except RETRYABLE as exc:
            raise KafkaUnavailable(f"lag query failed ({type(exc).__name__})") from exc

    def close(self, timeout_s: float) -> None:
        self.raw.close(autocommit=False, timeout_ms=int(timeout_s * 1000))


class _Listener(ConsumerRebalanceListener):
    def __init__(self, consumer: KafkaPythonConsumer) -> None:
        self.consumer = consumer

    def on_partitions_revoked(self, revoked):
        if self.consumer._on_revoke:
            self.consumer._on_revoke([(tp.topic, tp.partition) for tp in revoked])

    def on_partitions_assigned(self, assigned):
        log.info("assigned %d partitions", len(assigned))
        if self.consumer.paused and assigned:
            self.consumer.raw.pause(*assigned)  # still backpressured: stay paused
        elif self.consumer._parked and assigned:
            self.consumer.raw.resume(*assigned)  # a partition paused while parked may come back
        self.consumer._parked = False
        self.consumer._pacer.restart()
        if self.consumer._on_assign:
            self.consumer._on_assign([(tp.topic, tp.partition) for tp in assigned])


_TopicPartitions = dict[str, list[TP]]


def direct_appender(
    raw: KafkaProducer,
) -> Callable[[str, bytes, bytes, _TopicPartitions], Any] | None:
    """A function that does what ``raw.send(topic, value, key)`` does for a keyed record
    without headers, in half the time: the default partitioner's choice (murmur2 of the
    key over the topic's partitions), the record appended to the producer's accumulator,
    the same future returned.

    ``send`` spends the other half re-checking what the agent's verdict and gate records
    always are (bytes, no serializer, a known topic, far below the size limit) and
    formatting a debug line. Unlike ``send`` it does not wake the sender thread when a
    record batch is new or full: the caller flushes, which wakes it, once the list is
    appended (woken earlier, the sender takes the partitions' locks while the loop is
    appending under them, and the two hand the GIL back and forth). The function returns
    None where ``send`` must decide: a topic without metadata yet (it waits for it). It is
    None itself where this kafka-python's internals are not the ones it was written against
    (the accumulator of kafka-python 3) or a setting changes what ``send`` does (a
    partitioner, serializers, transactions).
    """
    acc = getattr(raw, "_accumulator", None)
    sender = getattr(raw, "_sender", None)
    metadata = getattr(raw, "_metadata", None)
    tm = getattr(raw, "_transaction_manager", None)
    if acc is None or sender is None or metadata is None:
        return None
    try:
        params = list(inspect.signature(acc.append).parameters)
    except (TypeError, ValueError):
        return None
    config = raw.config
    if (
        params[:5] != ["tp", "timestamp_ms", "key", "value", "headers"]
        or "abort_on_new_batch" not in params
        or type(config.get("partitioner")) is not DefaultPartitioner
        or config.get("key_serializer") is not None
        or config.get("value_serializer") is not None
        or (tm is not None and tm.is_transactional())
    ):
        return None
    append, partitions_for = acc.append, metadata.partitions_for_topic

    def send_keyed(topic: str, key: bytes, value: bytes, known: _TopicPartitions) -> Any:
        """``known`` caches each topic's partitions for one list of outputs."""
        tps = known.get(topic)
        if tps is None:
            ids = partitions_for(topic)
            if not ids:
                return None
            tps = known[topic] = [TP(topic, p) for p in sorted(ids)]
        return append(tps[(murmur2(key) & 0x7FFFFFFF) % len(tps)], None, key, value, [])[0]

    return send_keyed


class KafkaPythonProducer:
    """A :class:`KafkaProducer` (acks=all) delivering lists of outputs."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.raw = _create(KafkaProducer, producer_options(cfg))
        self.direct = direct_appender(self.raw)
        # Records this small are far below max_request_size, the one limit send checks.
        self._direct_bytes = self.raw.config["max_request_size"] // 2

    def deliver(
        self, outputs: Sequence[Outgoing], timeout_s: float, stop: threading.Event | None = None
    ) -> list[DeliveryFailure]:
        """Send all, flush, and report each output not acknowledged and whether to retry it.

        The flush waits in slices, so a set ``stop`` ends it at once (what is unanswered
        then is reported retriable: nothing is committed, the batch comes again; what the
        direct path appended goes out at the latest when the linger ends).
        """
        failed: list[DeliveryFailure] = []
        futures = []
        send = self.raw.send
        direct = None if getattr(self.raw, "_closed", False) else self.direct
        limit = self._direct_bytes
        known: _TopicPartitions = {}
        for i, out in enumerate(outputs):
            try:
                key, value = out.key, out.value
                future = None
                if (
                    direct is not None
                    and not out.headers
                    and type(key) is bytes
                    and type(value) is bytes
                    and len(key) + len(value) < limit
                ):
                    future = direct(out.topic, key, value, known)
                if future is None:
                    future = send(out.topic, key=key, value=value, headers=out.headers)
                futures.append((out, future))
            except REFUSED as exc:
                failed.append(DeliveryFailure(out, f"{type(exc).__name__}: {exc}", False))
            except RETRYABLE as exc:
                log.warning("send to %s failed: %s", out.topic, exc)
                failed.extend(
                    DeliveryFailure(o, f"{type(exc).__name__}", True) for o in outputs[i:]
                )
                break
        deadline = time.monotonic() + timeout_s
        while futures and not (stop is not None and stop.is_set()):
            left = deadline - time.monotonic()
            try:
                self.raw.flush(timeout=max(min(FLUSH_SLICE_S, left), 0.0))
                break
            except KafkaTimeoutError:
                if left <= FLUSH_SLICE_S:
                    break
            except RETRYABLE as exc:
                log.warning("flush failed: %s", exc)
                break
        for out, fut in futures:
            if not fut.is_done:
                failed.append(DeliveryFailure(out, "not acknowledged in time", True))
            elif fut.failed():
                error = fut.exception
                failed.append(
                    DeliveryFailure(
                        out, f"{type(error).__name__}: {error}", not isinstance(error, REFUSED)
                    )
                )
        return failed

    def close(self, timeout_s: float) -> None:
        """Flush up to ``timeout_s``, then close; what is still unanswered is abandoned.

        kafka-python's ``close`` raises when its flush times out and leaves the producer
        open: its sender is then closed without sending the rest (nothing of that batch was
        committed, so it comes again after restart).
        """
        try:
            self.raw.close(timeout=timeout_s)
        except KafkaTimeoutError:
            log.warning(
                "outputs still unacknowledged after %.1fs; closing the producer without them",
                timeout_s,
            )
            sender = getattr(self.raw, "_sender", None)
            if sender is not None:
                sender.force_close()
                sender.join(timeout=1.0)


ADAPTER = ClientAdapter(
    consumer=KafkaPythonConsumer,
    producer=KafkaPythonProducer,
    list_topics=list_topics,
    create_topics=create_topics,
)
"""This library behind the agent's Kafka interface (a row of
:data:`boxwatch.agent.kafka.clients.LIBRARIES` names it)."""
