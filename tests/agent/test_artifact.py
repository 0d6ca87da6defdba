"""The signed artifact contract: round trip, determinism and every refusal."""

from __future__ import annotations

import io
import json
import time
import zipfile

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hostile_inputs import (
    JSON_FAMILIES,
    OVERLAP_LAYOUTS,
    best_of,
    manifest_artifact,
    overlapping_artifact,
    reference_depth,
    signature_artifact,
)

from boxwatch.agent import artifact as art
from boxwatch.agent.errors import ArtifactError
from boxwatch.agent.keys import key_id


def small_members() -> dict:
    return {
        "monitors/meta.json": {"classes": ["a", "b"], "tau": 0.1},
        "monitors/boxes.npz": {
            "lo": np.arange(6, dtype=np.float32).reshape(2, 3),
            "hi": np.arange(6, dtype=np.float32).reshape(2, 3) + 1,
        },
    }


def build(signing_key, members=None, created_at=1_700_000_000, **kw) -> bytes:
    return art.build_artifact_bytes(
        small_members() if members is None else members,
        private_key=signing_key,
        created_at=created_at,
        model={"digest": "sha256:" + "0" * 64, "files": []},
        config={"name": "test"},
        contents={"classes": ["a", "b"]},
        **kw,
    )


def rezip(entries: list[tuple[str, bytes]], compress=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compress) as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return buf.getvalue()


