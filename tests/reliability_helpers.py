"""Shared parts of the reliability tests: the agent as a real subprocess, a streaming
producer thread, an output collector, and re-signed variants of the example artifact.

Also imported by ``bench/soak.py`` (it puts ``tests/`` on ``sys.path``). Every wait here
is bounded; every process started here is stopped by its owner.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer
from kafka_helpers import create_topics
from locations import ROOT

from boxwatch.agent.artifact import build_artifact_bytes, load_artifact, write_artifact
from boxwatch.agent.keys import load_private_key, load_trusted_keys
from boxwatch.agent.records import TENSOR_TYPE
from boxwatch.commands.console import EXIT_FAILED
from boxwatch.embedded_broker import free_loopback_port

if TYPE_CHECKING:
    from boxwatch.offline.release.records import BuildSummary

PYTHON = sys.executable
TOPICS = {
    "inputs": "r.inputs",
    "bn_inputs": "r.credit",
    "verdicts": "r.verdicts",
    "gate": "r.gate",
    "dead_letter": "r.dlq",
}
MODEL_TOPICS = {k: v for k, v in TOPICS.items() if k != "bn_inputs"}
"""``TOPICS`` of an agent that reads model inputs only."""
# Fast group join for the test clients (FACTS.md).
FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def shared_example(tmp_path_factory: Any):
    """The example artifact, built once per test session (a file lock guards the build)."""
    from example_build import build_example

    root = tmp_path_factory.getbasetemp() / "reliability-example"
    done = root / "built.json"
    lock = root.with_suffix(".lock")
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        import fcntl

        fcntl.flock(fh, fcntl.LOCK_EX)
        if not done.exists():
            example = build_example(root)
            done.write_text(json.dumps({"artifact": str(example.artifact)}))
            return example
    from example_build import ExampleArtifact

    return ExampleArtifact(
        root / "example.bwa",
        root / "keys" / "test.key",
        root / "keys" / "test.pub",
        _example_model(),
        root / "build.yaml",
        root / "data",
        cast("BuildSummary", {}),  # not kept across processes; no caller reads .summary
    )


def _example_model() -> Path:
    from boxwatch.examples import example_path

    return example_path("digits", "model.onnx")


def resign(
    source: Path,
    private_key: Path,
    out: Path,
    *,
    created_at: int,
    manifest_changes: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``source``'s members as a new artifact signed by ``private_key`` at ``created_at``.

    ``manifest_changes`` replaces the ``model`` / ``config`` / ``contents`` sections (e.g. a
    wrong model digest): a validly signed artifact that must still be refused.
    """
    art = load_artifact(source, None)
    m = {**art.manifest, **(manifest_changes or {})}
    members = {n: b for n, b in art.members.items()}
    data = build_artifact_bytes(
        members,
        private_key=load_private_key(private_key),
        created_at=created_at,
        model=m.get("model"),
        config=m.get("config"),
        contents=m.get("contents"),
    )
    write_artifact(out, data)
    return out


def artifact_id(path: Path, public_key: Path) -> str:
    """The id of a valid artifact (checked against ``public_key``)."""
    return load_artifact(path, load_trusted_keys([str(public_key)])).artifact_id


# -- records --------------------------------------------------------------------------------
def tensor_record(rid: str, row: np.ndarray) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A binary float32 model input with its id in a header."""
    return (
        np.asarray(row, dtype="<f4").tobytes(),
        [("content-type", TENSOR_TYPE.encode()), ("id", rid.encode()), ("dtype", b"float32")],
    )


def stream_rows(example: Any, n: int, seed: int = 0) -> np.ndarray:
    """``n`` model inputs drawn from the example's known and unknown inputs."""
    data = np.load(example.data / "stream.npz")
    pool = np.concatenate([data["x_known"], data["x_unknown"]])
    return pool[np.random.default_rng(seed).integers(0, len(pool), n)]


def keyed_records(example: Any, n: int, prefix: str, seed: int) -> list[tuple[bytes, bytes, list]]:
    """``n`` :func:`stream_rows` as (key, value, headers) binary records; id and key ``PREFIXi``."""
    out = []
    for i, row in enumerate(stream_rows(example, n, seed=seed)):
        value, headers = tensor_record(f"{prefix}{i}", row)
        out.append((f"{prefix}{i}".encode(), value, headers))
    return out


def create_model_topics(bootstrap: str, partitions: int = 2) -> None:
    """Create the topics of a model-input agent on ``TOPICS``: inputs and verdicts with
    ``partitions`` partitions, dead letters and gate records with one."""
    create_topics(
        bootstrap,
        {
            TOPICS["inputs"]: partitions,
            TOPICS["verdicts"]: partitions,
            TOPICS["dead_letter"]: 1,
            TOPICS["gate"]: 1,
        },
    )


