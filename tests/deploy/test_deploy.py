"""deploy/: the Dockerfile, compose stack, Kubernetes manifests, systemd unit and release
workflow parse, carry their required fields, agree with each other, and invoke only
commands and options the package really has.

Docker, Kubernetes and GitHub Actions are not available here: what runs is the package
side (the console script, the agent's config loader, the healthcheck against a live
agent, the key-handling step of the workflow, ``systemd-analyze verify``, ``kubectl
kustomize`` when present).
"""

from __future__ import annotations

import functools
import http.server
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from locations import ROOT

from boxwatch.agent.config import load_agent_config
from boxwatch.cli import cli

REPO = ROOT
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
KEDA = DEPLOY / "k8s-keda"
AGENT_CONFIG = "/etc/boxwatch/agent.yaml"
ENTRYPOINT = ["boxwatch", "agent", "-c", AGENT_CONFIG]


# -- helpers ------------------------------------------------------------------------------
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def k8s_docs() -> dict[str, dict[str, Any]]:
    """Every manifest of deploy/k8s by kind (one object of each kind)."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in docs, f"two {doc['kind']} objects"
            docs[doc["kind"]] = {**doc, "_file": path.name}
    return docs


def keda_scaled_object() -> dict[str, Any]:
    """The ScaledObject of the KEDA overlay (deploy/k8s-keda)."""
    (doc,) = yaml.safe_load_all((KEDA / "scaledobject.yaml").read_text())
    assert doc["kind"] == "ScaledObject"
    return doc


def systemd_unit(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` -> values (systemd allows a key several times)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def volume(spec: str) -> tuple[str, str]:
    """(source, target) of a compose volume ``SRC:DST[:MODE]``; SRC may be ``${VAR:-default}``."""
    m = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::\w+)?", spec)
    assert m, f"unparsable volume {spec!r}"
    return m.group(1), m.group(2)


def workflow() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "ci" / "release.yml").read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def check_boxwatch_command(argv: list[str], where: str) -> None:
    """``argv`` runs ``boxwatch VERB [options]``: VERB exists and knows every option given."""
    assert Path(argv[0]).name == "boxwatch", f"{where}: {argv}"
    verb = argv[1]
    result = CliRunner().invoke(cli, [verb, "--help"])
    assert result.exit_code == 0, f"{where}: 'boxwatch {verb} --help' failed: {result.output}"
    for token in argv[2:]:
        if token.startswith("-"):
            option = token.split("=", 1)[0]
            assert re.search(rf"(^|[\s,]){re.escape(option)}\b", result.output), (
                f"{where}: 'boxwatch {verb}' has no option {option}"
            )


def workflow_commands() -> list[list[str]]:
    """Every ``boxwatch ...`` command line in the workflow's run steps."""
    out = []
    for job in workflow()["jobs"].values():
        for step in job["steps"]:
            for line in step.get("run", "").splitlines():
                line = line.strip()
                if line.startswith("boxwatch "):
                    out.append(shlex.split(line))
    return out


# -- Dockerfile ---------------------------------------------------------------------------
def test_dockerfile_is_multi_stage_slim_non_root_with_healthcheck():
    instr = dockerfile()
    froms = [args for word, args in instr if word == "FROM"]
    assert len(froms) >= 2 and all(" AS " in f.upper() for f in froms)
    args = dict(a.split("=", 1) for w, a in instr if w == "ARG" and "=" in a)
    assert "slim" in args["PYTHON_IMAGE"]
    final = instr[max(i for i, (w, _) in enumerate(instr) if w == "FROM") :]
    users = [a for w, a in final if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert any(w == "COPY" and a.startswith("--from=build") for w, a in final)
    health = " ".join(a for w, a in final if w == "HEALTHCHECK")
    assert "/healthz" in health and "CMD" in health
    entry = [a for w, a in final if w == "ENTRYPOINT"]
    assert json.loads(entry[-1]) == ENTRYPOINT
    env = " ".join(a for w, a in final if w == "ENV")
    assert "BOXWATCH_METRICS_ADDRESS=0.0.0.0:9108" in env
    assert ("EXPOSE", "9108") in final


def test_dockerfile_installs_the_package_without_the_offline_extra():
    instr = dockerfile()
    runs = " ".join(a for w, a in instr if w == "RUN")
    # The package itself, with the confluent extra at most: never the builder's.
    assert re.search(r"pip install (\.|\"\.\[confluent\]\")(\s|$)", runs), runs
    assert "[offline" not in runs and "torch" not in runs
    for word, args in instr:
        if word == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert (REPO / src).exists(), f"COPY source {src} missing from the repository"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for word, args in instr:
        if word == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert f"!{src}" in ignore, f"{src} is excluded by the .dockerignore"


def test_console_script_and_agent_verb_exist():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["boxwatch"] == "boxwatch.cli:main"
    installed = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
    }
    assert installed.get("boxwatch") == "boxwatch.cli:main"
    check_boxwatch_command(ENTRYPOINT, "Dockerfile ENTRYPOINT")


