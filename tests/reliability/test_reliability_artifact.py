"""Artifact trust: tampered artifacts stop the agent at start; reloads verify, swap whole,
keep the old artifact on failure, refuse rollbacks, and accept rotated keys by key id.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import replace

import pytest
from reliability_helpers import (
    MODEL_TOPICS,
    PYTHON,
    ROOT,
    TOPICS,
    OutputCollector,
    StreamProducer,
    artifact_id,
    create_model_topics,
    refusals_at_start,
    resign,
    stream_rows,
    tensor_record,
)

from boxwatch.agent.artifact import _container, _signature_bytes, canonical_json, load_artifact
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.service import build_agent

T0 = 1_700_000_000
RELOADS = "boxwatch_agent_artifact_reloads_total"


@pytest.fixture(scope="module")
def key2(tmp_path_factory):
    """A second signing key (rotation, or an untrusted signer)."""
    d = tmp_path_factory.mktemp("key2")
    generate_keypair(d / "k2.key", d / "k2.pub")
    return d / "k2.key", d / "k2.pub"


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x40
    return bytes(out)


def tampered_artifacts(example, key2, out) -> dict[str, tuple[object, str]]:
    """name -> (artifact path, text expected in the one-line error)."""
    art = load_artifact(example.artifact, None)
    data = example.artifact.read_bytes()
    key = load_private_key(example.private_key)
    cases = {}

    def write(name: str, blob: bytes, needle: str) -> None:
        path = out / f"{name}.bwa"
        path.write_bytes(blob)
        cases[name] = (path, needle)

    member_at = data.index(art.members["monitors/boxes.npz"][:64]) + 100
    write("flip_member_byte", _flip(data, member_at), "")
    write("flip_manifest_byte", _flip(data, data.index(b'"created_at_epoch"') + 3), "")
    write("flip_last_byte", _flip(data, len(data) - 1), "")
    write("truncated", data[: len(data) // 2], "")
    members = dict(art.members)
    members["bn/rules.json"], members["model/spec.json"] = (
        members["model/spec.json"],
        members["bn/rules.json"],
    )
    sig = _signature_bytes(key, art.manifest_bytes)
    write("swapped_members", _container(art.manifest_bytes, sig, members), "member")
    other = resign(example.artifact, key2[0], out / "other_key.bwa", created_at=T0 + 1)
    cases["other_key"] = (other, "untrusted key id")
    manifest = {**art.manifest, "schema_version": "2.0"}
    mb = canonical_json(manifest)
    write(
        "unknown_schema",
        _container(mb, _signature_bytes(key, mb), dict(art.members)),
        "schema version",
    )
    bad_model = {**art.manifest["model"], "digest": "sha256:" + "0" * 64}
    wrong = resign(
        example.artifact,
        example.private_key,
        out / "model_digest.bwa",
        created_at=T0 + 2,
        manifest_changes={"model": bad_model},
    )
    cases["model_digest_mismatch"] = (wrong, "does not match")
    return cases


@pytest.mark.slow
def test_tampered_artifacts_stop_the_agent_at_start(example, key2, tmp_path):
    """Each tampered artifact: exit code 1, one line on stderr, no traceback."""
    cases = tampered_artifacts(example, key2, tmp_path)
    refusals = refusals_at_start(example, {name: path for name, (path, _) in cases.items()})
    for name, (_, needle) in cases.items():
        assert needle in refusals[name], (name, refusals[name])


def test_start_trusts_several_keys_by_key_id(example, agent_factory, key2, tmp_path):
    """Rotation: an artifact signed by the new key starts when both keys are trusted."""
    new = replace(
        example,
        artifact=resign(example.artifact, key2[0], tmp_path / "new.bwa", created_at=T0 + 10),
    )
    both = agent_factory(
        new,
        kafka__bootstrap_servers="127.0.0.1:1",
        public_keys=[str(example.public_key), str(key2[1])],
    )
    assert both.runtime.artifact.key_id == load_artifact(new.artifact, None).key_id
    from boxwatch.agent.errors import ArtifactError

    with pytest.raises(ArtifactError, match="untrusted key id"):
        agent_factory(new, kafka__bootstrap_servers="127.0.0.1:1")


def test_allow_rollback_accepts_an_older_artifact(example, agent_config_factory, tmp_path):
    """In-process: with allow_rollback an older valid artifact is swapped in; without, refused."""
    live = tmp_path / "live.bwa"
    newer = resign(
        example.artifact, example.private_key, tmp_path / "newer.bwa", created_at=T0 + 50
    )
    shutil.copyfile(newer, live)
    for allow, result in ((False, "refused_rollback"), (True, "success")):
        cfg = agent_config_factory(replace(example, artifact=live), allow_rollback=allow)
        shutil.copyfile(newer, live)
        agent = build_agent(cfg)
        shutil.copyfile(example.artifact, live)
        agent.request_reload()
        agent._poll_reload()  # starts the load in its thread
        deadline = time.monotonic() + 60
        while agent._reload_job is not None and time.monotonic() < deadline:
            agent._reload_job.done.wait(0.1)
            agent._poll_reload()  # settles it once loaded
        got = agent.metrics.artifact_reloads.labels(result)._value.get()
        assert got == 1, (allow, result)
        expected = example.artifact if allow else newer
        assert agent.runtime.artifact_id == artifact_id(expected, example.public_key)


class VerdictStream:
    """Model inputs ``PREFIXi`` (rows of the example) sent in rounds to a running agent."""

    def __init__(self, bootstrap: str, collector: OutputCollector, rows, prefix: str) -> None:
        self.bootstrap, self.collector, self.rows, self.prefix = bootstrap, collector, rows, prefix
        self.sent = 0

    def send(self, n: int) -> None:
        """Send ``n`` more inputs and wait until every input sent so far has its verdict."""
        ids = [f"{self.prefix}{self.sent + i}" for i in range(n)]
        recs = [
            (rid.encode(), *tensor_record(rid, self.rows[i % len(self.rows)]))
            for i, rid in enumerate(ids)
        ]
        p = StreamProducer(self.bootstrap, TOPICS["inputs"], recs)
        p.start()
        p.join(60)
        assert p.error is None
        self.sent += n
        assert self.collector.wait_for(lambda col: col.count >= self.sent, timeout=60)


def wait_reload(agent, result: str, count: float) -> dict:
    """The agent's metrics once ``count`` reloads with ``result`` are counted (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = agent.scrape()
        if m.get(f'{RELOADS}{{result="{result}"}}') == count:
            return m
        if not agent.alive:
            break
        time.sleep(0.2)
    raise AssertionError(f"no {result} reload counted ({count}):\n{agent.log_tail()}")


