"""The signed artifact: the one file the offline builder writes and the online agent trusts.

Container: an uncompressed ZIP written byte-deterministically (:mod:`storedzip`) holding

* ``manifest.json`` -- canonical JSON: schema and builder version, creation time, key id,
  the monitored model's digest, the build config, a summary of the contents, and the
  sha256 and size of every other member;
* ``manifest.sig`` -- JSON with the Ed25519 signature over the exact manifest bytes;
* members in non-executable formats only: ``*.json`` and ``*.npz`` (read without pickle).

Loading refuses, with a one-line reason, in this order: container index (names, sizes,
compression) before any member is read; signature against the trusted key(s) by key id;
schema major version; missing or extra members; member sizes and digests; and finally any
byte outside the signed content (the container must equal its canonical re-serialisation).
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import hashlib
import io
import json
import os
import re
import stat
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from boxwatch import __version__
from boxwatch.agent.arrays import dumps_npz, loads_npz
from boxwatch.agent.atomic import write_atomic
from boxwatch.agent.errors import ArtifactError, MissingArtifactError
from boxwatch.agent.keys import key_id
from boxwatch.agent.storedzip import check_zip_index, write_stored_zip

SCHEMA = "boxwatch.artifact"
SCHEMA_VERSION = "1.0"
SUPPORTED_MAJOR = 1
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
SIGNATURE_ALGORITHM = "ed25519"

MAX_ARTIFACT_BYTES = 1 << 30
MAX_MEMBER_BYTES = 512 << 20
# The manifest: a few KB as built (the build config's values, a summary of the contents, one
# line per member); the builder refuses to write a larger one. The signature: 154 bytes as
# built (algorithm, key id, base64 of 64 bytes). Both are read before the signature is
# checked, so their caps are fitted to what they hold.
MAX_MANIFEST_BYTES = 4 << 20
MAX_SIGNATURE_BYTES = 200
MAX_MEMBERS = 1024
# Every JSON read from an artifact (before or after the signature check): nesting depth and
# size. The builder's deepest member nests well under 20 levels.
MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = MAX_MEMBER_BYTES
MEMBER_SUFFIXES = (".json", ".npz")
# What zipfile raises on corrupt input (e.g. NotImplementedError for a flipped version field).
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    ValueError,
    OSError,
    EOFError,
    NotImplementedError,
    RuntimeError,
    KeyError,
    UnicodeDecodeError,
)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99}){0,3}$")


def canonical_json(obj: Any) -> bytes:
    """The one byte form of a JSON value: sorted keys, no spaces, ASCII, no NaN."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def resolve_created_at(created_at: int | None = None) -> int:
    """Creation time in Unix seconds: the caller's, else ``SOURCE_DATE_EPOCH``, else now."""
    if created_at is not None:
        return int(created_at)
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env is not None:
        try:
            return int(env)
        except ValueError:
            raise ArtifactError(f"SOURCE_DATE_EPOCH={env!r} is not an integer") from None
    return int(time.time())


def digest_files(paths: Sequence[str | Path | tuple[str, str | Path]]) -> dict[str, Any]:
    """Digest of a model and its external weight files, order-independent.

    Each entry is a path (recorded by its base name) or a ``(name, path)`` pair: the name
    recorded (the model's real file name, an external-data location relative to the model's
    folder) and the file hashed.
    """
    files: list[dict[str, Any]] = []
    for entry in paths:
        name, path = entry if isinstance(entry, tuple) else (Path(entry).name, entry)
        path = Path(path)
        h = hashlib.sha256()
        size = 0
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
        files.append({"name": str(name), "sha256": h.hexdigest(), "size": size})
    files.sort(key=lambda f: str(f["name"]))
    combined = sha256_hex(canonical_json([[f["name"], f["sha256"], f["size"]] for f in files]))
    return {"digest": f"sha256:{combined}", "files": files}


def check_member_name(name: str) -> None:
    """Refuse names that could escape a directory, or that are not JSON/npz members."""
    if not _NAME_RE.match(name) or ".." in name.split("/"):
        raise ArtifactError(f"member name {name!r} is not allowed")
    if name not in (MANIFEST, SIGNATURE) and not name.endswith(MEMBER_SUFFIXES):
        raise ArtifactError(f"member {name!r} is not a .json or .npz member")


