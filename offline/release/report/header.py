"""The report's header: what was built (metadata, artifact) and the policy's verdict."""

from __future__ import annotations

from boxwatch.offline.release.records import BuildSummary
from boxwatch.offline.release.report.markup import esc, given, num, text


def header(summary: BuildSummary) -> str:
    """Name, versions, artifact id, key, file and digest; PASS or FAIL with the reasons."""
    meta, art, policy = summary.metadata, summary.artifact, summary.policy
    status, cls = ("FAIL", "fail") if policy.failed else ("PASS", "pass")
    items = [
        ("Model version", text("meta-model-version", meta.model_version)),
        ("Artifact id", text("artifact-id", art.artifact_id)),
        ("Signing key id", text("artifact-key-id", art.key_id)),
        ("Created", text("meta-created-at", meta.created_at)),
        ("Builder version", text("meta-builder-version", meta.builder_version)),
        ("Artifact file", f"<code>{text('artifact-path', given(art.path))}</code>"),
        ("Artifact SHA-256", f"<code>{text('artifact-sha256', art.sha256)}</code>"),
        ("Artifact size (bytes)", num("artifact-bytes", art.bytes)),
    ]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items)
    fail_on = ", ".join(map(str, policy.fail_on)) or "nothing"
    note = f"<p>Policy fails on: {esc(fail_on)}.</p>"
    if policy.failed:
        note += (
            '<ul id="policy-reasons">'
            + "".join(
                f'<li id="policy-reason-{i}">{esc(r)}</li>' for i, r in enumerate(policy.failed)
            )
            + "</ul>"
        )
    return (
        f'<header><h1 id="meta-name">{esc(meta.name)}</h1>'
        f"<p>Build report of <code>boxwatch build-artifact</code> \u2014 policy "
        f'<span id="policy-status" class="status {cls}">{status}</span></p>{note}'
        f'<dl class="meta">{dl}</dl></header>'
    )
