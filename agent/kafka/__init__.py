"""Kafka behind one small interface: record and output types, and the configured client.

``kafka.library`` picks a client library from :data:`.clients.LIBRARIES` (``kafka-python``:
:mod:`.kafka_python`, ``confluent-kafka``: :mod:`.confluent`); each adapter implements
:mod:`.base`'s protocols, and :mod:`.clients` imports and opens the configured one only.
:mod:`.headers` holds the header rules they share.
"""

from boxwatch.agent.kafka.base import (
    AgentConsumer,
    AgentProducer,
    Consumed,
    DeliveryFailure,
    GroupMoved,
    KafkaUnavailable,
    Partition,
    Record,
)
from boxwatch.agent.kafka.clients import (
    LIBRARIES,
    ensure_topics,
    library,
    make_consumer,
    make_producer,
    wait_for_broker,
)

__all__ = [
    "LIBRARIES",
    "AgentConsumer",
    "AgentProducer",
    "Consumed",
    "DeliveryFailure",
    "GroupMoved",
    "KafkaUnavailable",
    "Partition",
    "Record",
    "ensure_topics",
    "library",
    "make_consumer",
    "make_producer",
    "wait_for_broker",
]
