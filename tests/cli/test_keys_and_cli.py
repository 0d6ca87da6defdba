"""Key files and the foundation CLI verbs (keygen, verify-artifact, inspect), run in-process."""

from __future__ import annotations

import json
import stat

import pytest
from click.testing import CliRunner

from boxwatch import __version__
from boxwatch.agent import artifact as art
from boxwatch.agent.errors import KeyFileError
from boxwatch.agent.keys import (
    generate_keypair,
    load_private_key,
    load_public_key,
    load_trusted_keys,
)
from boxwatch.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture()
def keypair(tmp_path):
    priv, pub = tmp_path / "k.key", tmp_path / "k.pub"
    kid = generate_keypair(priv, pub)
    return priv, pub, kid


@pytest.fixture()
def artifact_file(tmp_path, keypair):
    priv, _pub, _kid = keypair
    path = tmp_path / "a.bwa"
    data = art.build_artifact_bytes(
        {"monitors/meta.json": {"tau": 0.1}},
        private_key=load_private_key(priv),
        created_at=0,
        model={
            "digest": "sha256:" + "ab" * 32,
            "files": [{"name": "model.onnx", "sha256": "ab" * 32, "size": 3}],
        },
        contents={"classes": ["0", "1"], "layers": ["/fc1/Gemm_output_0"]},
    )
    art.write_artifact(path, data)
    return path


def test_private_key_mode_0600_and_no_overwrite(keypair):
    priv, pub, kid = keypair
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert len(kid) == 16
    with pytest.raises(KeyFileError, match="exists; use --force"):
        generate_keypair(priv, pub)
    kid2 = generate_keypair(priv, pub, force=True)
    assert kid2 != kid and stat.S_IMODE(priv.stat().st_mode) == 0o600


def test_key_type_errors(keypair, tmp_path):
    priv, pub, _ = keypair
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        load_public_key(priv)
    with pytest.raises(KeyFileError, match="not an unencrypted PEM private key"):
        load_private_key(pub)
    with pytest.raises(KeyFileError, match="key file not found"):
        load_public_key(tmp_path / "missing.pub")
    with pytest.raises(KeyFileError, match="no trusted public key"):
        load_trusted_keys([])


def test_cli_keygen(tmp_path):
    priv, pub = tmp_path / "x.key", tmp_path / "x.pub"
    result = run("keygen", "--private", str(priv), "--public", str(pub))
    assert result.exit_code == EXIT_OK
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert result.stdout.strip() in load_trusted_keys([pub])
    again = run("keygen", "--private", str(priv), "--public", str(pub))
    assert again.exit_code == EXIT_USAGE and "use --force" in again.stderr


def test_cli_verify_valid_invalid_and_usage(artifact_file, keypair, tmp_path):
    _priv, pub, _ = keypair
    ok = run("verify-artifact", str(artifact_file), "--public-key", str(pub))
    assert ok.exit_code == EXIT_OK, ok.stderr
    other_priv, other_pub = tmp_path / "o.key", tmp_path / "o.pub"
    generate_keypair(other_priv, other_pub)
    bad = run("verify-artifact", str(artifact_file), "--public-key", str(other_pub))
    assert bad.exit_code == EXIT_FAILED and "untrusted key id" in bad.stderr
    both = run(
        "verify-artifact",
        str(artifact_file),
        "--public-key",
        str(other_pub),
        "--public-key",
        str(pub),
    )
    assert both.exit_code == EXIT_OK
    data = bytearray(artifact_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    artifact_file.write_bytes(bytes(data))
    flipped = run("verify-artifact", str(artifact_file), "--public-key", str(pub))
    assert flipped.exit_code == EXIT_FAILED and flipped.stderr.startswith("error: ")
    assert "Traceback" not in flipped.stderr
    missing = run("verify-artifact", str(tmp_path / "nope.bwa"), "--public-key", str(pub))
    assert missing.exit_code == EXIT_USAGE
    nokey = run("verify-artifact", str(artifact_file), "--public-key", str(tmp_path / "no.pub"))
    assert nokey.exit_code == EXIT_USAGE and "key file not found" in nokey.stderr


def test_cli_inspect(artifact_file, keypair):
    _priv, pub, kid = keypair
    result = run("inspect", str(artifact_file), "--json", "--public-key", str(pub))
    assert result.exit_code == EXIT_OK, result.stderr
    info = json.loads(result.stdout)
    assert info["key_id"] == kid and info["signature"] == "verified"
    assert info["contents"]["classes"] == ["0", "1"]
    assert info["model"]["digest"] == "sha256:" + "ab" * 32
    assert info["builder"]["version"] == __version__
    assert set(info["members"]) == {"monitors/meta.json"}
    text = run("inspect", str(artifact_file))
    assert text.exit_code == EXIT_OK
    assert "not checked" in text.stdout and "/fc1/Gemm_output_0" in text.stdout


def test_version_and_help():
    assert run("--version").stdout.strip().endswith(__version__)
    helptext = run("--help").stdout
    for verb in ("keygen", "verify-artifact", "inspect", "demo", "build-artifact", "agent"):
        assert verb in helptext
    assert "Exit codes" in helptext