@dataclass(frozen=True)
class Artifact:
    """A verified artifact: manifest, raw member bytes and who signed it."""

    manifest: dict[str, Any]
    members: Mapping[str, bytes]
    key_id: str
    manifest_bytes: bytes = field(repr=False)
    path: str | None = None

    @functools.cached_property
    def artifact_id(self) -> str:
        """Stable id: the first 16 hex digits of sha256(manifest bytes)."""
        return sha256_hex(self.manifest_bytes)[:16]

    @property
    def created_at(self) -> int:
        return int(self.manifest["created_at_epoch"])

    @property
    def contents(self) -> dict[str, Any]:
        return self.manifest.get("contents", {})

    def json(self, name: str) -> Any:
        return _parse_json(self._member(name), name)

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        return loads_npz(self._member(name), where=f"artifact member {name}")

    def _member(self, name: str) -> bytes:
        try:
            return self.members[name]
        except KeyError:
            raise ArtifactError(f"artifact has no member {name!r}") from None


def build_artifact_bytes(
    members: Mapping[str, bytes | dict | list],
    *,
    private_key: Ed25519PrivateKey,
    created_at: int | None = None,
    model: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    contents: dict[str, Any] | None = None,
) -> bytes:
    """Return signed artifact bytes; JSON-able values are stored as canonical JSON members."""
    blobs: dict[str, bytes] = {}
    for name, value in members.items():
        check_member_name(name)
        if name in (MANIFEST, SIGNATURE):
            raise ArtifactError(f"member name {name!r} is reserved")
        if isinstance(value, bytes):
            blobs[name] = value
        elif name.endswith(".json"):
            blobs[name] = canonical_json(value)
        elif name.endswith(".npz") and isinstance(value, dict):
            blobs[name] = dumps_npz(value)
        else:
            raise ArtifactError(f"member {name!r}: cannot store a {type(value).__name__}")
    epoch = resolve_created_at(created_at)
    manifest = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "builder": {"name": "boxwatch", "version": __version__},
        "created_at": _dt.datetime.fromtimestamp(epoch, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "created_at_epoch": epoch,
        "key_id": key_id(private_key.public_key()),
        "model": model,
        "config": config or {},
        "contents": contents or {},
        "members": {n: {"sha256": sha256_hex(b), "size": len(b)} for n, b in sorted(blobs.items())},
    }
    manifest_bytes = canonical_json(manifest)
    if len(manifest_bytes) > MAX_MANIFEST_BYTES:
        raise ArtifactError(
            f"a manifest of {len(manifest_bytes)} bytes exceeds the {MAX_MANIFEST_BYTES}-byte "
            "cap agents read (the build config or the contents summary is too large)"
        )
    return _container(manifest_bytes, _signature_bytes(private_key, manifest_bytes), blobs)


def write_artifact(path: str | Path, data: bytes) -> None:
    """Write artifact bytes atomically (:func:`~boxwatch.agent.atomic.write_atomic`)."""
    path = Path(path)
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise ArtifactError(f"cannot write artifact {path}: {exc.strerror or exc}") from None


def _signature_bytes(private_key: Ed25519PrivateKey, manifest_bytes: bytes) -> bytes:
    return canonical_json(
        {
            "algorithm": SIGNATURE_ALGORITHM,
            "key_id": key_id(private_key.public_key()),
            "signature": base64.b64encode(private_key.sign(manifest_bytes)).decode("ascii"),
        }
    )


def _container(manifest_bytes: bytes, sig_bytes: bytes, blobs: Mapping[str, bytes]) -> bytes:
    entries = [(MANIFEST, manifest_bytes), (SIGNATURE, sig_bytes)]
    entries += sorted(blobs.items())
    return write_stored_zip(entries)


def load_artifact(
    source: str | Path | bytes,
    trusted_keys: Mapping[str, Ed25519PublicKey] | None,
) -> Artifact:
    """Load and verify an artifact; raise :class:`ArtifactError` with a one-line reason.

    ``trusted_keys`` maps key id -> public key. ``None`` skips the signature check
    (only for ``inspect`` without a key; never for monitoring).
    """
    where = "artifact" if isinstance(source, bytes) else str(source)
    data = _read_source(source, where)
    problem = check_zip_index(data, max_entries=MAX_MEMBERS)
    if problem is not None:
        raise ArtifactError(f"{where}: not an artifact ({problem})")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except _ZIP_ERRORS:
        raise ArtifactError(f"{where}: not an artifact (unreadable ZIP container)") from None
    with zf:
        infos = _check_index(zf, where)
        manifest_bytes = _read_member(zf, infos[MANIFEST], where)
        sig_bytes = _read_member(zf, infos[SIGNATURE], where)
        signer = _check_signature(manifest_bytes, sig_bytes, trusted_keys, where)
        manifest = _parse_json(manifest_bytes, f"{where}: {MANIFEST}")
        _check_manifest(manifest, where)
        if signer is not None and manifest.get("key_id") != signer:
            raise ArtifactError(f"{where}: manifest key id does not match the signature's")
        listed = manifest["members"]
        present = set(infos) - {MANIFEST, SIGNATURE}
        missing, extra = sorted(set(listed) - present), sorted(present - set(listed))
        if missing:
            raise ArtifactError(f"{where}: members listed in the manifest are missing: {missing}")
        if extra:
            raise ArtifactError(f"{where}: members not listed in the manifest: {extra}")
        members: dict[str, bytes] = {}
        for name in sorted(listed):
            entry = listed[name]
            if infos[name].file_size != entry.get("size"):
                raise ArtifactError(f"{where}: member {name} has the wrong size")
            blob = _read_member(zf, infos[name], where)
            if sha256_hex(blob) != entry.get("sha256"):
                raise ArtifactError(f"{where}: member {name} does not match its digest")
            members[name] = blob
    if _container(manifest_bytes, sig_bytes, members) != data:
        raise ArtifactError(f"{where}: container bytes differ from the signed content")
    return Artifact(
        manifest=manifest,
        members=members,
        key_id=str(manifest.get("key_id", "")),
        manifest_bytes=manifest_bytes,
        path=None if isinstance(source, bytes) else str(source),
    )