def entries_of(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def test_round_trip(signing_key, trusted, tmp_path):
    path = tmp_path / "a.bwa"
    art.write_artifact(path, build(signing_key))
    loaded = art.load_artifact(path, trusted)
    assert loaded.key_id == key_id(signing_key.public_key())
    assert loaded.json("monitors/meta.json") == {"classes": ["a", "b"], "tau": 0.1}
    arrays = loaded.arrays("monitors/boxes.npz")
    np.testing.assert_array_equal(arrays["hi"], small_members()["monitors/boxes.npz"]["hi"])
    assert arrays["lo"].dtype == np.float32
    assert loaded.manifest["created_at"] == "2023-11-14T22:13:20Z"
    assert loaded.created_at == 1_700_000_000
    assert loaded.manifest["config"] == {"name": "test"}
    assert loaded.contents == {"classes": ["a", "b"]}
    assert len(loaded.artifact_id) == 16
    assert not list(tmp_path.glob(".*tmp*")), "atomic write left a temp file"


def test_deterministic_bytes(signing_key):
    assert build(signing_key) == build(signing_key)
    assert build(signing_key) != build(signing_key, created_at=1_700_000_001)


def test_created_at_defaults_to_source_date_epoch(signing_key, trusted, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1234567890")
    data = build(signing_key, created_at=None)
    assert art.load_artifact(data, trusted).created_at == 1234567890
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ArtifactError, match="SOURCE_DATE_EPOCH"):
        build(signing_key, created_at=None)


def test_other_key_refused(signing_key):
    other = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(ArtifactError, match="untrusted key id"):
        art.load_artifact(build(signing_key), {key_id(other): other})


def test_several_trusted_keys(signing_key, trusted):
    other = Ed25519PrivateKey.generate().public_key()
    keys = {key_id(other): other, **trusted}
    assert art.load_artifact(build(signing_key), keys).key_id in trusted


def test_signature_forged_under_trusted_key_id(signing_key, trusted):
    """A manifest signed by another key but claiming the trusted key id is refused."""
    data = build(signing_key)
    entries = dict(entries_of(data))
    forger = Ed25519PrivateKey.generate()
    sig = json.loads(entries["manifest.sig"])
    sig["signature"] = json.loads(art._signature_bytes(forger, entries["manifest.json"]))[
        "signature"
    ]
    entries["manifest.sig"] = art.canonical_json(sig)
    blobs = {k: v for k, v in entries.items() if k not in ("manifest.json", "manifest.sig")}
    forged = art._container(entries["manifest.json"], entries["manifest.sig"], blobs)
    with pytest.raises(ArtifactError, match="signature does not verify"):
        art.load_artifact(forged, trusted)


def resigned(signing_key, mutate_manifest=None, blobs_override=None) -> bytes:
    """Re-sign a (mutated) manifest with the trusted key: isolates the checks after the signature."""
    entries = dict(entries_of(build(signing_key)))
    manifest = json.loads(entries.pop("manifest.json"))
    entries.pop("manifest.sig")
    if mutate_manifest:
        mutate_manifest(manifest)
    mbytes = art.canonical_json(manifest)
    blobs = entries if blobs_override is None else blobs_override(entries)
    return art._container(mbytes, art._signature_bytes(signing_key, mbytes), blobs)


def test_unknown_schema_major_refused(signing_key, trusted):
    data = resigned(signing_key, lambda m: m.update(schema_version="2.0"))
    with pytest.raises(ArtifactError, match="schema version '2.0' is not supported"):
        art.load_artifact(data, trusted)
    data = resigned(signing_key, lambda m: m.update(schema="other.thing"))
    with pytest.raises(ArtifactError, match="not a boxwatch.artifact manifest"):
        art.load_artifact(data, trusted)


def test_missing_member_refused(signing_key, trusted):
    data = resigned(
        signing_key, blobs_override=lambda e: {k: v for k, v in e.items() if k.endswith(".npz")}
    )
    with pytest.raises(ArtifactError, match="missing: \\['monitors/meta.json'\\]"):
        art.load_artifact(data, trusted)


def test_extra_member_refused(signing_key, trusted):
    data = resigned(signing_key, blobs_override=lambda e: {**e, "extra.json": b"{}"})
    with pytest.raises(ArtifactError, match="not listed in the manifest: \\['extra.json'\\]"):
        art.load_artifact(data, trusted)


def test_swapped_members_refused(signing_key, trusted):
    members = {"a.json": [1], "b.json": [2]}
    entries = dict(entries_of(build(signing_key, members)))
    blobs = {"a.json": entries["b.json"], "b.json": entries["a.json"]}
    data = art._container(entries["manifest.json"], entries["manifest.sig"], blobs)
    with pytest.raises(ArtifactError, match="does not match its digest"):
        art.load_artifact(data, trusted)


def test_changed_member_with_valid_zip_refused(signing_key, trusted):
    entries = dict(entries_of(build(signing_key)))
    blobs = {k: v for k, v in entries.items() if not k.startswith("manifest.")}
    blobs["monitors/meta.json"] = blobs["monitors/meta.json"].replace(b"0.1", b"0.9")
    data = art._container(entries["manifest.json"], entries["manifest.sig"], blobs)
    with pytest.raises(ArtifactError, match="monitors/meta.json does not match its digest"):
        art.load_artifact(data, trusted)


@pytest.mark.parametrize(
    "bad_name", ["../evil.json", "/abs.json", "a/../../b.json", "a\\b.json", "run.sh", "x.pkl"]
)
def test_unsafe_member_names_refused_before_reading(signing_key, trusted, bad_name):
    entries = entries_of(build(signing_key)) + [(bad_name, b"{}")]
    with pytest.raises(ArtifactError, match="is not allowed|is not a .json or .npz member"):
        art.load_artifact(rezip(entries), trusted)


def test_compressed_member_refused(signing_key, trusted):
    data = rezip(entries_of(build(signing_key)), compress=zipfile.ZIP_DEFLATED)
    with pytest.raises(ArtifactError, match="compressed"):
        art.load_artifact(data, trusted)


def test_size_caps_checked_from_index(signing_key, trusted, monkeypatch):
    monkeypatch.setattr(art, "MAX_MEMBER_BYTES", 16)
    with pytest.raises(ArtifactError, match="declares .* bytes \\(cap 16\\)"):
        art.load_artifact(build(signing_key), trusted)


def test_total_size_cap(signing_key, trusted, monkeypatch, tmp_path):
    data = build(signing_key)
    path = tmp_path / "big.bwa"
    path.write_bytes(data)
    monkeypatch.setattr(art, "MAX_ARTIFACT_BYTES", len(data) - 1)
    with pytest.raises(ArtifactError, match="exceeds the .* cap"):
        art.load_artifact(path, trusted)


def test_duplicate_member_refused(signing_key, trusted):
    entries = entries_of(build(signing_key))
    buf = io.BytesIO()
    with pytest.warns(UserWarning), zipfile.ZipFile(buf, "w") as zf:
        for name, blob in [*entries, entries[-1]]:
            zf.writestr(name, blob)
    with pytest.raises(ArtifactError, match="appears twice"):
        art.load_artifact(buf.getvalue(), trusted)


def test_non_canonical_container_refused(signing_key, trusted):
    """Same signed content, other container bytes (Python's zipfile timestamps): refused."""
    data = rezip(entries_of(build(signing_key)))
    assert data != build(signing_key)
    with pytest.raises(ArtifactError, match="container bytes differ"):
        art.load_artifact(data, trusted)


@pytest.mark.parametrize("blob", [b"", b"not a zip", b"PK\x03\x04" + b"\0" * 40])
def test_garbage_refused(trusted, blob):
    with pytest.raises(ArtifactError, match="not an artifact"):
        art.load_artifact(blob, trusted)


def test_missing_file(trusted, tmp_path):
    with pytest.raises(ArtifactError, match="no such file"):
        art.load_artifact(tmp_path / "nope.bwa", trusted)


def test_truncations_refused(signing_key, trusted):
    data = build(signing_key)
    for cut in range(0, len(data), 7):
        with pytest.raises(ArtifactError):
            art.load_artifact(data[:cut], trusted)


def test_every_byte_flip_refused(signing_key, trusted):
    data = build(signing_key, {"m.json": {"k": 1}})
    art.load_artifact(data, trusted)
    accepted = []
    for pos in range(len(data)):
        for mask in (0x01, 0x80):
            flipped = bytearray(data)
            flipped[pos] ^= mask
            try:
                art.load_artifact(bytes(flipped), trusted)
            except ArtifactError:
                continue
            accepted.append((pos, mask))
    assert accepted == [], f"{len(accepted)} flips accepted, first at {accepted[:5]}"


def test_npz_member_rejects_object_arrays(signing_key):
    with pytest.raises(TypeError, match="only numeric arrays"):
        build(signing_key, {"x.npz": {"a": np.array([object()], dtype=object)}})


def test_reserved_and_bad_member_names_refused_when_writing(signing_key):
    with pytest.raises(ArtifactError, match="reserved"):
        build(signing_key, {"manifest.json": {}})
    with pytest.raises(ArtifactError, match="not allowed"):
        build(signing_key, {"../x.json": {}})


def test_digest_files(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"graph")
    (tmp_path / "model.onnx.data").write_bytes(b"weights")
    both = art.digest_files([tmp_path / "model.onnx.data", tmp_path / "model.onnx"])
    assert both == art.digest_files([tmp_path / "model.onnx", tmp_path / "model.onnx.data"])
    assert [f["name"] for f in both["files"]] == ["model.onnx", "model.onnx.data"]
    (tmp_path / "model.onnx.data").write_bytes(b"weightz")
    changed = art.digest_files([tmp_path / "model.onnx", tmp_path / "model.onnx.data"])
    assert changed["digest"] != both["digest"]


# -- readers of bytes not yet trusted (issue 37) -------------------------------------------------
VALID_JSON = [
    b'{"a": ["x\\\\", "]\\"[", {"b": [[1], {}]}], "c": "{\\u0022"}',
    b'["\\\\\\"]", [[["\\\\"]]], "\\\\\\\\"]',
    art.canonical_json({"k": ["\\" * 5 + '"[{' * 3, [[{"x": "]]]"}]]]}),
]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_json_depth_equals_a_per_byte_reference(monkeypatch, chunk):
    """Strings (escaped quotes, backslash runs, brackets inside) are skipped exactly, also
    when an escape or a backslash run straddles two chunks of the scan."""
    monkeypatch.setattr(art, "_SCAN_CHUNK", chunk)
    texts = [*VALID_JSON, *(make(n) for make in JSON_FAMILIES.values() for n in (1, 9, 300))]
    for text in texts:
        assert art.json_depth(text) == reference_depth(text), text[:60]
    for text in VALID_JSON:
        assert art.json_depth(text) == _depth(json.loads(text))


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@pytest.mark.parametrize("family", sorted(JSON_FAMILIES))
def test_json_depth_is_linear(family):
    """2 MB of each hostile family in well under a second (a rescan at every quote took
    minutes for 200 KB), with the depth a parser finds. The growth ratio is measured by
    bench/hostile.py, not here: small timings on a shared machine are noise."""
    large = JSON_FAMILIES[family](2 << 20)
    t_large = best_of(3, lambda: art.json_depth(large))
    assert t_large < 1.0, (family, t_large)
    small = JSON_FAMILIES[family](4 << 10)
    try:
        expected = _depth(json.loads(small))
    except (ValueError, RecursionError):  # not JSON, or deeper than the parser goes
        return
    assert art.json_depth(small) == expected


def test_signature_larger_than_its_cap_refused_from_the_index():
    """The builder's signature is 154 bytes; a larger one is refused before it is read."""
    assert art.MAX_SIGNATURE_BYTES <= 200
    text = JSON_FAMILIES["escaped_quotes"](art.MAX_SIGNATURE_BYTES + 1)
    with pytest.raises(ArtifactError, match=r"manifest.sig declares \d+ bytes \(cap 200\)"):
        art.load_artifact(signature_artifact(text), None)


@pytest.mark.parametrize("family", sorted(JSON_FAMILIES))
def test_hostile_signature_text_refused_fast(family):
    data = signature_artifact(JSON_FAMILIES[family](art.MAX_SIGNATURE_BYTES))
    t0 = time.perf_counter()
    with pytest.raises(ArtifactError, match="manifest.sig|not an ed25519 signature"):
        art.load_artifact(data, None)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("family", sorted(JSON_FAMILIES))
def test_hostile_manifest_text_refused_fast_without_a_key(family):
    """What ``inspect`` without a key reads: 1 MB of each family, refused in well under 1 s."""
    data = manifest_artifact(JSON_FAMILIES[family](1 << 20))
    t0 = time.perf_counter()
    with pytest.raises(ArtifactError, match="manifest.json|not a boxwatch.artifact manifest"):
        art.load_artifact(data, None)
    assert time.perf_counter() - t0 < 1.0


def test_manifest_cap_refused_from_the_index_and_kept_by_the_builder(signing_key):
    data = manifest_artifact(b" " * (art.MAX_MANIFEST_BYTES + 1))
    with pytest.raises(ArtifactError, match=r"manifest.json declares \d+ bytes \(cap"):
        art.load_artifact(data, None)
    with pytest.raises(ArtifactError, match="manifest of .* bytes exceeds"):
        art.build_artifact_bytes(
            {}, private_key=signing_key, created_at=1, contents={"x": "y" * art.MAX_MANIFEST_BYTES}
        )


@pytest.mark.parametrize("layout", OVERLAP_LAYOUTS)
def test_overlapping_members_refused_from_the_index(layout, monkeypatch):
    """Members whose data overlap (each other or the central directory): refused before
    any member is read."""
    data = overlapping_artifact(64 << 10, 12, layout)

    def no_read(*_args):
        raise AssertionError("a member was read")

    monkeypatch.setattr(art, "_read_member", no_read)
    with pytest.raises(ArtifactError, match="overlap"):
        art.load_artifact(data, None)


def test_npz_with_overlapping_arrays_refused():
    from boxwatch.agent.arrays import loads_npz

    with pytest.raises(ArtifactError, match="overlap"):
        loads_npz(overlapping_artifact(4096, 4, "chained"))
