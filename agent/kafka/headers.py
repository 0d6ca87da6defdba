"""Kafka record headers as the agent meets them: which are readable, which are carried on.

Kafka allows what neither client library handles well: header names that are not UTF-8
(kafka-python cannot parse them, librdkafka's Python binding raises half-way) and null header
values (kafka-python refuses to produce them). The clients hand such names over as
:class:`UndecodableName`, or as :data:`UNREADABLE` when the library could not read the
headers at all; :func:`header_problem` names the problem so the
record becomes a dead letter (``bad_header``), and :func:`carried_headers` keeps only the
headers that every producer can write (a null value is dropped, never sent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class UndecodableName(str):
    """A header name whose bytes are not UTF-8: the text shows them as lone surrogates,
    ``encode`` gives the bytes back (kafka-python measures header sizes that way)."""

    raw: bytes

    def __new__(cls, raw: bytes) -> UndecodableName:
        obj = super().__new__(cls, raw.decode("utf-8", "surrogateescape"))
        obj.raw = raw
        return obj

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


# Stands for headers a client library could not read; a lone surrogate never comes from
# valid UTF-8, so no real header has this name.
UNREADABLE_NAME = "\udcff(unreadable headers)"
UNREADABLE: list[tuple[str, bytes | None]] = [(UNREADABLE_NAME, None)]


def _writable_name(name: Any) -> bool:
    if type(name) is not str:
        return False
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def header_problem(headers: Sequence[tuple[Any, Any]] | None) -> str | None:
    """Why ``headers`` make the record unprocessable, or None when they are fine."""
    for name, value in headers or ():
        if name.__class__ is str and name.isascii() and value.__class__ is bytes:
            continue
        if name == UNREADABLE_NAME:
            return "the client library could not read this record's headers (a name is not UTF-8)"
        if isinstance(name, UndecodableName):
            return f"header name {name.raw[:100]!r} is not UTF-8"
        if not _writable_name(name):
            return f"header name {name!r} is not a UTF-8 string"
        if value is not None and not isinstance(value, bytes | bytearray):
            return f"header {name!r} has a value of type {type(value).__name__}"
    return None


def carried_headers(headers: Sequence[tuple[Any, Any]] | None) -> list[tuple[str, bytes]]:
    """The headers an output may carry: UTF-8 names with byte values (null values dropped)."""
    return [
        (name, bytes(value))
        for name, value in headers or ()
        if value is not None and isinstance(value, bytes | bytearray) and _writable_name(name)
    ]