# -- the agent as a subprocess -------------------------------------------------------------------
def write_agent_config(
    path: Path,
    example: Any,
    bootstrap: str,
    *,
    group_id: str = "rel",
    topics: Mapping[str, str] = TOPICS,
    **settings: Any,
) -> Path:
    """A YAML agent config for ``example``; dotted ``settings`` keys use ``__`` for dots."""
    raw: dict[str, Any] = {
        "artifact": str(example.artifact),
        "public_keys": [str(example.public_key)],
        "model": str(example.model),
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group_id},
        "topics": dict(topics),
        "metrics": {"address": f"127.0.0.1:{free_loopback_port()}"},
    }
    for key, value in settings.items():
        node = raw
        parts = key.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def refusals_at_start(
    example: Any, artifacts: Mapping[str, Path], *, within: float | None = None
) -> dict[str, str]:
    """Start ``boxwatch agent`` on each artifact at once; name -> its one line on stderr.

    Each must exit 1 (within ``within`` seconds of its start, where given; a hang is 120 s)
    with one line, ``error: refusing to start: ...``, and no traceback (the artifact is
    checked before any broker is reached).
    """
    procs = {}
    for name, path in artifacts.items():
        args = [PYTHON, "-m", "boxwatch", "agent", "--artifact", str(path)]
        args += ["--public-key", str(example.public_key), "--model", str(example.model)]
        args += ["--bootstrap-servers", "127.0.0.1:1", "--metrics-address", "127.0.0.1:0"]
        procs[name] = (
            time.monotonic(),
            subprocess.Popen(
                args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            ),
        )
    refusals = {}
    for name, (t0, proc) in procs.items():
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"{name}: the agent hangs at start")
        lines = err.strip().splitlines()
        assert proc.returncode == EXIT_FAILED, (name, proc.returncode, err[-2000:])
        assert "Traceback" not in err and len(lines) == 1, (name, err[-2000:])
        assert lines[0].startswith("error: refusing to start:"), (name, err)
        assert within is None or time.monotonic() - t0 < within, name
        refusals[name] = lines[0]
    return refusals


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition as {series: value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class AgentProcess:
    """``python -m boxwatch agent -c CONFIG`` as a child process, restartable after a kill.

    stderr of every start is appended to ``log_path``. :meth:`rss_bytes` / :meth:`peak_rss_bytes`
    read ``/proc/PID/status`` of the agent itself.
    """

    def __init__(
        self,
        config: Path,
        log_path: Path,
        *,
        verbose: bool = False,
        env: Mapping[str, str] | None = None,
        extra_args: Iterable[str] = (),
    ) -> None:
        self.config = config
        self.log_path = log_path
        raw = yaml.safe_load(config.read_text())
        self.metrics_address = raw["metrics"]["address"]
        self.args = [PYTHON, "-m", "boxwatch", "agent", "-c", str(config), *extra_args]
        if verbose:
            self.args.append("-v")
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> AgentProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=ROOT,
                env=self.env,
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds until ``/readyz`` answers 200; raises with the log tail otherwise."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if not self.alive:
                assert self.proc is not None, "wait_ready before start"
                raise AssertionError(f"agent exited ({self.proc.returncode}):\n{self.log_tail()}")
            if self.readyz() == 200:
                return time.monotonic() - t0
            time.sleep(0.1)
        raise AssertionError(f"agent not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def readyz(self) -> int | None:
        """HTTP status of ``/readyz``, or None when the server does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.metrics_address}/readyz", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, urllib.error.URLError):
            return None

    def scrape(self) -> dict[str, float]:
        """``/metrics`` as {series: value}; {} when the server does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=3) as r:
                text = r.read().decode()
        except (OSError, urllib.error.URLError):
            return {}
        return parse_metrics(text)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the agent and reap it."""
        if self.proc is not None:
            if self.alive:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait ``timeout`` s (then SIGKILL); returns the exit code."""
        if self.proc is None:
            return None
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def _status_kb(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"{field} not in /proc/{self.pid}/status")

    def rss_bytes(self) -> int:
        return self._status_kb("VmRSS") * 1024

    def peak_rss_bytes(self) -> int:
        return self._status_kb("VmHWM") * 1024

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])


# -- producing and collecting ----------------------------------------------------------------------
def agent_process(
    folder: Path, name: str, example: Any, bootstrap: str, **settings: Any
) -> AgentProcess:
    """An unstarted agent on ``write_agent_config``'s FOLDER/NAME.yaml for ``example`` on
    ``bootstrap`` (``settings`` as there); its stderr goes to FOLDER/NAME.log."""
    config = write_agent_config(folder / f"{name}.yaml", example, bootstrap, **settings)
    return AgentProcess(config, folder / f"{name}.log")


