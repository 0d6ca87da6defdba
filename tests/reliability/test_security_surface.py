"""Issue 24: what the agent reads before it trusts it, and its HTTP surface.

Hostile artifacts (deep JSON, ZIP index bombs, FIFOs, devices, directories), ``inspect`` of a
malformed unsigned manifest, the model digest of every file the model loads (ONNX external
data, symlinks, directories), and the metrics server's connection bounds. The agent-level
cases (start and SIGHUP reload against a real broker) are in test_reliability_artifact.py.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from locations import ROOT
from onnx import TensorProto, helper, numpy_helper
from prometheus_client import CollectorRegistry

from boxwatch.agent import artifact as art
from boxwatch.agent import runtime
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.agent.http import AgentHTTPServer
from boxwatch.cli import cli as cli_main
from boxwatch.commands.console import EXIT_FAILED, EXIT_USAGE

DEEP = 100_000


@pytest.fixture(scope="module")
def pub_file(signing_key, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pub") / "k.pub"
    path.write_bytes(
        signing_key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    return path


def good(signing_key) -> bytes:
    return art.build_artifact_bytes(
        {"monitors/meta.json": {"classes": ["a", "b"]}},
        private_key=signing_key,
        created_at=1_700_000_000,
        model={"digest": "sha256:" + "0" * 64, "files": []},
        contents={"classes": ["a", "b"]},
    )


def deep_signature(signing_key) -> bytes:
    """A canonical container whose manifest.sig is a 100,000-deep JSON array."""
    loaded = art.load_artifact(good(signing_key), None)
    deep = b"[" * DEEP + b"]" * DEEP
    return art._container(loaded.manifest_bytes, deep, dict(loaded.members))


def deep_signed_manifest(signing_key) -> bytes:
    """A deep manifest, validly signed: the signature verifies, then parsing must not crash."""
    deep = b"[" * DEEP + b"]" * DEEP
    return art._container(deep, art._signature_bytes(signing_key, deep), {})


def index_bomb(entries: int) -> bytes:
    """A ZIP whose central directory alone declares ``entries`` members (all the same name)."""
    name = b"a.json"
    record = struct.pack(
        "<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 33, 0, 0, 0, len(name), 0, 0, 0, 0, 0, 0
    )
    central = (record + name) * entries
    count = min(entries, 0xFFFF)
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), 0, 0)
    return central + eocd


# -- bounded parsing before the signature -------------------------------------------------------
def test_deep_signature_json_is_a_clean_error(signing_key, trusted):
    """100,000 levels: refused by the signature's size cap; 100 levels (within the cap): by
    the depth cap."""
    with pytest.raises(ArtifactError, match="manifest.sig declares .* bytes"):
        art.load_artifact(deep_signature(signing_key), trusted)
    loaded = art.load_artifact(good(signing_key), None)
    deep = b"[" * 100 + b"]" * 100
    data = art._container(loaded.manifest_bytes, deep, dict(loaded.members))
    for keys in (trusted, None):
        with pytest.raises(ArtifactError, match="manifest.sig.*nest"):
            art.load_artifact(data, keys)


def test_deep_signed_manifest_is_a_clean_error(signing_key, trusted):
    with pytest.raises(ArtifactError, match="manifest.json.*nest"):
        art.load_artifact(deep_signed_manifest(signing_key), trusted)


def test_deep_member_json_is_a_clean_error(signing_key, trusted):
    deep = b"[" * DEEP + b"]" * DEEP
    data = art.build_artifact_bytes(
        {"m.json": deep}, private_key=signing_key, created_at=1_700_000_000
    )
    loaded = art.load_artifact(data, trusted)
    with pytest.raises(ArtifactError, match="m.json.*nest"):
        loaded.json("m.json")


def test_zip_index_bomb_refused_from_the_end_record(trusted):
    """200,000 index entries (9.6 MB): refused from the end-of-central-directory record."""
    with pytest.raises(ArtifactError, match="central directory"):
        art.load_artifact(index_bomb(200_000), trusted)


def test_npz_index_bomb_refused(trusted):
    from boxwatch.agent.arrays import loads_npz

    with pytest.raises(ArtifactError, match="central directory"):
        loads_npz(index_bomb(70_000))


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_non_regular_files_refused_before_open(trusted, tmp_path, kind):
    path = tmp_path / "a.bwa"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    result: list[BaseException] = []

    def load() -> None:
        try:
            art.load_artifact(path, trusted)
        except BaseException as exc:  # the test reports whatever was raised
            result.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock the FIFO reader so the thread ends
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(5)
        pytest.fail(f"loading a {kind} hangs")
    assert len(result) == 1 and isinstance(result[0], ArtifactError), result
    assert "not a regular file" in str(result[0])


# -- one line and the documented exit code from the CLI ------------------------------------------
def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "boxwatch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-500:])
    return lines[0]


@pytest.mark.slow
def test_cli_hostile_artifacts_one_line(signing_key, pub_file, tmp_path):
    cases = {
        "deep_sig": deep_signature(signing_key),
        "deep_manifest": deep_signed_manifest(signing_key),
        "index_bomb": index_bomb(200_000),
    }
    for name, blob in cases.items():
        path = tmp_path / f"{name}.bwa"
        path.write_bytes(blob)
        line = _one_line(_cli("verify-artifact", str(path), "--public-key", str(pub_file)), 1)
        assert line.startswith("error:"), (name, line)
        _one_line(_cli("inspect", str(path)), EXIT_FAILED)
        _one_line(_cli("inspect", str(path), "--public-key", str(pub_file)), EXIT_FAILED)
    fifo = tmp_path / "fifo.bwa"
    os.mkfifo(fifo)
    try:
        for args, code in (
            (("inspect", str(fifo)), EXIT_FAILED),
            (("verify-artifact", str(fifo), "--public-key", str(pub_file)), EXIT_USAGE),
        ):
            assert "not a regular file" in _one_line(_cli(*args, timeout=30), code)
    except subprocess.TimeoutExpired:
        pytest.fail("a FIFO given as the artifact hangs the CLI")


# -- inspect of an unsigned, malformed manifest -------------------------------------------------
def _unsigned(manifest: dict) -> bytes:
    mb = art.canonical_json(manifest)
    sig = art.canonical_json({"algorithm": "ed25519", "key_id": "x", "signature": ""})
    return art._container(mb, sig, {})


BASE_MANIFEST = {
    "schema": art.SCHEMA,
    "schema_version": "1.0",
    "created_at_epoch": 1,
    "key_id": "k",
    "members": {},
}


@pytest.mark.parametrize(
    "changes",
    [
        {"builder": "x"},
        {"model": [1, 2]},
        {"model": {"files": "abc"}},
        {"model": {"files": [1, {"name": 2}]}},
        {"contents": [1]},
        {"contents": {"layers": [{"a": 1}, 3]}},
        {"created_at": {"x": 1}},
        {"key_id": 5},
        {"builder": {"name": ["x"], "version": None}},
    ],
)
def test_inspect_without_key_survives_malformed_manifest(tmp_path, changes):
    path = tmp_path / "m.bwa"
    path.write_bytes(_unsigned({**BASE_MANIFEST, **changes}))
    for extra in ((), ("--json",)):
        result = CliRunner().invoke(cli_main, ["inspect", str(path), *extra])
        assert result.exit_code == 0, (changes, result.output, result.exception)
        assert "not checked" in result.output


def test_inspect_escapes_control_characters(tmp_path):
    evil = "\x1b[2J\x1b[Hsignature verified\r\x07\x9b"
    manifest = {
        **BASE_MANIFEST,
        "key_id": evil,
        "builder": {"name": evil, "version": evil},
        "created_at": evil,
        "model": {"digest": evil, "files": [{"name": evil, "size": evil, "sha256": evil}]},
        "contents": {evil: evil, "classes": [evil], "layers": [{evil: evil}]},
    }
    path = tmp_path / "evil.bwa"
    path.write_bytes(_unsigned(manifest))
    result = CliRunner().invoke(cli_main, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert not any(ord(c) < 32 and c != "\n" or 127 <= ord(c) < 160 for c in out), repr(out)
    assert "\\x1b[2J" in out
    assert re.search(r"^signature +not checked", out, re.MULTILINE), out


# -- the model digest covers every file the model loads --------------------------------------------
def _onnx_model(folder: Path, *, external: bool, location: str = "model.onnx.data") -> Path:
    """A 4 -> 2 MatMul model; with ``external`` its weights live in ``location``."""
    folder.mkdir(parents=True, exist_ok=True)
    w = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), name="W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "model.onnx"
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=location,
            size_threshold=0,
        )
    else:
        onnx.save_model(model, str(path))
    return path


def _names(files) -> list[str]:
    return sorted(name for name, _ in files)


def test_external_data_found_without_being_listed(tmp_path):
    model = _onnx_model(tmp_path / "m", external=True)
    assert _names(runtime.model_files(model)) == ["model.onnx", "model.onnx.data"]
    assert _names(runtime.model_files(model, declared=[model.parent / "model.onnx.data"])) == [
        "model.onnx",
        "model.onnx.data",
    ]


def test_declared_external_data_must_equal_the_references(tmp_path):
    model = _onnx_model(tmp_path / "m", external=True)
    with pytest.raises(ConfigError, match="passwd"):
        runtime.model_files(model, declared=[Path("/etc/passwd")])
    with pytest.raises(ConfigError, match="model.onnx.data"):
        runtime.model_files(model, declared=[])
    plain = _onnx_model(tmp_path / "p", external=False)
    (plain.parent / "extra.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="extra.bin"):
        runtime.model_files(plain, declared=[plain.parent / "extra.bin"])


def test_missing_and_escaping_external_data_refused(tmp_path):
    model = _onnx_model(tmp_path / "m", external=True)
    (model.parent / "model.onnx.data").unlink()
    with pytest.raises(ConfigError, match="model.onnx.data.*no such file|missing"):
        runtime.model_files(model)
    (tmp_path / "outside.data").write_bytes(b"")
    escaping = _onnx_model(tmp_path / "e", external=True)
    proto = onnx.load_model(str(escaping), load_external_data=False)
    for entry in proto.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../outside.data"
    escaping.write_bytes(proto.SerializeToString())
    with pytest.raises(ConfigError, match="outside the model's folder"):
        runtime.model_files(escaping)
    linked = _onnx_model(tmp_path / "l", external=True)
    data = linked.parent / "model.onnx.data"
    os.replace(data, tmp_path / "real.data")
    data.symlink_to(tmp_path / "real.data")
    with pytest.raises(ConfigError, match="outside the model's folder"):
        runtime.model_files(linked)


def test_directory_refused_and_pt2_hashed_whole(tmp_path):
    with pytest.raises(ConfigError, match="directory"):
        runtime.model_files(tmp_path)
    pt2 = tmp_path / "model.pt2"
    pt2.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    assert runtime.model_files(pt2) == [("model.pt2", pt2.resolve())]


def test_symlinked_model_recorded_by_its_real_name(tmp_path, signing_key, trusted):
    model = _onnx_model(tmp_path / "real", external=True)
    link = tmp_path / "link.onnx"
    link.symlink_to(model)
    files = runtime.model_files(link)
    assert _names(files) == ["model.onnx", "model.onnx.data"]
    record = art.digest_files(files)
    loaded = art.load_artifact(
        art.build_artifact_bytes(
            {"m.json": {}}, private_key=signing_key, created_at=1, model=record
        ),
        trusted,
    )
    assert runtime.check_model_digest(loaded, model) == model
    assert runtime.check_model_digest(loaded, link) == model


def test_agent_refuses_changed_or_unrecorded_external_weights(tmp_path, signing_key, trusted):
    model = _onnx_model(tmp_path / "m", external=True)

    def artifact_for(record):
        return art.load_artifact(
            art.build_artifact_bytes(
                {"m.json": {}}, private_key=signing_key, created_at=1, model=record
            ),
            trusted,
        )

    full = artifact_for(art.digest_files(runtime.model_files(model)))
    runtime.check_model_digest(full, model)
    graph_only = artifact_for(art.digest_files([("model.onnx", model)]))
    with pytest.raises(ArtifactError, match="model.onnx.data"):
        runtime.check_model_digest(graph_only, model)
    data = model.parent / "model.onnx.data"
    data.write_bytes(bytes(b ^ 0x80 for b in data.read_bytes()))
    with pytest.raises(ArtifactError, match="does not match"):
        runtime.check_model_digest(full, model)


# -- the metrics server ----------------------------------------------------------------------------
def _server(**kw) -> AgentHTTPServer:
    return AgentHTTPServer(
        "127.0.0.1:0",
        CollectorRegistry(),
        healthy=lambda: True,
        ready=lambda: True,
        status=lambda: {},
        **kw,
    ).start()


def _get(address: str, path: str = "/healthz") -> int:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as resp:
        return resp.status


@pytest.mark.slow
def test_slow_connections_time_out_and_are_capped(tmp_path):
    srv = _server(request_timeout_s=0.5, max_connections=8)
    host, port = srv.address.rsplit(":", 1)
    threads_before = threading.active_count()
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(40)]
    try:
        time.sleep(0.2)
        assert threading.active_count() == threads_before  # one thread serves them all
        for s in socks:  # every idle connection is closed by the server (EOF or reset)
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        assert _get(srv.address) == 200
    finally:
        for s in socks:
            s.close()
        srv.stop()


@pytest.mark.slow
def test_dropped_clients_log_no_traceback(capfd, caplog):
    srv = _server()
    host, port = srv.address.rsplit(":", 1)
    try:
        with caplog.at_level(logging.DEBUG):
            for _ in range(20):
                s = socket.create_connection((host, int(port)))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                s.close()  # reset: the server's write fails
            time.sleep(0.5)
            assert _get(srv.address) == 200
    finally:
        srv.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err, err[-2000:]
    assert "Traceback" not in caplog.text


def test_address_in_use_is_a_config_error():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(ConfigError, match="already in use"):
            _server_at(f"127.0.0.1:{taken.getsockname()[1]}")
    finally:
        taken.close()


def _server_at(address: str) -> AgentHTTPServer:
    return AgentHTTPServer(
        address, CollectorRegistry(), healthy=lambda: True, ready=lambda: True, status=dict
    )


@pytest.mark.slow
def test_build_signs_unlisted_external_weights_and_the_agent_checks_them(tmp_path, pub_file):
    """torch-style export: weights in model.onnx.data, not listed in the config. The build
    hashes them anyway; negating every weight makes the agent refuse to start."""
    import yaml

    from boxwatch.agent.runtime import load_runtime
    from boxwatch.commands.demo import write_build_config
    from boxwatch.examples import example_path
    from boxwatch.offline.release.config import load_config
    from boxwatch.offline.release.pipeline import build, prepare

    config = write_build_config(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw.pop("bn")
    raw["monitor"]["tau"] = [0.2]
    raw["policy"] = {}
    model = tmp_path / "ext" / "model.onnx"
    model.parent.mkdir()
    onnx.save_model(
        onnx.load(str(example_path("digits", "model.onnx"))),
        str(model),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    raw["model"]["path"] = str(model)
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    key = Ed25519PrivateKey.generate()
    outcome = build(prepare(load_config(config)), key, created_at=1_700_000_000)
    record = art.load_artifact(outcome.artifact, None).manifest["model"]
    assert [f["name"] for f in record["files"]] == ["model.onnx", "model.onnx.data"]
    path = tmp_path / "ext.bwa"
    path.write_bytes(outcome.artifact)
    pub = tmp_path / "k.pub"
    pub.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    load_runtime(path, [str(pub)], model_path=model)
    data = model.parent / "model.onnx.data"
    weights = np.frombuffer(data.read_bytes(), dtype="<f4")
    data.write_bytes((-weights).astype("<f4").tobytes())
    with pytest.raises(ArtifactError, match="does not match"):
        load_runtime(path, [str(pub)], model_path=model)
