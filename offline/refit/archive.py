"""A topic's records, read bounded from the broker or kept in a directory export.

:func:`read_topic` takes the end offset of every partition when it starts and reads from
the beginning up to them, with no consumer group (partitions assigned, nothing committed),
and never waits past its timeout; :func:`stream_topic` gives the same records as they come,
holding none. :func:`write_export` keeps those records as JSON Lines, streamed to disk,
one file per topic, and :func:`read_export` reads them back unchanged: a capture topic can
be archived and reviewed offline with nothing lost (docs/records.md, "Capture export").
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, NamedTuple

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaConfigurationError, KafkaError, KafkaTimeoutError

from boxwatch.agent.atomic import atomic_file
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka.base import KafkaUnavailable, Record
from boxwatch.agent.kafka.kafka_python import install_lenient_header_names

EXPORT_SCHEMA = "boxwatch.capture-export/1"
EXPORT_SUFFIX = ".export.jsonl"  # a directory read takes these files only (labels may sit beside)
_EXPORT_KEYS = {"schema", "topic", "partition", "offset", "timestamp_ms", "key", "headers", "value"}
_DRAIN_S = 2.0  # past the end offsets, polls for records written before the read, at most
_POLL_S = 0.5  # one poll's longest wait: the deadline is checked at least this often


class Located(NamedTuple):
    """A record and where it was read: ``topic:partition:offset``, or ``file:line (...)``."""

    where: str
    record: Record


def where(record: Record) -> str:
    """``topic:partition:offset``: where a record sits on its broker."""
    return f"{record.topic}:{record.partition}:{record.offset}"


def _bootstrap(brokers: str) -> list[str]:
    """``HOST:PORT[,...]`` as a list; :class:`ConfigError` naming what is not one."""
    out = [b.strip() for b in brokers.split(",") if b.strip()]
    for b in out:
        host, _, port = b.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--brokers: {b!r} is not HOST:PORT")
    if not out:
        raise ConfigError(f"--brokers: {brokers!r} names no HOST:PORT")
    return out


def _consumer(brokers: str, timeout_ms: int, client: Mapping[str, Any]) -> KafkaConsumer:
    """A consumer with no group and no commits, bootstrapping within ``timeout_ms``;
    ``client``: more kafka-python options (TLS, SASL), which cannot undo those."""
    install_lenient_header_names()  # a non-UTF-8 header name must not stall a partition
    return KafkaConsumer(
        **client,
        bootstrap_servers=_bootstrap(brokers),
        group_id=None,
        enable_auto_commit=False,
        allow_auto_create_topics=False,
        client_id="boxwatch-feedback",
        bootstrap_timeout_ms=timeout_ms,
        fetch_max_wait_ms=100,
        request_timeout_ms=max(1_000, min(timeout_ms, 30_000)),
    )


def read_topic(
    brokers: str,
    topic: str,
    *,
    timeout_s: float = 30.0,
    client: Mapping[str, Any] | None = None,
) -> list[Located]:
    """Every record of ``topic`` up to the end offsets taken at the start, by partition
    (``client``: kafka-python consumer options, say ``security_protocol``, for a secured
    cluster).

    Raises :class:`~boxwatch.agent.kafka.base.KafkaUnavailable` when the brokers cannot be
    reached or the records do not all arrive within ``timeout_s`` seconds, and
    :class:`~boxwatch.agent.errors.ConfigError` when the topic does not exist.
    """
    got: dict[int, list[Record]] = {}
    for record in stream_topic(brokers, topic, timeout_s=timeout_s, client=client):
        got.setdefault(record.partition, []).append(record)
    return [Located(where(r), r) for p in sorted(got) for r in got[p]]


def stream_topic(
    brokers: str,
    topic: str,
    *,
    timeout_s: float = 30.0,
    client: Mapping[str, Any] | None = None,
) -> Iterator[Record]:
    """:func:`read_topic`'s records as they arrive (each partition's in offset order, the
    partitions interleaved), holding none: for a topic larger than memory."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s} should be > 0")
    deadline = time.monotonic() + timeout_s

    def left_ms() -> int:
        return max(1, int((deadline - time.monotonic()) * 1000))

    try:
        consumer = _consumer(brokers, left_ms(), dict(client or {}))
    except KafkaConfigurationError as exc:  # an option kafka-python does not know
        raise ConfigError(f"--client-option: {exc}") from None
    except KafkaTimeoutError:
        raise KafkaUnavailable(f"cannot reach Kafka at {brokers} within {timeout_s:g} s") from None
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot reach Kafka at {brokers}: {exc}") from None
    try:
        yield from _read_bounded(consumer, topic, deadline, left_ms, brokers, timeout_s)
    except KafkaError as exc:
        raise KafkaUnavailable(f"reading {topic!r} from {brokers} failed: {exc}") from None
    finally:
        consumer.close()


