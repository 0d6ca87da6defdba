"""The agent's view of Kafka: one small interface, the client libraries behind it.

``kafka.library`` picks the library from :data:`boxwatch.agent.kafka.clients.LIBRARIES`:
``kafka-python`` (pure Python, the default, always installed) or ``confluent-kafka``
(librdkafka; ``pip install 'boxwatch[confluent]'``, several times faster). Each adapter
gives the agent the same things (:class:`ClientAdapter`): a consumer that returns
micro-batches of :class:`Record`-like objects, pauses and resumes all its partitions
(also those a rebalance hands out while paused), commits given offsets synchronously and
reports lag; a producer that delivers a list of outputs with acks=all and says which were
not acknowledged, and whether a retry can help; and a start-up topic check. Library errors that a retry may cure are
raised as :class:`KafkaUnavailable`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from boxwatch.agent.errors import BoxwatchError

FLUSH_SLICE_S = 0.2  # a flush waits in slices this long, so a stop request ends it
# Idle parking: after IDLE_AFTER_S without a record (once partitions are assigned), the
# consumer pauses its partitions and, at slots IDLE_FETCH_INTERVAL_S apart, asks the broker
# for their end offsets (high watermarks), resuming as soon as one is past where the consumer
# stands (the first record after a quiet spell waits up to about one slot more). A broker
# that answers an empty fetch at once instead of holding it for fetch.wait.max.ms (noida-db)
# made kafka-python fetch ~190 times a second and librdkafka ~17,500: half a core or more with
# no input. Paused partitions are never fetched, and both clients keep polling normally, so
# heartbeats and rebalances are served at once (an earlier kafka-python pacing that slept
# between short polls could keep a joining member waiting over a minute).
IDLE_AFTER_S = 1.0
IDLE_FETCH_INTERVAL_S = 0.5
IDLE_CHECK_TIMEOUT_S = 1.0  # an end-offset query while parked waits at most this long

Partition = tuple[str, int]
PartitionsCallback = Callable[[list[Partition]], None]


class IdlePacer:
    """When the stream has been quiet for :data:`IDLE_AFTER_S`, a parked consumer checks for
    news only at slots ``interval_s`` apart; any record ends the quiet spell at once.

    The first record after a quiet spell waits at most one interval more; a steady stream
    never pays anything.
    """

    def __init__(self, interval_s: float = IDLE_FETCH_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last_record = time.monotonic()
        self._next_slot = 0.0

    def idle(self, assigned: bool = True) -> bool:
        """Quiet for :data:`IDLE_AFTER_S`; never before partitions are assigned (a group
        join needs the client's normal polling)."""
        if not assigned:
            self._last_record = time.monotonic()
            return False
        return time.monotonic() - self._last_record >= IDLE_AFTER_S

    def until_slot(self) -> float:
        """Seconds until the next fetch slot (0 when it has come)."""
        return max(self._next_slot - time.monotonic(), 0.0)

    def take_slot(self) -> bool:
        """Whether the next fetch slot has come, without sleeping; if so, the one after it is
        set ``interval_s`` from now."""
        if time.monotonic() < self._next_slot:
            return False
        self._next_slot = time.monotonic() + self.interval_s
        return True

    def restart(self) -> None:
        """Start a new active spell, as if a record had just come (after a rebalance, or when
        the broker shows new records): the next quiet spell is timed from now."""
        self._last_record = time.monotonic()

    def saw(self, n_records: int) -> None:
        if n_records:
            self._last_record = time.monotonic()


class KafkaUnavailable(BoxwatchError):
    """The broker could not be reached or did not answer in time; retrying may cure it."""


class GroupMoved(KafkaUnavailable):
    """A commit the group refuses from this member because a rebalance moved on (a newer
    generation, or the member is no longer known): retrying cannot help. The partitions'
    next owner, possibly this member after it rejoins, reads the batch again from the last
    committed offset (at-least-once)."""


class Record(NamedTuple):
    """One consumed record (kafka-python's ``ConsumerRecord`` has the same fields)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]  # librdkafka gives a null header value as None


class Consumed(Protocol):
    """A consumed record as the agent reads it: a :class:`Record`, or kafka-python's
    ``ConsumerRecord`` (same fields; its header values are never None)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


class DeliveryFailure(NamedTuple):
    """An output the broker did not acknowledge: why, and whether sending it again may work.

    ``retriable`` is False when the output itself is refused (too large for the producer or
    the broker, a value the library cannot write): the same bytes will never go through.
    """

    output: Outgoing
    error: str
    retriable: bool


class Outgoing(Protocol):
    """What a producer delivers (``outputs.Output``)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


class AgentConsumer(Protocol):
    """The consumer side the agent loop needs."""

    def poll(self, max_records: int, timeout_s: float) -> list[Consumed]:
        """Up to ``max_records`` records, waiting at most ``timeout_s`` for the first."""

    def pause(self) -> None:
        """Stop fetching from every assigned partition, and from any assigned later."""

    def resume(self) -> None:
        """Fetch again from every assigned partition."""

    def keep_membership(self) -> None:
        """Serve the group protocol while paused; never consume (rewinds what it gets)."""

    def commit(self, offsets: Mapping[Partition, int], timeout_s: float) -> None:
        """Commit the next offset to read per partition, synchronously, within ``timeout_s``;
        :class:`GroupMoved` when a rebalance has taken the partitions' commit away."""

    def lag(self) -> dict[Partition, int]:
        """Records not yet consumed per assigned partition."""

    def close(self, timeout_s: float) -> None:
        """Leave the group without committing anything more."""


class AgentProducer(Protocol):
    """The producer side the agent loop needs."""

    def deliver(
        self, outputs: Sequence[Outgoing], timeout_s: float, stop: threading.Event | None = None
    ) -> list[DeliveryFailure]:
        """Send ``outputs`` (acks=all) and wait at most ``timeout_s``, or until ``stop`` is
        set; return those not acknowledged."""

    def close(self, timeout_s: float) -> None:
        """Flush what is queued (up to ``timeout_s``) and close."""


class ConsumerFactory(Protocol):
    """How an adapter opens its consumer: subscribed to ``topics``, with the rebalance
    callbacks."""

    def __call__(
        self,
        cfg: Mapping[str, Any],
        topics: list[str],
        *,
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> AgentConsumer: ...


@dataclass(frozen=True)
class ClientAdapter:
    """What one client library's adapter module gives the agent, as its ``ADAPTER``."""

    consumer: ConsumerFactory
    """Opens the agent's consumer."""
    producer: Callable[[Mapping[str, Any]], AgentProducer]
    """Opens the agent's producer (acks=all, per-partition order kept)."""
    list_topics: Callable[[Mapping[str, Any]], set[str]]
    """The topics the broker has."""
    create_topics: Callable[[Mapping[str, Any], list[str], int], None]
    """Creates the named topics with this many partitions each."""
