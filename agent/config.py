"""The agent's settings: one table of names, YAML keys, ``BOXWATCH_*`` variables and defaults.

Precedence: command-line argument > ``BOXWATCH_*`` environment variable > YAML file >
default. ``docs/agent-config.md`` is generated from :data:`SETTINGS` (and a test keeps it
true). Ranges are checked at start-up; every problem is reported at once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import load_yaml, load_yaml_file, quote, show_path
from boxwatch.agent.kafka.clients import LIBRARIES, libraries_text
from boxwatch.agent.vocab import BOX_KERNELS, GATE_ACTIONS, GATE_OUTCOMES


def _str(v: Any) -> str:
    if not isinstance(v, str | int | float) or isinstance(v, bool):
        raise ValueError("expected a string")
    return str(v)


def _opt_str(v: Any) -> str | None:
    return None if v in (None, "") else _str(v)


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("expected an integer")
    return int(v)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _list(v: Any) -> list[str]:
    if isinstance(v, str):
        return [s.strip() for s in v.split(",") if s.strip()]
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return list(v)
    raise ValueError("expected a list of strings (or a comma-separated string)")


def _dict(v: Any) -> dict[str, Any]:
    if v in (None, ""):
        return {}
    if isinstance(v, str):
        v = load_yaml(v, where="the value")
    if not isinstance(v, dict):
        raise ValueError("expected a mapping")
    return dict(v)


@dataclass(frozen=True)
class Setting:
    """One setting: dotted YAML key, environment variable, parser, default, range check."""

    key: str
    env: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def _port_address(v: str) -> str | None:
    host, sep, port = v.rpartition(":")
    if not sep or not host or not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
        return "must be HOST:PORT (port 0 picks a free one)"
    return None


def _library(v: str) -> str | None:
    return None if v in LIBRARIES else f"must be {' or '.join(LIBRARIES)}"


def _box_kernel(v: str) -> str | None:
    kernels = ("auto", *BOX_KERNELS)
    return None if v in kernels else f"must be {', '.join(kernels[:-1])} or {kernels[-1]}"


def _policy(v: dict) -> str | None:
    bad = {k: t for k, t in v.items() if k not in GATE_OUTCOMES or t not in GATE_ACTIONS}
    return (
        f"entries {bad} must map {'/'.join(GATE_OUTCOMES)} to {'/'.join(GATE_ACTIONS)}"
        if bad
        else None
    )


SETTINGS: tuple[Setting, ...] = (
    Setting("artifact", "BOXWATCH_ARTIFACT", _str, None, "Path of the signed artifact."),
    Setting(
        "public_keys",
        "BOXWATCH_PUBLIC_KEYS",
        _list,
        None,
        "Trusted public key files (PEM); several during key rotation.",
    ),
    Setting(
        "model",
        "BOXWATCH_MODEL",
        _opt_str,
        None,
        "Model file; its digest must equal the artifact's. Needed when the artifact "
        "monitors a model.",
    ),
    Setting(
        "allow_rollback",
        "BOXWATCH_ALLOW_ROLLBACK",
        _bool,
        False,
        "Accept a reloaded artifact older than the running one.",
    ),
    Setting(
        "reload.timeout_s",
        "BOXWATCH_RELOAD_TIMEOUT_S",
        _int,
        60,
        "Seconds a reload (SIGHUP) may take to verify and load the new artifact. It loads "
        "in its own thread while the loop keeps monitoring with the running artifact and "
        "/metrics and /healthz keep answering; a candidate not loaded in time is refused "
        '(`boxwatch_agent_artifact_reloads_total{result="timeout"}`, one log line) and '
        "what it returns later is dropped. Another SIGHUP waits for that load to end.",
        _positive,
    ),
    Setting(
        "kafka.bootstrap_servers",
        "BOXWATCH_BOOTSTRAP_SERVERS",
        _str,
        "127.0.0.1:9092",
        "Kafka bootstrap servers, comma-separated.",
    ),
    Setting(
        "kafka.group_id",
        "BOXWATCH_GROUP_ID",
        _str,
        "boxwatch-agent",
        "Consumer group; replicas sharing it split the partitions.",
    ),
    Setting(
        "kafka.library",
        "BOXWATCH_KAFKA_LIBRARY",
        _str,
        "kafka-python",
        f"Kafka client library: {libraries_text()}.",
        _library,
    ),
    Setting(
        "kafka.client",
        "BOXWATCH_KAFKA_CLIENT",
        _dict,
        {},
        "Extra client options passed through unchanged, named as the chosen library "
        "names them: kafka-python (security_protocol, sasl_mechanism, "
        "sasl_plain_username, ssl_cafile, ...) or librdkafka (security.protocol, "
        "sasl.mechanisms, sasl.username, ssl.ca.location, ...).",
    ),
    Setting(
        "kafka.create_topics",
        "BOXWATCH_CREATE_TOPICS",
        _bool,
        False,
        "Create missing topics at start instead of refusing to start.",
    ),
    Setting(
        "kafka.startup_timeout_s",
        "BOXWATCH_KAFKA_STARTUP_TIMEOUT_S",
        _int,
        30,
        "Seconds the agent keeps trying to reach a bootstrap server at start. The first "
        "failed try is said at once (with this window); when the window ends the agent "
        "exits 2. Outages after start are retried for as long as they last.",
        _positive,
    ),
    Setting(
        "kafka.partitions",
        "BOXWATCH_TOPIC_PARTITIONS",
        _int,
        1,
        "Partitions for topics the agent creates.",
        _positive,
    ),
    Setting(
        "topics.inputs",
        "BOXWATCH_TOPIC_INPUTS",
        _opt_str,
        "boxwatch.inputs",
        "Model-input topic (empty: no model inputs). Used only when the artifact monitors a model.",
    ),
    Setting(
        "topics.bn_inputs",
        "BOXWATCH_TOPIC_BN_INPUTS",
        _opt_str,
        None,
        "BN-record topic (empty: no BN records). Used only when the artifact holds a BN.",
    ),
    Setting(
        "topics.verdicts",
        "BOXWATCH_TOPIC_VERDICTS",
        _str,
        "boxwatch.verdicts",
        "Verdict topic: one record per model input. Required (and created) only when the "
        "artifact monitors a model.",
    ),
    Setting(
        "topics.gate",
        "BOXWATCH_TOPIC_GATE",
        _str,
        "boxwatch.gate",
        "Gate topic: one record per BN record. Required (and created) only when the artifact "
        "holds a BN.",
    ),
    Setting(
        "topics.dead_letter",
        "BOXWATCH_TOPIC_DEAD_LETTER",
        _str,
        "boxwatch.dead-letter",
        "Dead-letter topic for malformed records, with the reason.",
    ),
    Setting(
        "topics.capture",
        "BOXWATCH_TOPIC_CAPTURE",
        _opt_str,
        None,
        "Optional topic receiving a copy of rejected and uncertain inputs.",
    ),
    Setting(
        "topics.release",
        "BOXWATCH_TOPIC_RELEASE",
        _opt_str,
        None,
        "Optional topic for BN records the gate policy releases.",
    ),
    Setting(
        "topics.review",
        "BOXWATCH_TOPIC_REVIEW",
        _opt_str,
        None,
        "Optional topic for BN records the gate policy sends to review.",
    ),
    Setting(
        "gate_policy",
        "BOXWATCH_GATE_POLICY",
        _dict,
        {"certified": "release", "blocked": "review", "unverified": "review"},
        "Gate outcome -> release / review / none.",
        _policy,
    ),
    Setting(
        "batch.max_records",
        "BOXWATCH_BATCH_MAX_RECORDS",
        _int,
        256,
        "Most records in one micro-batch.",
        _positive,
    ),
    Setting(
        "batch.max_wait_ms",
        "BOXWATCH_BATCH_MAX_WAIT_MS",
        _int,
        20,
        "Longest wait to fill a micro-batch, in milliseconds.",
        _positive,
    ),
    Setting(
        "dead_letter.store_payload",
        "BOXWATCH_DLQ_STORE_PAYLOAD",
        _bool,
        True,
        "Copy the original bytes into dead letters; false stores only their sha256 "
        "(dead letters can hold personal data).",
    ),
    Setting(
        "max_record_bytes",
        "BOXWATCH_MAX_RECORD_BYTES",
        _int,
        1 << 20,
        "Records larger than this go to the dead-letter topic.",
        _positive,
    ),
    Setting(
        "max_output_bytes",
        "BOXWATCH_MAX_OUTPUT_BYTES",
        _int,
        990_000,
        "Outputs whose key, value and headers exceed this (dead letters and copies of "
        "large records) are sent as a digest stub (sha256 and size, "
        "`boxwatch-payload-omitted: true`) instead; keep it below the producer's and the "
        "broker's maximum message size. An output the broker still refuses is retried "
        "a few times, then sent as a stub, then dropped and counted.",
        _positive,
    ),
    Setting(
        "box_kernel",
        "BOXWATCH_BOX_KERNEL",
        _str,
        "auto",
        "Box-test implementation: `auto` (the native C kernel when it was built at "
        "install time, else numpy), `native` (refuse to start without it) or `numpy`. "
        "Both decide identically; `boxwatch_agent_build_info{box_kernel}` says which runs.",
        _box_kernel,
    ),
    Setting(
        "inference_threads",
        "BOXWATCH_INFERENCE_THREADS",
        _int,
        1,
        "onnxruntime intra-op threads (1 keeps p99 latency low).",
        _positive,
    ),
    Setting(
        "metrics.address",
        "BOXWATCH_METRICS_ADDRESS",
        _str,
        "127.0.0.1:9108",
        "HOST:PORT of /metrics, /healthz, /readyz and the status page. Loopback by "
        "default; use 0.0.0.0:9108 in a container.",
        _port_address,
    ),
    Setting(
        "metrics.request_timeout_s",
        "BOXWATCH_METRICS_REQUEST_TIMEOUT_S",
        _int,
        5,
        "Seconds an HTTP client has to send its whole request line and headers, however "
        "slowly they trickle in, and then again to take its answer; the connection is "
        "closed at either deadline.",
        _positive,
    ),
    Setting(
        "metrics.max_connections",
        "BOXWATCH_METRICS_MAX_CONNECTIONS",
        _int,
        128,
        "HTTP connections open at once. At the cap a new connection closes the oldest one "
        "still sending its request (once it has been open 0.1 s), so idle or trickling "
        "clients cannot keep a scraper or a liveness probe out; one thread serves them all.",
        _positive,
    ),
    Setting(
        "shutdown_timeout_s",
        "BOXWATCH_SHUTDOWN_TIMEOUT_S",
        _int,
        10,
        "Seconds from a stop request (SIGTERM, SIGINT) to exit: finishing the batch in "
        "hand (at most 30% of it; a delivery still unanswered then is abandoned, not "
        "committed, and comes again after restart), committing and closing all fit "
        "within it.",
        _positive,
    ),
)
_BY_KEY = {s.key: s for s in SETTINGS}


def _dig(raw: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _known_keys(raw: Mapping[str, Any], prefix: str = "") -> list[str]:
    unknown = []
    for k, v in raw.items():
        dotted = f"{prefix}{k}"
        if dotted in _BY_KEY:
            continue
        if isinstance(v, Mapping) and any(s.startswith(f"{dotted}.") for s in _BY_KEY):
            unknown += _known_keys(v, f"{dotted}.")
        else:
            unknown.append(dotted)
    return unknown


@dataclass(frozen=True)
class AgentConfig:
    """Resolved settings by dotted key; ``source`` says where each value came from."""

    values: dict[str, Any]
    source: dict[str, str]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def replace(self, **overrides: Any) -> AgentConfig:
        """A copy with some dotted keys replaced (use ``__`` for dots in keyword names)."""
        values = dict(self.values)
        for k, v in overrides.items():
            values[k.replace("__", ".")] = v
        return AgentConfig(values, self.source)


# Settings naming files: relative paths written in the YAML file resolve against the file's
# folder (as the build config's do); from the environment or the command line, against the
# working directory.
_FILE_KEYS = frozenset({"artifact", "public_keys", "model"})


def _against(folder: Path, value: Any) -> Any:
    """``value`` (a path, a list of paths or None) with relative paths made relative to
    ``folder``."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_against(folder, v) for v in value]
    p = Path(value)
    return str(p if p.is_absolute() else folder / p)