def _read_bounded(
    consumer: KafkaConsumer,
    topic: str,
    deadline: float,
    left_ms: Callable[[], int],
    brokers: str,
    timeout_s: float,
) -> Iterator[Record]:
    """The records of ``topic`` below the end offsets of now (assumes a fresh consumer),
    and those written before now that a broker's end offsets leave out, as polls bring them.

    A broker whose high watermark counts record batches rather than records (Tansu) gives
    end offsets below its last record: the records of a fetched batch are kept whatever
    their offset when written before the read began, and once every partition is past its
    end offset the read goes on while polls still bring such records, for at most
    :data:`_DRAIN_S` (and never past the deadline). On a live topic the next records are
    newer, so that stops at once.
    """
    started_ms = int(time.time() * 1000)
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise ConfigError(f"topic {topic!r} does not exist on {brokers}")
    tps = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(tps)
    starts = consumer.beginning_offsets(tps, timeout_ms=left_ms())
    ends = consumer.end_offsets(tps, timeout_ms=left_ms())
    todo = {tp for tp in tps if ends[tp] > starts[tp]}
    for tp in tps:
        if tp in todo:
            consumer.seek(tp, starts[tp])
        else:
            consumer.pause(tp)
    read = 0
    while todo:
        if time.monotonic() >= deadline:
            expected = sum(ends[tp] - starts[tp] for tp in tps)
            raise KafkaUnavailable(
                f"read {read} of about {expected} records of {topic!r} from {brokers} in "
                f"{timeout_s:g} s; stopped (raise the timeout, or check the brokers)"
            )
        batches = consumer.poll(timeout_ms=min(left_ms(), int(_POLL_S * 1000)))
        for tp, records in batches.items():
            for r in records:
                if r.offset < ends[tp] or r.timestamp <= started_ms:
                    read += 1
                    yield _record(r)
        for tp in [tp for tp in todo if consumer.position(tp, timeout_ms=left_ms()) >= ends[tp]]:
            todo.discard(tp)
            consumer.pause(tp)
    consumer.resume(*tps)
    drain_until = min(deadline, time.monotonic() + _DRAIN_S)
    while time.monotonic() < drain_until:
        batches = consumer.poll(timeout_ms=min(left_ms(), int(_POLL_S * 1000)))
        older = [r for records in batches.values() for r in records if r.timestamp <= started_ms]
        if not older:
            break
        for r in older:
            yield _record(r)


def _record(r: Any) -> Record:
    """kafka-python's ``ConsumerRecord`` as the agent's :class:`Record`."""
    return Record(
        r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, list(r.headers or ())
    )


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def export_line(record: Record) -> str:
    """One record as a line of the export (JSON, ASCII, no newline)."""
    return json.dumps(
        {
            "schema": EXPORT_SCHEMA,
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp_ms": record.timestamp,
            "key": _b64(record.key),
            "headers": [[name, _b64(value)] for name, value in record.headers],
            "value": _b64(record.value),
        },
        separators=(",", ":"),
    )