@pytest.mark.integration
def test_installed_console_script_runs_agent_help():
    exe = Path(sys.executable).with_name("boxwatch")
    exe = exe if exe.exists() else Path(shutil.which("boxwatch") or "boxwatch")
    result = subprocess.run(
        [str(exe), "agent", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "-c, --config" in result.stdout


@pytest.mark.integration
@pytest.mark.slow
def test_dockerfile_healthcheck_command_against_a_live_agent(example, agent_factory):
    from boxwatch.agent.service import serve

    health = " ".join(a for w, a in dockerfile() if w == "HEALTHCHECK")
    argv = json.loads(health[health.index("CMD") + 3 :].strip())
    assert argv[0] == "/opt/boxwatch/bin/python"
    agent = agent_factory(
        example, kafka__bootstrap_servers="127.0.0.1:1", metrics__address="127.0.0.1:0"
    )
    http = serve(agent)
    try:
        command = [sys.executable, *[a.replace("127.0.0.1:9108", http.address) for a in argv[1:]]]
        healthy = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert healthy.returncode == 0, healthy.stderr
        agent.stop()  # a stopped agent without a consumer answers 503: the check must fail
        stopped = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert stopped.returncode != 0
    finally:
        http.stop()


# -- docker compose -----------------------------------------------------------------------
def test_compose_stack():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert {"kafka", "agent", "prometheus", "grafana"} <= set(services)
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]
    assert not any("ZOOKEEPER" in k for k in kafka["environment"])
    agent = services["agent"]
    assert (DEPLOY / agent["build"]["context"] / agent["build"]["dockerfile"]).is_file()
    assert agent["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert agent["read_only"] is True and "ALL" in agent["cap_drop"]
    mounts = {}
    for name, service in services.items():
        for spec in service.get("volumes", []):
            src, dst = volume(spec)
            mounts[(name, dst)] = src
            if src.startswith(".") and "$" not in src:
                assert (DEPLOY / src).exists(), f"{name}: {src} does not exist"
    assert mounts[("agent", AGENT_CONFIG)] == "./compose/agent.yaml"
    prom_cfg_path = next(
        a.split("=", 1)[1]
        for a in services["prometheus"]["command"]
        if a.startswith("--config.file=")
    )
    prom = yaml.safe_load((DEPLOY / mounts[("prometheus", prom_cfg_path)]).read_text())
    for rule_file in prom["rule_files"]:
        assert ("prometheus", rule_file) in mounts, f"{rule_file} is not mounted"
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["boxwatch-agent"]["static_configs"][0]["targets"] == ["agent:9108"]
    grafana = {dst for (svc, dst) in mounts if svc == "grafana"}
    assert {
        "/etc/grafana/provisioning/datasources",
        "/etc/grafana/provisioning/dashboards",
    } <= grafana
    providers = yaml.safe_load(
        (REPO / "dashboards/provisioning/dashboards/boxwatch.yaml").read_text()
    )["providers"]
    assert any(
        dst.startswith(providers[0]["options"]["path"] + "/") and dst.endswith(".json")
        for dst in grafana
    )
    datasource = yaml.safe_load(
        (REPO / "dashboards/provisioning/datasources/prometheus.yaml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_compose_agent_config_loads():
    cfg = load_agent_config(DEPLOY / "compose" / "agent.yaml", environ={})
    assert cfg["metrics.address"] == "0.0.0.0:9108"
    assert cfg["kafka.bootstrap_servers"] == "kafka:9092"
    compose = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    release = next(
        volume(v)[1] for v in compose["services"]["agent"]["volumes"] if "RELEASE_DIR" in v
    )
    for key in ("artifact", "model"):
        assert cfg[key].startswith(release + "/"), key
    assert all(k.startswith(release + "/") for k in cfg["public_keys"])


# -- Kubernetes ---------------------------------------------------------------------------
def test_k8s_manifests_have_required_fields():
    docs = k8s_docs()
    assert {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "ServiceMonitor",
        "PodDisruptionBudget",
    } <= set(docs)
    for kind, doc in docs.items():
        assert doc["apiVersion"] and doc["metadata"]["name"], kind
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(d["_file"] for d in docs.values())


def test_k8s_deployment_scales_out_in_one_consumer_group():
    docs = k8s_docs()
    dep = docs["Deployment"]
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    assert spec["replicas"] >= 2
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    (agent,) = pod["containers"]
    env = {e["name"]: e for e in agent.get("env", [])}
    assert "BOXWATCH_GROUP_ID" not in env, "a per-pod group id would split the group"
    cfg = yaml.safe_load(docs["ConfigMap"]["data"]["agent.yaml"])
    assert cfg["kafka"]["group_id"]
    assert agent["command"] == ENTRYPOINT
    check_boxwatch_command(agent["command"], "Deployment container command")
    assert env["BOXWATCH_METRICS_ADDRESS"]["value"] == "0.0.0.0:9108"
    assert pod["terminationGracePeriodSeconds"] > cfg["shutdown_timeout_s"]


def test_k8s_agent_config_and_mounts_agree(tmp_path):
    docs = k8s_docs()
    cm = docs["ConfigMap"]
    path = tmp_path / "agent.yaml"
    path.write_text(cm["data"]["agent.yaml"])
    cfg = load_agent_config(path, environ={})
    assert cfg["metrics.address"] == "0.0.0.0:9108"
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    for m in agent["volumeMounts"] + [m for c in pod["initContainers"] for m in c["volumeMounts"]]:
        assert m["name"] in volumes, m
    assert mounts[AGENT_CONFIG]["subPath"] == "agent.yaml"
    assert volumes[mounts[AGENT_CONFIG]["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    secret = docs["Secret"]
    key_dir = next(
        p
        for p, m in mounts.items()
        if volumes[m["name"]].get("secret", {}).get("secretName") == secret["metadata"]["name"]
    )
    for key in cfg["public_keys"]:
        assert key.startswith(key_dir + "/") and Path(key).name in secret["stringData"]
    release_dir = next(
        p for p, m in mounts.items() if "emptyDir" in volumes[m["name"]] and p != "/tmp"
    )
    fetch = "\n".join(pod["initContainers"][0]["command"])
    for key in ("artifact", "model"):
        assert cfg[key].startswith(release_dir + "/") and cfg[key] in fetch, key
    for c in pod["initContainers"]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                assert ref["name"] == cm["metadata"]["name"] and ref["key"] in cm["data"], e


def test_k8s_probes_resources_and_security():
    docs = k8s_docs()
    pod_meta = docs["Deployment"]["spec"]["template"]["metadata"]
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod_meta["annotations"]["prometheus.io/scrape"] == "true"
    assert pod_meta["annotations"]["prometheus.io/port"] == "9108"
    for c in pod["containers"] + pod["initContainers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    (agent,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports["metrics"] == 9108
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert agent[probe]["httpGet"]["port"] in ports
    labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    svc = docs["Service"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert {p["name"] for p in svc["spec"]["ports"]} == {"metrics"}
    assert svc["spec"]["ports"][0]["targetPort"] in ports
    monitor = docs["ServiceMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"metrics"}
    pdb = docs["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] < docs["Deployment"]["spec"]["replicas"]


@pytest.mark.integration
def test_k8s_init_container_fetches_the_release_files(tmp_path):
    served, release = tmp_path / "served", tmp_path / "release"
    served.mkdir()
    release.mkdir()
    payloads = {"model.bwa": os.urandom(3000), "model.onnx": os.urandom(5000)}
    for name, data in payloads.items():
        (served / name).write_bytes(data)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        pod = k8s_docs()["Deployment"]["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["command"][:2] == ["python", "-c"]
        script = init["command"][2].replace("/var/lib/boxwatch", str(release))
        base = f"http://127.0.0.1:{server.server_address[1]}"
        env = {**os.environ, "ARTIFACT_URL": f"{base}/model.bwa", "MODEL_URL": f"{base}/model.onnx"}
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30
        )
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    for name, data in payloads.items():
        assert (release / name).read_bytes() == data


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders_every_manifest_in_the_namespace():
    result = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    rendered = list(yaml.safe_load_all(result.stdout))
    assert {d["kind"] for d in rendered} == set(k8s_docs())
    for d in rendered:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "boxwatch", d["kind"]


def test_keda_overlay_uses_the_base_and_lets_the_autoscaler_own_replicas():
    kustomization = yaml.safe_load((KEDA / "kustomization.yaml").read_text())
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == ["../k8s", "scaledobject.yaml"]
    assert kustomization["namespace"] == base["namespace"]
    dep = k8s_docs()["Deployment"]
    (patch,) = kustomization["patches"]
    assert patch["target"]["kind"] == "Deployment"
    assert patch["target"]["name"] == dep["metadata"]["name"]
    assert yaml.safe_load(patch["patch"]) == [{"op": "remove", "path": "/spec/replicas"}]


def test_keda_scaled_object_follows_the_agents_group_and_input_topics():
    docs = k8s_docs()
    dep = docs["Deployment"]
    cfg = yaml.safe_load(docs["ConfigMap"]["data"]["agent.yaml"])
    spec = keda_scaled_object()["spec"]
    target = spec["scaleTargetRef"]
    assert target["name"] == dep["metadata"]["name"]
    assert (target["apiVersion"], target["kind"]) == (dep["apiVersion"], dep["kind"])
    assert spec["minReplicaCount"] == 1
    assert isinstance(spec["maxReplicaCount"], int)
    assert spec["maxReplicaCount"] > spec["minReplicaCount"]
    inputs = {cfg["topics"][role] for role in ("inputs", "bn_inputs") if cfg["topics"].get(role)}
    triggers = spec["triggers"]
    assert {t["type"] for t in triggers} == {"kafka"}
    assert {t["metadata"]["topic"] for t in triggers} == inputs
    assert len(triggers) == len(inputs)
    for t in triggers:
        meta = t["metadata"]
        assert meta["consumerGroup"] == cfg["kafka"]["group_id"], meta
        assert meta["bootstrapServers"] == cfg["kafka"]["bootstrap_servers"], meta
        assert int(meta["lagThreshold"]) > 0
        # KEDA measures a group with no committed offset as the agents read it.
        assert meta["offsetResetPolicy"] == "earliest"
        # Replicas never outnumber the partitions (extra members of a group sit idle).
        assert meta["allowIdleConsumers"] == "false"
    lines = [line.strip() for line in (KEDA / "scaledobject.yaml").read_text().splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("maxReplicaCount:"))
    comment = []
    while lines[at - 1 - len(comment)].startswith("#"):
        comment.append(lines[at - 1 - len(comment)])
    assert "partition count" in " ".join(comment), "say why maxReplicaCount is what it is"
    readme = (DEPLOY / "README.md").read_text()
    assert "kubectl apply -k deploy/k8s-keda" in readme and "partition count" in readme


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders_the_keda_overlay_without_fixed_replicas():
    result = subprocess.run(
        ["kubectl", "kustomize", str(KEDA)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    rendered = {d["kind"]: d for d in yaml.safe_load_all(result.stdout)}
    assert set(rendered) == set(k8s_docs()) | {"ScaledObject"}
    assert "replicas" not in rendered["Deployment"]["spec"]
    scaled = rendered["ScaledObject"]
    assert scaled["metadata"]["namespace"] == rendered["Deployment"]["metadata"]["namespace"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == rendered["Deployment"]["metadata"]["name"]


# -- systemd ------------------------------------------------------------------------------
UNIT = DEPLOY / "systemd" / "boxwatch-agent.service"


def test_systemd_unit_runs_the_agent_hardened():
    unit = systemd_unit(UNIT)
    (exec_start,) = unit["Service.ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[1:] == ENTRYPOINT[1:]
    check_boxwatch_command(argv, "systemd ExecStart")
    assert unit["Service.User"][0] not in ("root", "0")
    assert "-HUP" in unit["Service.ExecReload"][0]
    hardened = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "CapabilityBoundingSet": "",
    }
    for key, value in hardened.items():
        assert unit.get(f"Service.{key}") == [value], key
    assert "@system-service" in unit["Service.SystemCallFilter"]
    timeout_stop = int(unit["Service.TimeoutStopSec"][0])
    assert timeout_stop > 10  # the agent's default shutdown_timeout_s
    assert unit["Install.WantedBy"] == ["multi-user.target"]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze absent")
def test_systemd_analyze_verify(tmp_path):
    exe = Path(sys.executable).with_name("boxwatch")
    if not exe.exists():
        pytest.skip("the boxwatch console script is not beside this interpreter")
    text = UNIT.read_text().replace("/opt/boxwatch/bin/boxwatch", str(exe))
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if UNIT.name in line or "Unknown" in line
    ]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


# -- release workflow ---------------------------------------------------------------------
def test_release_workflow_builds_verifies_and_publishes():
    wf = workflow()
    assert wf["on"] and wf["jobs"]
    (job,) = wf["jobs"].values()
    steps = job["steps"]
    runs = [s.get("run", "") for s in steps]

    def index(needle: str) -> int:
        return next(i for i, r in enumerate(runs) if needle in r)

    assert any("pip install" in r and "boxwatch[offline]" in r for r in runs)
    write_key = index("umask 077")
    assert "secrets." in steps[write_key]["env"]["BOXWATCH_SIGNING_KEY"]
    build, delete, verify = index("build-artifact"), index("rm -f"), index("verify-artifact")
    assert write_key < build < delete < verify
    assert steps[delete].get("if") == "always()"
    assert "BOXWATCH_SIGNING_KEY_FILE" in runs[build]
    assert any("upload-artifact" in s.get("uses", "") for s in steps)
    assert "gh release upload" in runs[-1]
    assert all("secrets." not in r for r in runs), "secrets must reach the shell via env only"
    commands = workflow_commands()
    assert {c[1] for c in commands} >= {"build-artifact", "verify-artifact"}
    for command in commands:
        check_boxwatch_command(command, "release workflow")


@pytest.mark.integration
def test_release_workflow_key_step_writes_a_private_loadable_key(tmp_path):
    from boxwatch.agent.keys import generate_keypair, load_private_key

    private, public = tmp_path / "k.key", tmp_path / "k.pub"
    generate_keypair(private, public, force=True)
    steps = workflow()["jobs"]["artifact"]["steps"]
    script = next(s["run"] for s in steps if "umask 077" in s.get("run", ""))
    runner_temp, github_env = tmp_path / "runner", tmp_path / "github_env"
    runner_temp.mkdir()
    env = {
        **os.environ,
        "RUNNER_TEMP": str(runner_temp),
        "GITHUB_ENV": str(github_env),
        "BOXWATCH_SIGNING_KEY": private.read_text().rstrip("\n"),
    }
    result = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    name, _, key_file = github_env.read_text().strip().partition("=")
    assert name == "BOXWATCH_SIGNING_KEY_FILE"
    key_path = Path(key_file)
    assert key_path.parent == runner_temp
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    load_private_key(key_path)
    delete = next(s["run"] for s in steps if s.get("if") == "always()")
    subprocess.run(
        ["bash", "-c", delete],
        env={**env, "BOXWATCH_SIGNING_KEY_FILE": key_file},
        check=True,
        timeout=30,
    )
    assert not key_path.exists()


# -- README -------------------------------------------------------------------------------
def test_deploy_readme_names_every_file_and_what_was_not_run():
    text = (DEPLOY / "README.md").read_text()
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name != "README.md":
            assert str(path.relative_to(DEPLOY)) in text, f"README does not mention {path}"
    lowered = text.lower()
    for tool in ("docker", "kubernetes", "grafana"):
        assert tool in lowered
    assert "not run" in lowered
