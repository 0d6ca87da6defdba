"""A human and machine summary of an artifact, for ``boxwatch inspect``.

Without ``--public-key`` the manifest is unsigned input: nothing here assumes its shape
(a section of the wrong type shows as empty), and the text view escapes every control
character of its strings, so a crafted manifest cannot drive the terminal.
"""

from __future__ import annotations

import re
from typing import Any

from boxwatch.agent.artifact import Artifact


def describe(artifact: Artifact, *, signature_checked: bool) -> dict[str, Any]:
    """Everything a reviewer asks of an artifact, as one JSON-able dict."""
    m = artifact.manifest
    model = m.get("model")
    members = _dict(m.get("members"))
    return {
        "artifact_id": artifact.artifact_id,
        "schema_version": m.get("schema_version"),
        "builder": _dict(m.get("builder")),
        "created_at": m.get("created_at"),
        "key_id": artifact.key_id,
        "signature": "verified" if signature_checked else "not checked (no --public-key)",
        "model": model if isinstance(model, dict) or model is None else {},
        "contents": _dict(m.get("contents")),
        "members": {
            name: _dict(e).get("size") for name, e in sorted(members.items(), key=lambda x: x[0])
        },
    }


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# C0 controls, DEL and C1 controls (0x9b is a one-byte CSI on some terminals).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as ``\\xNN`` (a backslash stays as is)."""
    return _CONTROL.sub(lambda mt: f"\\x{ord(mt.group()):02x}", text)


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items()) if value else "-"
    return "-" if value is None else str(value)


# The verdict split's columns and their widths, as ``inspect`` prints them.
SPLIT_COLUMNS = (("n", 7), ("accept", 6), ("uncertainty", 11), ("reject", 6))


def _split_rows(key: str, split: dict[str, Any]) -> list[tuple[str, str]]:
    """``verdict_split`` as a table: one row per build set, its size and verdict shares."""

    def cell(v: Any, column: str) -> str:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return "-" if v is None else str(v)
        return f"{v:,}" if column == "n" else f"{v:.3f}"

    rows = [
        (key, "share of each verdict the build measured, by set"),
        ("  set", "  ".join(c.rjust(w) for c, w in SPLIT_COLUMNS)),
    ]
    for name, shares in split.items():
        row = _dict(shares)
        cells = "  ".join(cell(row.get(c), c).rjust(w) for c, w in SPLIT_COLUMNS)
        rows.append((f"  {name}", cells))
    return rows


def render_description(info: dict[str, Any]) -> str:
    """Aligned text view of :func:`describe`'s dict, control characters escaped."""
    builder = _dict(info.get("builder"))
    rows: list[tuple[str, str]] = [
        ("artifact id", _fmt(info["artifact_id"])),
        ("schema", _fmt(info.get("schema_version"))),
        ("builder", f"{_fmt(builder.get('name', '?'))} {_fmt(builder.get('version', '?'))}"),
        ("created", _fmt(info.get("created_at"))),
        ("key id", _fmt(info.get("key_id"))),
        ("signature", _fmt(info.get("signature"))),
    ]
    model = _dict(info.get("model"))
    rows.append(("model digest", _fmt(model.get("digest"))))
    files = model.get("files")
    for f in files if isinstance(files, list) else []:
        f = _dict(f)
        rows.append(
            (
                "  model file",
                f"{_fmt(f.get('name'))} ({_fmt(f.get('size'))} bytes, sha256 "
                f"{_fmt(f.get('sha256'))[:16]}…)",
            )
        )
    for key, value in _dict(info.get("contents")).items():
        if key == "verdict_split" and isinstance(value, dict) and value:
            rows.extend(_split_rows(key, value))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            rows.append((key, f"{len(value)}"))
            rows.extend((f"  {key[:-1] if key.endswith('s') else key}", _fmt(v)) for v in value)
        else:
            rows.append((key, _fmt(value)))
    members = _dict(info.get("members"))
    rows.append(("members", str(len(members))))
    rows.extend((f"  {name}", f"{_fmt(size)} bytes") for name, size in members.items())
    rows = [(escape_controls(str(k)), escape_controls(v)) for k, v in rows]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