def export_path(out_dir: str | Path, topic: str) -> Path:
    """The file that holds ``topic``'s export in ``out_dir``."""
    return Path(out_dir) / f"{topic}{EXPORT_SUFFIX}"


def write_export(records: Iterable[Record], out_dir: str | Path, topic: str) -> Path:
    """Write ``records`` (of ``topic``) to ``out_dir/TOPIC.export.jsonl`` atomically; its path.

    The records are written by partition, each partition's in the order given, as
    :func:`read_topic` returns them, whatever order they come in (partitions interleaved, as
    :func:`stream_topic` gives them): each partition is spooled to an unnamed temporary
    file beside the export as it comes, so no record is held in memory. ``out_dir`` is
    created if missing; an earlier export of the topic is replaced whole.
    """
    path = export_path(out_dir, topic)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        spools: dict[int, IO[bytes]] = {}
        for record in records:
            spool = spools.get(record.partition)
            if spool is None:
                spool = stack.enter_context(tempfile.TemporaryFile(dir=path.parent))
                spools[record.partition] = spool
            spool.write(export_line(record).encode("ascii") + b"\n")
        with atomic_file(path) as out:
            for partition in sorted(spools):
                spools[partition].seek(0)
                shutil.copyfileobj(spools[partition], out)
    return path


def export_files(path: str | Path) -> list[Path]:
    """The export files at ``path``: the file itself, or a directory's ``*.export.jsonl`` by
    name (other files, say the labels, may sit beside them)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"capture export {path}: no such file or directory")
    files = sorted(p for p in path.iterdir() if p.name.endswith(EXPORT_SUFFIX) and p.is_file())
    if not files:
        raise ConfigError(f"capture export {path}: no {EXPORT_SUFFIX} file in the directory")
    return files


def read_export(path: str | Path) -> list[Located]:
    """The records of an export (a directory or one of its files), in file and line order.

    A line that is not an export record stops with :class:`ConfigError` naming ``file:line``.
    """
    return [located for file in export_files(path) for located in _read_file(file)]


def _read_file(file: Path) -> Iterator[Located]:
    with file.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                record = _parse_line(raw)
            except ValueError as exc:
                raise ConfigError(f"{file}:{n}: {exc}") from None
            yield Located(f"{file}:{n} ({where(record)})", record)


def _unb64(value: object, what: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is not base64 text or null")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError(f"{what} is not valid base64") from None


def _parse_line(raw: bytes) -> Record:
    """One export line as a :class:`Record`; ``ValueError`` says what is wrong."""
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    except RecursionError:
        raise ValueError("not JSON (nested too deep)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("schema") != EXPORT_SCHEMA:
        raise ValueError(f"schema is {obj.get('schema')!r}, not {EXPORT_SCHEMA!r}")
    if set(obj) != _EXPORT_KEYS:
        missing, unknown = sorted(_EXPORT_KEYS - set(obj)), sorted(set(obj) - _EXPORT_KEYS)
        raise ValueError(f"missing keys {missing}, unknown keys {unknown}")
    if not isinstance(obj["topic"], str) or not obj["topic"]:
        raise ValueError("topic is not a name")
    for name in ("partition", "offset", "timestamp_ms"):
        if isinstance(obj[name], bool) or not isinstance(obj[name], int):
            raise ValueError(f"{name} is not an integer")
    headers = obj["headers"]
    if not isinstance(headers, list) or not all(
        isinstance(h, list) and len(h) == 2 and isinstance(h[0], str) for h in headers
    ):
        raise ValueError("headers is not a list of [name, base64 value] pairs")
    return Record(
        obj["topic"],
        obj["partition"],
        obj["offset"],
        obj["timestamp_ms"],
        _unb64(obj["key"], "key"),
        _unb64(obj["value"], "value"),
        [(name, _unb64(value, f"header {name!r}")) for name, value in headers],
    )