@pytest.mark.slow
@pytest.mark.integration
def test_sighup_reload_verifies_swaps_and_keeps_the_old_one(
    example, key2, make_broker, agent_process_factory, tmp_path
):
    """SIGHUP: newer artifact swapped in; tampered kept out; older refused; rotated key ok."""
    broker = make_broker("noida").start()
    create_model_topics(broker.bootstrap_servers)
    live = tmp_path / "live.bwa"
    shutil.copyfile(example.artifact, live)
    a = artifact_id(example.artifact, example.public_key)
    b_path = resign(example.artifact, example.private_key, tmp_path / "b.bwa", created_at=T0 + 100)
    c_path = resign(example.artifact, key2[0], tmp_path / "c.bwa", created_at=T0 + 200)
    b, c = artifact_id(b_path, example.public_key), artifact_id(c_path, key2[1])
    tampered = bytearray(c_path.read_bytes())
    tampered[len(tampered) // 2] ^= 1

    agent = agent_process_factory(
        broker.bootstrap_servers,
        replace(example, artifact=live),
        topics=MODEL_TOPICS,
        public_keys=[str(example.public_key), str(key2[1])],
    )
    collector = OutputCollector.of_verdicts(broker.bootstrap_servers)
    verdicts = VerdictStream(
        broker.bootstrap_servers, collector, stream_rows(example, 100, seed=5), "h"
    )

    def reload_to(blob: bytes, result: str, count: float) -> dict:
        tmp = live.with_suffix(".tmp")
        tmp.write_bytes(blob)
        tmp.replace(live)
        agent.signal(signal.SIGHUP)
        return wait_reload(agent, result, count)

    def active(m: dict) -> set[str]:
        return {
            k.split('artifact_id="')[1].split('"')[0]
            for k, v in m.items()
            if k.startswith("boxwatch_agent_artifact_info{") and v == 1
        }

    try:
        collector.start()
        agent.start().wait_ready()
        verdicts.send(50)
        assert active(reload_to(b_path.read_bytes(), "success", 1)) == {b}
        verdicts.send(50)
        m = reload_to(bytes(tampered), "failure", 1)
        assert active(m) == {b} and agent.alive
        verdicts.send(50)
        m = reload_to(example.artifact.read_bytes(), "refused_rollback", 1)
        assert active(m) == {b}
        verdicts.send(50)
        m = reload_to(c_path.read_bytes(), "success", 2)
        assert active(m) == {c}
        verdicts.send(50)
        assert agent.stop() == 0, agent.log_tail()
    finally:
        agent.kill()
        collector.stop()
    by_id = {v["id"]: v["artifact_id"] for v in collector.values[TOPICS["verdicts"]]}
    phases = [a, b, b, b, c]
    for i in range(verdicts.sent):
        assert by_id[f"h{i}"] == phases[i // 50], (i, by_id[f"h{i}"])
    log = agent.log_text()
    assert "artifact reload failed, keeping" in log and "artifact reload refused" in log
    assert json.dumps(m)  # metrics were readable to the end


def hostile_candidates(example, out) -> dict[str, object]:
    """name -> bytes (or a callable making the path) of a candidate that must fail to load."""
    from test_security_surface import DEEP, index_bomb

    art = load_artifact(example.artifact, None)
    key = load_private_key(example.private_key)
    deep = b"[" * DEEP + b"]" * DEEP
    spec = json.loads(art.members["model/spec.json"])
    del spec["preprocessing"]
    no_pre = resign(example.artifact, example.private_key, out / "no_pre.bwa", created_at=T0 + 300)
    broken = load_artifact(no_pre, None)
    members = {**broken.members, "model/spec.json": canonical_json(spec)}
    from boxwatch.agent.artifact import build_artifact_bytes

    m = broken.manifest
    return {
        "deep_signature": _container(art.manifest_bytes, deep, dict(art.members)),
        "deep_signed_manifest": _container(deep, _signature_bytes(key, deep), {}),
        "index_bomb": index_bomb(200_000),
        "signed_spec_without_preprocessing": build_artifact_bytes(
            members,
            private_key=key,
            created_at=T0 + 300,
            model=m["model"],
            config=m["config"],
            contents=m["contents"],
        ),
        "fifo": os.mkfifo,
        "directory": os.mkdir,
    }


@pytest.mark.slow
@pytest.mark.integration
def test_sighup_hostile_candidates_keep_the_agent_serving(
    example, make_broker, agent_process_factory, tmp_path
):
    """Every hostile candidate on SIGHUP: counted as a failure, one log line, old artifact
    kept, /metrics still served and the stream still monitored; then a good one swaps in."""
    broker = make_broker("noida").start()
    create_model_topics(broker.bootstrap_servers)
    live = tmp_path / "live.bwa"
    shutil.copyfile(example.artifact, live)
    a = artifact_id(example.artifact, example.public_key)
    newer = resign(example.artifact, example.private_key, tmp_path / "b.bwa", created_at=T0 + 500)
    cases = hostile_candidates(example, tmp_path)

    agent = agent_process_factory(
        broker.bootstrap_servers, replace(example, artifact=live), topics=MODEL_TOPICS
    )
    collector = OutputCollector.of_verdicts(broker.bootstrap_servers)
    verdicts = VerdictStream(
        broker.bootstrap_servers, collector, stream_rows(example, 100, seed=7), "x"
    )

    def place(candidate) -> None:
        tmp = live.with_name("candidate")
        if tmp.is_dir():
            tmp.rmdir()
        elif tmp.exists() or tmp.is_symlink():
            tmp.unlink()
        if callable(candidate):
            candidate(tmp)
        else:
            tmp.write_bytes(candidate)
        if live.is_dir():
            live.rmdir()
        elif tmp.is_dir():
            live.unlink()
        os.replace(tmp, live)

    failed_on: list[str] = []
    try:
        collector.start()
        agent.start().wait_ready()
        verdicts.send(20)
        for i, (name, candidate) in enumerate(cases.items(), start=1):
            place(candidate)
            agent.signal(signal.SIGHUP)
            try:
                m = wait_reload(agent, "failure", i)
            except AssertionError:
                failed_on.append(name)
                raise
            assert agent.alive and agent.readyz() == 200, (name, agent.log_tail())
            assert m.get(f'boxwatch_agent_artifact_info{{artifact_id="{a}"', 1) == 1 or m
            verdicts.send(20)
        place(newer.read_bytes())
        agent.signal(signal.SIGHUP)
        wait_reload(agent, "success", 1)
        verdicts.send(20)
        assert agent.stop() == 0, agent.log_tail()
    finally:
        agent.kill()
        collector.stop()
        if live.is_dir():
            live.rmdir()
    by_id = {v["id"]: v["artifact_id"] for v in collector.values[TOPICS["verdicts"]]}
    assert {by_id[f"x{i}"] for i in range(verdicts.sent - 20)} == {a}
    log_lines = [ln for ln in agent.log_text().splitlines() if "artifact reload failed" in ln]
    assert len(log_lines) == len(cases), agent.log_tail(60)
    assert "Traceback" not in agent.log_text(), agent.log_tail(60)


@pytest.mark.integration
def test_metrics_address_in_use_is_one_line_exit_2(example, make_broker):
    import socket

    from boxwatch.commands.console import EXIT_USAGE

    broker = make_broker("noida").start()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        proc = subprocess.run(
            [
                PYTHON,
                "-m",
                "boxwatch",
                "agent",
                "--artifact",
                str(example.artifact),
                "--public-key",
                str(example.public_key),
                "--model",
                str(example.model),
                "--bootstrap-servers",
                broker.bootstrap_servers,
                "--create-topics",
                "--metrics-address",
                f"127.0.0.1:{taken.getsockname()[1]}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        taken.close()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == EXIT_USAGE, proc.stderr[-2000:]
    errors = [ln for ln in lines if "error" in ln.lower()]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert errors[0] == lines[-1] and "already in use" in errors[0], proc.stderr[-2000:]


@pytest.mark.slow
def test_hostile_artifacts_stop_the_agent_at_start(example, tmp_path):
    """Each hostile candidate given at start: exit 1, one line on stderr, no traceback, no
    hang (a FIFO is refused unopened)."""
    paths = {}
    for name, candidate in hostile_candidates(example, tmp_path).items():
        paths[name] = path = tmp_path / f"start-{name}.bwa"
        if callable(candidate):
            candidate(path)
        else:
            path.write_bytes(candidate)
    refusals_at_start(example, paths)