def load_agent_config(
    path: str | Path | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> AgentConfig:
    """Resolve every setting; raise :class:`ConfigError` listing all problems."""
    environ = os.environ if environ is None else environ
    raw: Mapping[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = show_path(path)
        raw = load_yaml_file(path, what="agent config file") or {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: the agent config must be a YAML mapping")
    problems = [f"{where}: unknown setting {quote(k)}" for k in _known_keys(raw)]
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    overrides = overrides or {}
    for s in SETTINGS:
        if overrides.get(s.key) is not None:
            value, origin = overrides[s.key], "argument"
        elif s.env in environ:
            value, origin = environ[s.env], f"${s.env}"
        else:
            found, value = _dig(raw, s.key)
            origin = f"{where}:{s.key}" if found else "default"
            if not found:
                values[s.key], source[s.key] = s.default, origin
                continue
        try:
            parsed = s.parse(value)
        except (ValueError, TypeError, OverflowError) as exc:
            problems.append(f"{s.key} from {origin}: {exc} (got {quote(value)})")
            continue
        if s.check is not None and parsed is not None and (msg := s.check(parsed)):
            problems.append(f"{s.key} from {origin}: {msg} (got {quote(value)})")
            continue
        if origin.startswith(f"{where}:") and s.key in _FILE_KEYS and path is not None:
            parsed = _against(Path(path).parent, parsed)
        values[s.key], source[s.key] = parsed, origin
    for required in ("artifact", "public_keys"):
        if not problems and not values.get(required):
            env = _BY_KEY[required].env
            problems.append(f"{required} is required (YAML key, ${env} or command-line option)")
    if problems:
        raise ConfigError(problems)
    return AgentConfig(values, source)


def reference_markdown() -> str:
    """The settings table of ``docs/agent-config.md``."""
    lines = ["| YAML key | environment variable | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = (
            "(required)"
            if s.key in ("artifact", "public_keys")
            else ("-" if s.default in (None, {}, "") else f"`{s.default}`")
        )
        lines.append(f"| `{s.key}` | `{s.env}` | {default} | {s.help} |")
    return "\n".join(lines)
