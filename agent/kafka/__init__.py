"""Kafka behind one small interface: record and output types, and the configured client.

``kafka.library`` picks ``kafka-python`` (:mod:`.kafka_python`) or ``confluent-kafka``
(:mod:`.confluent`); both adapters implement :mod:`.base`'s protocols, and
:mod:`.clients` opens the configured one. :mod:`.headers` holds the header rules both share.
"""

from boxwatch.agent.kafka.base import (
    LIBRARIES,
    AgentConsumer,
    AgentProducer,
    Consumed,
    DeliveryFailure,
    KafkaUnavailable,
    Partition,
    Record,
)
from boxwatch.agent.kafka.clients import (
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
    "KafkaUnavailable",
    "Partition",
    "Record",
    "ensure_topics",
    "library",
    "make_consumer",
    "make_producer",
    "wait_for_broker",
]
