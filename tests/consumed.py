"""A consumed Kafka record as the agent reads it, for tests that call the agent's processing
and delivery without a broker."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Record:
    """The fields of a consumed Kafka record the agent reads."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    headers: list = field(default_factory=list)
    key: bytes | None = None
    timestamp: int = 0