def _read_source(source: str | Path | bytes, where: str) -> bytes:
    """The artifact's bytes; a path must name a regular file (checked before and after open).

    ``O_NONBLOCK`` keeps a FIFO swapped in between the two checks from blocking the open.
    """
    if isinstance(source, bytes):
        data = source
    else:
        try:
            _check_regular(os.stat(source).st_mode, where)
            fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                _check_regular(st.st_mode, where)
                if st.st_size > MAX_ARTIFACT_BYTES:
                    raise ArtifactError(
                        f"{where}: {st.st_size} bytes exceeds the {MAX_ARTIFACT_BYTES} cap"
                    )
                data = fh.read(MAX_ARTIFACT_BYTES + 1)
        except FileNotFoundError:
            raise MissingArtifactError(f"{where}: no such file") from None
        except OSError as exc:
            raise ArtifactError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_ARTIFACT_BYTES:
        raise ArtifactError(f"{where}: larger than the {MAX_ARTIFACT_BYTES}-byte cap")
    return data


def _check_regular(mode: int, where: str) -> None:
    if not stat.S_ISREG(mode):
        kind = (
            "a directory"
            if stat.S_ISDIR(mode)
            else "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket or other special file"
        )
        raise ArtifactError(f"{where}: not a regular file ({kind})")


def _check_index(zf: zipfile.ZipFile, where: str) -> dict[str, zipfile.ZipInfo]:
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ArtifactError(f"{where}: {len(infos)} members exceeds the cap of {MAX_MEMBERS}")
    by_name: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        name = info.filename
        check_member_name(name)
        if name in by_name:
            raise ArtifactError(f"{where}: member {name!r} appears twice")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise ArtifactError(f"{where}: member {name} is compressed; artifacts store members")
        cap = (
            MAX_MANIFEST_BYTES
            if name == MANIFEST
            else MAX_SIGNATURE_BYTES
            if name == SIGNATURE
            else MAX_MEMBER_BYTES
        )
        if info.file_size > cap:
            raise ArtifactError(
                f"{where}: member {name} declares {info.file_size} bytes (cap {cap})"
            )
        total += info.file_size
        by_name[name] = info
    if total > MAX_ARTIFACT_BYTES:
        raise ArtifactError(
            f"{where}: members declare {total} bytes in all (cap {MAX_ARTIFACT_BYTES})"
        )
    for required in (MANIFEST, SIGNATURE):
        if required not in by_name:
            raise ArtifactError(f"{where}: no {required}; not a boxwatch artifact")
    return by_name


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> bytes:
    try:
        with zf.open(info) as fh:
            blob = fh.read(info.file_size + 1)
    except _ZIP_ERRORS as exc:
        raise ArtifactError(f"{where}: member {info.filename} is corrupt ({exc})") from None
    if len(blob) != info.file_size:
        raise ArtifactError(f"{where}: member {info.filename} has the wrong size")
    return blob