class StreamProducer(threading.Thread):
    """Sends ``records`` (key, value, headers) at about ``rate`` per second, retrying failures.

    A record whose delivery fails (broker down) is sent again until ``deadline_s``: inputs
    are produced at least once. ``hold`` (an Event) pauses sending while set.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        records: list[tuple[bytes | None, bytes, list]],
        *,
        rate: float | None = None,
        chunk: int = 200,
        deadline_s: float = 300.0,
        topic_of: Callable[[int], str] | None = None,
    ) -> None:
        super().__init__(daemon=True, name="stream-producer")
        self.bootstrap, self.topic, self.records = bootstrap, topic, records
        self.rate, self.chunk, self.deadline_s = rate, chunk, deadline_s
        self.topic_of = topic_of
        self.sent = 0
        self.retried = 0
        self.error: BaseException | None = None
        self.hold = threading.Event()
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced by the test through .error
            self.error = exc

    def _run(self) -> None:
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            linger_ms=5,
            max_block_ms=5000,
            request_timeout_ms=5000,
            retries=3,
            delivery_timeout_ms=12_000,
            # kafka-python 3's idempotent producer can stay stuck after
            # a batch expires during an outage; failed sends are re-sent
            # here instead (inputs at least once).
            enable_idempotence=False,
        )
        t0 = time.monotonic()
        deadline = t0 + self.deadline_s
        try:
            i = 0
            while i < len(self.records) and not self.stop_event.is_set():
                while self.hold.is_set() and not self.stop_event.wait(0.05):
                    pass
                idx = list(range(i, min(i + self.chunk, len(self.records))))
                while idx:
                    if time.monotonic() > deadline or self.stop_event.is_set():
                        raise TimeoutError(f"could not deliver {len(idx)} inputs in time")
                    idx = self._send(producer, idx)
                    if idx:
                        self.retried += len(idx)
                        self.stop_event.wait(0.5)
                i += self.chunk
                self.sent = min(i, len(self.records))
                if self.rate:
                    ahead = self.sent / self.rate - (time.monotonic() - t0)
                    if ahead > 0:
                        self.stop_event.wait(ahead)
        finally:
            producer.close(timeout=5)

    def _send(self, producer: KafkaProducer, idx: list[int]) -> list[int]:
        futures = []
        failed = []
        for j in idx:
            key, value, headers = self.records[j]
            topic = self.topic_of(j) if self.topic_of else self.topic
            try:
                futures.append((j, producer.send(topic, value=value, key=key, headers=headers)))
            except Exception:
                failed.append(j)
        try:
            producer.flush(timeout=15)
        except Exception:
            pass
        for j, fut in futures:
            try:
                fut.get(timeout=0.1)
            except Exception:
                failed.append(j)
        return sorted(failed)


class OutputCollector(threading.Thread):
    """Reads ``topics`` from the beginning (no group) and counts what arrived.

    ``ids[topic]`` counts JSON output ids (verdicts, gate records); ``keys[topic]`` counts
    record keys; ``records[topic]`` keeps (key, headers, value) when ``keep`` names the topic.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Iterable[str],
        *,
        keep: Iterable[str] = (),
        json_topics: Iterable[str] = (),
    ) -> None:
        super().__init__(daemon=True, name="output-collector")
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.keep, self.json_topics = set(keep), set(json_topics)
        self.ids: dict[str, Counter] = {t: Counter() for t in self.topics}
        self.keys: dict[str, Counter] = {t: Counter() for t in self.topics}
        self.records: dict[str, list] = {t: [] for t in self.topics}
        self.values: dict[str, list] = {t: [] for t in self.topics}
        self.count = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()

    @classmethod
    def of_verdicts(cls, bootstrap: str) -> OutputCollector:
        """A collector of the verdict topic of ``TOPICS``, counting verdict ids."""
        return cls(bootstrap, [TOPICS["verdicts"]], json_topics=[TOPICS["verdicts"]])

    def run(self) -> None:
        consumer = None
        try:
            consumer = KafkaConsumer(
                *self.topics,
                bootstrap_servers=self.bootstrap,
                group_id=None,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                metadata_max_age_ms=2000,
                request_timeout_ms=10_000,
            )
            while not self._halt.is_set():
                for batch in consumer.poll(timeout_ms=200, max_records=2000).values():
                    with self._lock:
                        for r in batch:
                            self._add(r)
        except BaseException as exc:  # surfaced by the test through .error
            self.error = exc
        finally:
            if consumer is not None:
                consumer.close()

    def _add(self, r: Any) -> None:
        self.count += 1
        if r.key is not None:
            self.keys[r.topic][r.key.decode("utf-8", "replace")] += 1
        if r.topic in self.json_topics:
            body = json.loads(r.value)
            self.ids[r.topic][str(body["id"])] += 1
            self.values[r.topic].append(body)
        if r.topic in self.keep:
            self.records[r.topic].append((r.key, dict(r.headers or []), r.value))

    def wait_for(self, done: Callable[[OutputCollector], bool], timeout: float) -> bool:
        """Poll ``done(self)`` under the lock until true or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise self.error
            with self._lock:
                if done(self):
                    return True
            time.sleep(0.2)
        with self._lock:
            return done(self)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)
