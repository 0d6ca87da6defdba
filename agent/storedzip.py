"""A minimal, byte-deterministic writer of uncompressed ZIP containers.

Python's ``zipfile`` output depends on the interpreter version and on timestamps; artifacts
and their ``.npz`` members must be byte-identical for the same content, and the loader
re-creates the container to prove no byte outside the signed content was changed. So the
format (stored entries, fixed 1980-01-01 timestamps, given order) is written here, once.
"""

from __future__ import annotations

import struct
import zlib

_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01
_DOS_TIME = 0
_VERSION = 20
_MADE_BY = (3 << 8) | _VERSION  # Unix
_EXTERNAL_ATTR = (0o100644 & 0xFFFF) << 16
_MAX_U32 = 0xFFFFFFFF


def write_stored_zip(entries: list[tuple[str, bytes]]) -> bytes:
    """Return the ZIP bytes holding ``entries`` (name, data) uncompressed, in the given order."""
    if len({name for name, _ in entries}) != len(entries):
        raise ValueError("duplicate entry names")
    out = bytearray()
    central = bytearray()
    for name, data in entries:
        encoded = name.encode("ascii")
        crc = zlib.crc32(data) & _MAX_U32
        offset = len(out)
        if len(data) > _MAX_U32 or offset > _MAX_U32:
            raise ValueError("entry too large for a ZIP without ZIP64")
        out += struct.pack(
            "<IHHHHHIIIHH",
            0x04034B50,
            _VERSION,
            0,
            0,
            _DOS_TIME,
            _DOS_DATE,
            crc,
            len(data),
            len(data),
            len(encoded),
            0,
        )
        out += encoded
        out += data
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII",
            0x02014B50,
            _MADE_BY,
            _VERSION,
            0,
            0,
            _DOS_TIME,
            _DOS_DATE,
            crc,
            len(data),
            len(data),
            len(encoded),
            0,
            0,
            0,
            0,
            _EXTERNAL_ATTR,
            offset,
        )
        central += encoded
    cd_offset = len(out)
    out += central
    out += struct.pack(
        "<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), cd_offset, 0
    )
    return bytes(out)
