"""Ed25519 keys: generation, PEM files, and key ids that let agents trust several keys."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from boxwatch.agent.atomic import write_atomic
from boxwatch.agent.errors import ConfigError, KeyFileError, MissingKeyFileError
from boxwatch.agent.inputs import read_bounded, show_path

PRIVATE_KEY_MODE = 0o600
MAX_KEY_FILE_BYTES = 64 * 1024


def key_id(public_key: Ed25519PublicKey) -> str:
    """Short stable id of a public key: the first 16 hex digits of sha256(raw key bytes)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(
    private_path: str | Path, public_path: str | Path, *, force: bool = False
) -> str:
    """Write a new Ed25519 key pair as PEM files and return its key id.

    The private key file is created with mode 0600; existing files are never overwritten
    unless ``force`` is true.
    """
    private_path, public_path = Path(private_path), Path(public_path)
    if private_path.resolve() == public_path.resolve():
        raise KeyFileError(f"--private and --public name the same file: {private_path}")
    if not force:
        for path in (private_path, public_path):
            if path.exists():
                raise KeyFileError(f"{path} exists; use --force to overwrite it")
    private_key = Ed25519PrivateKey.generate()
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write_private(private_path, private_pem)
    _write_atomic(public_path, public_pem, 0o644)
    return key_id(private_key.public_key())


def _write_private(path: Path, data: bytes) -> None:
    """Write a secret so that it is never readable by others, not even for an instant."""
    _write_atomic(path, data, PRIVATE_KEY_MODE)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data, mode=mode)
    except OSError as exc:
        raise KeyFileError(f"cannot write key file {path}: {exc.strerror or exc}") from None


def _read_key_file(path: str | Path) -> bytes:
    path = Path(path)
    if not path.exists():
        raise MissingKeyFileError(f"key file not found: {show_path(path)}")
    try:
        return read_bounded(path, MAX_KEY_FILE_BYTES, what="key file")
    except ConfigError as exc:
        raise KeyFileError(str(exc)) from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Load an unencrypted PEM Ed25519 private key, refusing other key types."""
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyFileError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Load a PEM Ed25519 public key, refusing other key types."""
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyFileError(f"{path} is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def load_trusted_keys(paths: list[str | Path]) -> dict[str, Ed25519PublicKey]:
    """Map key id -> public key for every trusted key file (several during rotation)."""
    if not paths:
        raise KeyFileError("no trusted public key given")
    return {key_id(k): k for k in (load_public_key(p) for p in paths)}
