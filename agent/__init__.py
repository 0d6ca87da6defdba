"""The online half: artifact contract, layer taps, monitors' runtime and the Kafka agent.

Light dependencies only (numpy, onnxruntime, kafka-python, prometheus-client, cryptography);
never imports the offline builder. The public API::

    from boxwatch.agent import load_artifact, load_runtime, load_trusted_keys

    runtime = load_runtime("model.bwa", ["ci.pub"], model_path="model.onnx")
    result = runtime.run_model(x)        # predictions, verdicts, reasons and scores for a batch

Subpackages and modules: :mod:`.artifact` (the signed container, owner of the format),
:mod:`.runtime` (artifact + model + monitors), :mod:`.boxes` (box monitors at run time),
:mod:`.diagram` and :mod:`.gate` (BN decisions and rules), :mod:`.records` (input records),
:mod:`.kafka` (the client libraries), :mod:`.service` (the agent loop), :mod:`.metrics`.
"""

from typing import TYPE_CHECKING

from boxwatch.agent.lazy import lazy_exports

# The public names, by the module that defines them; each is imported when first read, so
# importing a light module (errors, vocab) does not load the agent loop, Kafka or prometheus.
_EXPORTS = {
    "artifact": ("Artifact", "load_artifact", "write_artifact"),
    "boxes": ("BoxRuntime",),
    "config": ("AgentConfig", "load_agent_config"),
    "diagram": ("DecisionDiagram",),
    "errors": ("ArtifactError", "BoxwatchError", "ConfigError", "KeyFileError"),
    "gate": ("RuleGate",),
    "keys": ("generate_keypair", "load_private_key", "load_trusted_keys"),
    "runtime": ("ModelResult", "MonitorRuntime", "load_runtime"),
    "service": ("Agent", "build_agent", "serve"),
}

if TYPE_CHECKING:
    from boxwatch.agent.artifact import Artifact, load_artifact, write_artifact
    from boxwatch.agent.boxes import BoxRuntime
    from boxwatch.agent.config import AgentConfig, load_agent_config
    from boxwatch.agent.diagram import DecisionDiagram
    from boxwatch.agent.errors import ArtifactError, BoxwatchError, ConfigError, KeyFileError
    from boxwatch.agent.gate import RuleGate
    from boxwatch.agent.keys import generate_keypair, load_private_key, load_trusted_keys
    from boxwatch.agent.runtime import ModelResult, MonitorRuntime, load_runtime
    from boxwatch.agent.service import Agent, build_agent, serve
else:
    __getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "Agent",
    "AgentConfig",
    "Artifact",
    "ArtifactError",
    "BoxRuntime",
    "BoxwatchError",
    "ConfigError",
    "DecisionDiagram",
    "KeyFileError",
    "ModelResult",
    "MonitorRuntime",
    "RuleGate",
    "build_agent",
    "generate_keypair",
    "load_agent_config",
    "load_artifact",
    "load_private_key",
    "load_runtime",
    "load_trusted_keys",
    "serve",
    "write_artifact",
]
