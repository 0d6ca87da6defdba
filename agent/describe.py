"""A human and machine summary of a verified artifact, for ``boxwatch inspect``."""

from __future__ import annotations

from typing import Any

from boxwatch.agent.artifact import Artifact


def describe(artifact: Artifact, *, signature_checked: bool) -> dict[str, Any]:
    """Everything a reviewer asks of an artifact, as one JSON-able dict."""
    m = artifact.manifest
    return {
        "artifact_id": artifact.artifact_id,
        "schema_version": m["schema_version"],
        "builder": m.get("builder", {}),
        "created_at": m.get("created_at"),
        "key_id": artifact.key_id,
        "signature": "verified" if signature_checked else "not checked (no --public-key)",
        "model": m.get("model"),
        "contents": m.get("contents", {}),
        "members": {name: e["size"] for name, e in sorted(m["members"].items())},
    }


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items()) if value else "-"
    return "-" if value is None else str(value)


def render_description(info: dict[str, Any]) -> str:
    """Aligned text view of :func:`describe`'s dict."""
    rows: list[tuple[str, str]] = [
        ("artifact id", info["artifact_id"]),
        ("schema", info["schema_version"]),
        ("builder", f"{info['builder'].get('name', '?')} {info['builder'].get('version', '?')}"),
        ("created", _fmt(info["created_at"])),
        ("key id", info["key_id"]),
        ("signature", info["signature"]),
    ]
    model = info.get("model") or {}
    rows.append(("model digest", _fmt(model.get("digest"))))
    for f in model.get("files", []):
        rows.append(
            ("  model file", f"{f['name']} ({f['size']} bytes, sha256 {f['sha256'][:16]}…)")
        )
    for key, value in info["contents"].items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows.append((key, f"{len(value)}"))
            rows.extend((f"  {key[:-1] if key.endswith('s') else key}", _fmt(v)) for v in value)
        else:
            rows.append((key, _fmt(value)))
    rows.append(("members", str(len(info["members"]))))
    rows.extend((f"  {name}", f"{size} bytes") for name, size in info["members"].items())
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
