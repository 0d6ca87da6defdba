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
        # the fields the local and the central header share, in their order
        shared = (_VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, len(data), len(data), len(encoded), 0)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, *shared)
        out += encoded
        out += data
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, _MADE_BY, *shared, 0, 0, 0, _EXTERNAL_ATTR, offset
        )
        central += encoded
    cd_offset = len(out)
    out += central
    out += struct.pack(
        "<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), cd_offset, 0
    )
    return bytes(out)


_EOCD = struct.Struct("<IHHHHIIH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_ZIP64_LOCATOR_SIG = b"PK\x06\x07"


def check_zip_index(data: bytes, *, max_entries: int, max_name: int = 512) -> str | None:
    """Why ``data``'s ZIP index is refused, or ``None``: read before ``zipfile`` parses it.

    ``zipfile`` reads and parses the whole central directory before anyone can count its
    entries, so a small file can declare millions of them. Here the end-of-central-directory
    record must be the last 22 bytes (no comment, no ZIP64), the directory it points to must
    end right before it, fit ``max_entries`` records of names up to ``max_name`` bytes, and
    hold exactly the entries it declares -- all checked by walking at most that many records.
    Every entry's local header and data must lie before the directory and overlap no other
    entry's: a few MB whose entries all span the same bytes would otherwise be read (and
    hashed, and kept) once per entry.
    """
    if len(data) < _EOCD.size:
        return "too short for a ZIP end-of-central-directory record"
    sig, disk, cd_disk, n_disk, n_total, cd_size, cd_offset, comment = _EOCD.unpack_from(
        data, len(data) - _EOCD.size
    )
    if sig != 0x06054B50 or comment != 0:
        return "no end-of-central-directory record at the end"
    if disk or cd_disk or n_disk != n_total:
        return "multi-disk ZIP"
    if n_total > max_entries:
        return f"central directory declares {n_total} entries (cap {max_entries})"
    cap = max_entries * (_CENTRAL.size + max_name)
    if cd_size > cap:
        return f"central directory declares {cd_size} bytes (cap {cap})"
    end = len(data) - _EOCD.size
    if cd_offset + cd_size != end:
        return "central directory does not end at the end-of-central-directory record"
    if cd_size >= 20 and data[end - 20 : end - 16] == _ZIP64_LOCATOR_SIG:
        return "ZIP64 container"
    pos, count = cd_offset, 0
    spans: list[tuple[int, int]] = []
    while pos < end:
        if count >= n_total or end - pos < _CENTRAL.size:
            return "central directory holds more than it declares"
        fields = _CENTRAL.unpack_from(data, pos)
        if fields[0] != 0x02014B50:
            return "corrupt central directory record"
        name_len, extra_len, comment_len = fields[10], fields[11], fields[12]
        if name_len > max_name:
            return f"central directory name of {name_len} bytes (cap {max_name})"
        span = _entry_span(data, fields[16], fields[8], cd_offset)
        if isinstance(span, str):
            return span
        spans.append(span)
        pos += _CENTRAL.size + name_len + extra_len + comment_len
        count += 1
    if pos != end or count != n_total:
        return "central directory holds other than it declares"
    spans.sort()
    for (_, first_end), (second, _) in zip(spans, spans[1:], strict=False):
        if second < first_end:
            return "entries overlap (two entries' data share bytes)"
    return None


def _entry_span(data: bytes, offset: int, size: int, cd_offset: int) -> tuple[int, int] | str:
    """The bytes ``[start, end)`` one entry occupies (local header, name, extra, data), or
    why it is refused: outside the part of the file before the central directory."""
    if offset + _LOCAL.size > cd_offset:
        return "an entry's local header overlaps the central directory"
    fields = _LOCAL.unpack_from(data, offset)
    if fields[0] != 0x04034B50:
        return "corrupt local header"
    stop = offset + _LOCAL.size + fields[9] + fields[10] + size
    if stop > cd_offset:
        return "entries overlap the central directory"
    return offset, stop
