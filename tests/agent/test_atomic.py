"""One atomic file writer (``agent/atomic.py``) behind keys, artifacts and reports."""

from __future__ import annotations

import os
import stat

import pytest
from locations import ROOT

from boxwatch.agent import atomic
from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.errors import ArtifactError, KeyFileError
from boxwatch.agent.keys import generate_keypair


def _fail_fsync(monkeypatch):
    def broken(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", broken)


def test_keygen_leaves_no_temp_file_on_failure(tmp_path, monkeypatch):
    _fail_fsync(monkeypatch)
    with pytest.raises(KeyFileError, match="No space left"):
        generate_keypair(tmp_path / "k.key", tmp_path / "k.pub")
    assert list(tmp_path.iterdir()) == []


def test_artifact_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "a.bwa"
    path.write_bytes(b"old")
    _fail_fsync(monkeypatch)
    with pytest.raises(ArtifactError, match="cannot write artifact"):
        write_artifact(path, b"new")
    assert path.read_bytes() == b"old" and list(tmp_path.iterdir()) == [path]


def test_modes(tmp_path):
    atomic.write_atomic(tmp_path / "secret", b"s", mode=0o600)
    atomic.write_atomic(tmp_path / "public", b"p")
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "public").stat().st_mode) == 0o644


def test_one_writer_renames_files():
    """Only the atomic writer renames a temp file over a target."""
    users = []
    for folder in ("agent", "offline", "boxwatch"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "os.replace(" in path.read_text() or "os.rename(" in path.read_text():
                users.append(str(path.relative_to(ROOT)))
    assert users == [os.path.join("agent", "atomic.py")]
