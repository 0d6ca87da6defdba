"""``boxwatch agent``: verify the artifact, check topics, then monitor the stream."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from boxwatch.agent.boxes import box_kernel
from boxwatch.agent.config import AgentConfig, load_agent_config
from boxwatch.agent.errors import ArtifactError, ConfigError, KeyFileError
from boxwatch.agent.inputs import one_line
from boxwatch.agent.service import build_agent, serve
from boxwatch.commands.console import EXIT_FAILED, EXIT_USAGE, VerbExit, fail

log = logging.getLogger("boxwatch.agent")


def _overrides(**kw: Any) -> dict[str, Any]:
    names = {
        "artifact": "artifact",
        "public_keys": "public_keys",
        "model": "model",
        "bootstrap_servers": "kafka.bootstrap_servers",
        "group_id": "kafka.group_id",
        "metrics_address": "metrics.address",
    }
    out = {names[k]: v for k, v in kw.items() if k in names and v not in (None, ())}
    if "public_keys" in out:
        out["public_keys"] = list(out["public_keys"])
    if kw.get("create_topics"):
        out["kafka.create_topics"] = True
    return out


def _require_files(cfg: AgentConfig) -> None:
    """A missing artifact, key or model file is a usage error (exit 2), as in every verb.

    An artifact or key that exists but does not verify is a refusal (exit 1).
    """
    named = [("artifact", cfg["artifact"]), *(("public key", k) for k in cfg["public_keys"])]
    if cfg["model"]:
        named.append(("model", cfg["model"]))
    missing = [f"{path}: no such {what} file" for what, path in named if not Path(path).exists()]
    if missing:
        raise ConfigError(missing)


@click.command()
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Agent config YAML (see docs/agent-config.md).",
)
@click.option("--artifact", help="Signed artifact path [$BOXWATCH_ARTIFACT].")
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    help="Trusted public key; repeat for rotation [$BOXWATCH_PUBLIC_KEYS].",
)
@click.option("--model", help="Model file, checked against the artifact [$BOXWATCH_MODEL].")
@click.option("--bootstrap-servers", help="Kafka bootstrap servers [$BOXWATCH_BOOTSTRAP_SERVERS].")
@click.option("--group-id", help="Consumer group [$BOXWATCH_GROUP_ID].")
@click.option(
    "--metrics-address", help="HOST:PORT for /metrics and health [$BOXWATCH_METRICS_ADDRESS]."
)
@click.option("--create-topics", is_flag=True, help="Create missing topics instead of failing.")
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level.")
def agent(config_path: Path | None, verbose: bool, **options: Any) -> None:
    """Monitor a Kafka stream with a verified artifact.

    Starts only when the artifact's signature and digests verify against a trusted key, the
    model file's digest equals the artifact's, and every configured topic exists. Then it
    consumes inputs in micro-batches, emits one verdict (or gate record) per input, sends
    malformed records to the dead-letter topic, commits offsets after delivery, and serves
    /metrics, /healthz, /readyz and a status page. SIGTERM/SIGINT: finish the batch and stop;
    SIGHUP: reload the artifact beside the loop (verified first, within reload.timeout_s;
    the old one stays on failure).

    \b
    Example:
      boxwatch agent --artifact model.bwa --public-key ci.pub --model model.onnx \\
          --bootstrap-servers kafka:9092
    Exit codes: 0 stopped cleanly; 1 artifact refused; 2 configuration or topic error, or a
    missing artifact, key or model file; 3 the configured Kafka library (kafka.library) is
    not installed; 70 internal error.
    """
    with contextlib.suppress(OSError, ValueError):  # stderr without a file descriptor
        faulthandler.enable()  # a native crash (onnxruntime, librdkafka) leaves its stacks
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # The client libraries' own log lines (kafka-python's connection retries) only with -v:
    # what the agent says about the broker is enough otherwise.
    logging.getLogger("kafka").setLevel(logging.INFO if verbose else logging.CRITICAL + 1)
    try:
        cfg = load_agent_config(config_path, overrides=_overrides(**options))
        _require_files(cfg)
        worker = build_agent(cfg)
        worker.check_topics()
        http = serve(worker)  # a metrics address in use is a ConfigError: one line, exit 2
    except (ArtifactError, KeyFileError) as exc:
        raise VerbExit(EXIT_FAILED, (one_line(f"error: refusing to start: {exc}"),)) from exc
    except ConfigError as exc:
        fail(exc, EXIT_USAGE)
    log.info(
        "agent ready: artifact %s, box tests %s, metrics on http://%s/metrics",
        worker.runtime.artifact_id,
        box_kernel(),
        http.address,
    )
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        signal.signal(signal.SIGINT, lambda *_: worker.stop())
        signal.signal(signal.SIGHUP, lambda *_: worker.request_reload())
    gc.collect()
    gc.freeze()  # the loaded model, artifact and boxes leave the GC's scans: shorter pauses
    try:
        worker.run()
    except ConfigError as exc:  # a client option refused when the clients are made
        fail(exc, EXIT_USAGE)
    finally:
        http.stop()
    log.info("agent stopped")