def _check_signature(
    manifest_bytes: bytes,
    sig_bytes: bytes,
    trusted_keys: Mapping[str, Ed25519PublicKey] | None,
    where: str,
) -> str | None:
    sig = _parse_json(sig_bytes, f"{where}: {SIGNATURE}")
    if not isinstance(sig, dict) or sig.get("algorithm") != SIGNATURE_ALGORITHM:
        raise ArtifactError(f"{where}: signature is not an {SIGNATURE_ALGORITHM} signature")
    if trusted_keys is None:
        return None
    kid = sig.get("key_id")
    public_key = trusted_keys.get(kid) if isinstance(kid, str) else None
    if public_key is None:
        trusted = ", ".join(sorted(trusted_keys)) or "none"
        raise ArtifactError(f"{where}: signed by untrusted key id {kid!r} (trusted: {trusted})")
    try:
        signature = base64.b64decode(str(sig.get("signature", "")), validate=True)
        public_key.verify(signature, manifest_bytes)
    except (InvalidSignature, ValueError):
        raise ArtifactError(f"{where}: signature does not verify (tampered or wrong key)") from None
    return kid


def _check_manifest(manifest: Any, where: str) -> None:
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise ArtifactError(f"{where}: manifest is not a {SCHEMA} manifest")
    version = str(manifest.get("schema_version", ""))
    major = version.split(".", 1)[0]
    if not (major.isascii() and major.isdigit()) or int(major) != SUPPORTED_MAJOR:
        raise ArtifactError(
            f"{where}: schema version {version!r} is not supported (this boxwatch reads "
            f"{SUPPORTED_MAJOR}.x)"
        )
    members = manifest.get("members")
    if not isinstance(members, dict) or not all(isinstance(v, dict) for v in members.values()):
        raise ArtifactError(f"{where}: manifest has no valid member table")
    if not isinstance(manifest.get("created_at_epoch"), int):
        raise ArtifactError(f"{where}: manifest has no creation time")
    for name in members:
        check_member_name(name)


_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[[ord("["), ord("{")]] = 1
_BRACKET_STEP[[ord("]"), ord("}")]] = -1
_SCAN_CHUNK = 1 << 20  # bytes per step of json_depth: bounds its working memory


def json_depth(data: bytes) -> int:
    """Deepest bracket nesting of JSON text ``data`` (strings skipped), in one linear pass.

    No regex: the text is scanned in chunks of :data:`_SCAN_CHUNK` bytes with numpy,
    carrying across chunks whether a string is open, whether the text so far ends in an odd
    run of backslashes, and the depth. A quote ends or starts a string unless an odd run of
    backslashes precedes it; brackets inside strings do not count. In an unterminated string
    the rest of the text is skipped (the parser then refuses it). Time and memory are linear
    in ``len(data)`` whatever the text (a rescan at every quote made 200 KB take minutes).
    """
    text = np.frombuffer(data, dtype=np.uint8)
    depth = deepest = 0
    in_string = False
    odd_run = False
    for start in range(0, len(text), _SCAN_CHUNK):
        chunk = text[start : start + _SCAN_CHUNK]
        quotes = np.flatnonzero(chunk == _QUOTE)
        is_bs = chunk == _BACKSLASH
        if is_bs.any() or odd_run:
            # For each position: the index of the last byte at or before it that is not a
            # backslash (-1: the run reaches the chunk's start and continues the previous).
            last = np.maximum.accumulate(np.where(is_bs, -1, np.arange(len(chunk))))
            before = np.maximum(quotes - 1, 0)
            runs = np.where(quotes > 0, quotes - 1 - last[before], 0)
            runs += np.where((quotes == 0) | (last[before] < 0), int(odd_run), 0)
            quotes = quotes[runs % 2 == 0]
            tail = len(chunk) - 1 - int(last[-1])
            odd_run = bool((tail + (int(odd_run) if last[-1] < 0 else 0)) % 2)
        steps = _BRACKET_STEP[chunk]
        brackets = np.flatnonzero(steps)
        if len(brackets):
            toggles = np.zeros(len(chunk), dtype=np.uint8)
            toggles[quotes] = 1
            outside = np.bitwise_xor.accumulate(toggles)[brackets] == int(in_string)
            levels = depth + np.cumsum(steps[brackets[outside]], dtype=np.int64)
            if len(levels):
                deepest = max(deepest, int(levels.max()))
                depth = int(levels[-1])
        in_string ^= bool(len(quotes) % 2)
    return deepest


def _parse_json(
    data: bytes, where: str, *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int = MAX_JSON_BYTES
) -> Any:
    """Parse JSON bytes from an artifact, bounded: size and nesting checked before parsing."""

    def _no_constants(token: str) -> Any:
        raise ValueError(f"non-standard JSON constant {token}")

    if len(data) > max_bytes:
        raise ArtifactError(f"{where}: {len(data)} bytes of JSON (cap {max_bytes})")
    depth = json_depth(data)
    if depth > max_depth:
        raise ArtifactError(f"{where}: JSON nests {depth} levels deep (cap {max_depth})")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"{where}: invalid JSON ({exc})") from None
