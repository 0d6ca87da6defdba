"""The build config: a YAML file validated against a JSON schema, all problems at once.

``docs/build-config.md`` is the reference; :data:`SCHEMA` is the machine form. Paths in the
config are relative to the config file. Secrets (the signing key) never live here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import msgspec

from boxwatch.agent import vocab
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import load_yaml_file, one_line, quote, show_path
from boxwatch.agent.taps import DEVICE_PATTERN
from boxwatch.offline.monitors.estimator import BoxMonitor
from boxwatch.offline.monitors.params import json_schema
from boxwatch.offline.release.records import BuildSpec, MonitorSection

# The data sets of a config that hold unknown inputs: ``unknown`` and ``unknown_*``.
UNKNOWN_SET = "unknown"


def unknown_sets(names: Iterable[str]) -> list[str]:
    """The unknown data sets among ``names`` (``unknown``, ``unknown_*``): ``unknown`` first,
    then the others by name."""
    found = (n for n in names if n == UNKNOWN_SET or n.startswith(f"{UNKNOWN_SET}_"))
    return sorted(found, key=lambda n: (n != UNKNOWN_SET, n))


_PATH = {"type": "string", "minLength": 1}
_NAMES = {
    "type": "array",
    "items": {"type": "string", "minLength": 1},
    "minItems": 1,
    "uniqueItems": True,
}
_DATASET = {
    "type": "object",
    "additionalProperties": False,
    "required": ["path"],
    "properties": {
        "path": _PATH,
        "format": {"enum": ["npz", "idx", "csv"]},
        "x": {"type": "string"},
        "y": {"type": "string"},
        "labels": _PATH,
        "limit": {"type": "integer", "minimum": 1},
    },
}
# The build's monitor warnings (offline/release/emitted.py WARNINGS), usable in policy.fail_on.
MONITOR_WARNINGS = (
    "low_known_acceptance",
    "tau_at_edge",
    "empty_contrast",
    "few_training_inputs",
    "input_not_monitored",
)
_TAU = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "boxwatch build config",
    "type": "object",
    "additionalProperties": False,
    "required": ["version"],
    "properties": {
        "version": {"const": 1},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string"},
                "model_version": {"type": "string"},
                "description": {"type": "string"},
            },
        },
        "model": {
            "type": "object",
            "additionalProperties": False,
            "required": ["path"],
            "properties": {
                "path": _PATH,
                "format": {"enum": ["onnx", "torch"]},
                "input_name": {"type": "string"},
                # image | signal | vector (omitted: from the input's shape); sets its pooling.
                "input_kind": {"enum": list(vocab.INPUT_KINDS)},
                # false: the model's input is not monitored beside the layers.
                "monitor_input": {"type": "boolean"},
                # Where activations are extracted: cpu, cuda (GPU 0) or cuda:N.
                "device": {"type": "string", "pattern": DEVICE_PATTERN},
                "external_data": {"type": "array", "items": _PATH},
                "preprocessing": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "shape": {
                            "type": "array",
                            "items": {"type": "integer", "minimum": 1},
                            "minItems": 1,
                        },
                        "dtype": {"enum": list(vocab.INPUT_DTYPES)},
                        "scale": {"type": "number"},
                        "offset": {"type": "number"},
                    },
                },
                "pooling": {
                    "oneOf": [
                        {"enum": list(vocab.POOLINGS)},
                        {
                            "type": "object",
                            "additionalProperties": {"enum": list(vocab.POOLINGS)},
                        },
                    ]
                },
            },
        },
        "classes": _NAMES,
        # Omitted or "auto": chosen by held-out-class validation (offline/release/layer_choice.py).
        "layers": {"oneOf": [_NAMES, {"const": "auto"}]},
        "data": {
            "type": "object",
            "additionalProperties": False,
            "required": ["train"],
            # test: labelled, reported like validation, never fitted or calibrated on.
            "properties": {
                "train": _DATASET,
                "validation": _DATASET,
                "test": _DATASET,
                "unknown": _DATASET,
            },
            # More unknown sets (e.g. unknown_far), for the report's operating point only.
            "patternProperties": {"^unknown_[A-Za-z0-9_]+$": _DATASET},
        },
        "monitor": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                # Written here, not generated: the config's tau is its own form (one tau above
                # 0, the candidate list, or "search"), which the monitor stage maps onto
                # BoxMonitor's tau and taus.
                "tau": {
                    "oneOf": [
                        _TAU,
                        {"type": "array", "items": _TAU, "minItems": 1},
                        {"const": "search"},
                    ]
                },
                # The rest are BoxMonitor's parameters that the monitor section records
                # (MonitorSection, one list), with the domains the estimator declares (its
                # defaults apply when a key is omitted).
                **{
                    name: json_schema(BoxMonitor._parameter_constraints[name])
                    for name in MonitorSection.__struct_fields__
                    if name != "tau"
                },
            },
        },
        "bn": {
            "type": "object",
            "additionalProperties": False,
            "required": ["file", "class"],
            "properties": {
                "file": _PATH,
                "class": {"type": "string", "minLength": 1},
                "decision": {"enum": ["threshold", "argmax"]},
                "positive": {"type": "string", "minLength": 1},
                "threshold": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "features": _NAMES,
                "order": _NAMES,
                "rules": _PATH,
                "fmo": _PATH,
                "counterexamples": {"type": "integer", "minimum": 0, "maximum": 1000},
                "max_memory": {
                    "oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "minLength": 1}]
                },
                "repair": {"type": "boolean"},
                "repair_proposals": {"type": "integer", "minimum": 1, "maximum": 100},
                "repair_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
            },
        },
        "policy": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "fail_on": {
                    "type": "array",
                    "uniqueItems": True,
                    "items": {
                        "enum": ["rule_violated", "fmo_violated", "bn_ties", *MONITOR_WARNINGS]
                    },
                },
                "min_recall": {"type": "number", "minimum": 0, "maximum": 1},
                "min_precision": {"type": "number", "minimum": 0, "maximum": 1},
                "max_unknown_acceptance": {"type": "number", "minimum": 0, "maximum": 1},
            },
        },
    },
    "anyOf": [{"required": ["model"]}, {"required": ["bn"]}],
}


@dataclass(frozen=True)
class BuildConfig:
    """A schema-valid config with its file location (to resolve relative paths).

    ``raw`` is the config as written (what the manifest records); ``spec`` the same config
    as typed records, one per section (:mod:`.records`).
    """

    raw: dict[str, Any]
    path: Path
    spec: BuildSpec

    def resolve(self, relative: str) -> Path:
        """A config path, relative to the config file's folder."""
        p = Path(relative)
        return p if p.is_absolute() else (self.path.parent / p)

    def section(self, name: str) -> dict[str, Any]:
        """A section as written (the raw mapping; empty when absent)."""
        return self.raw.get(name) or {}


def load_config(path: str | Path) -> BuildConfig:
    """Read and schema-check a build config; raise :class:`ConfigError` listing every problem."""
    path = Path(path)
    where = show_path(path)
    raw = load_yaml_file(path, what="config file")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the config must be a YAML mapping")
    validator = jsonschema.Draft202012Validator(SCHEMA)
    problems = [
        f"{where}: {_where(err)}: {_message(err)}"
        for err in sorted(validator.iter_errors(raw), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if problems:
        raise ConfigError(problems)
    try:
        spec = msgspec.convert(raw, BuildSpec, strict=False)
    except msgspec.ValidationError as exc:  # a record refuses what the schema let through
        raise ConfigError(f"{where}: {exc}") from None
    return BuildConfig(raw=raw, path=path.resolve(), spec=spec)


def _where(err: jsonschema.ValidationError) -> str:
    return one_line(".".join(str(p) for p in err.absolute_path) or "(top level)", 200)


def _message(err: jsonschema.ValidationError) -> str:
    """The schema's complaint, capped: jsonschema's message quotes the whole value."""
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        verb = "was" if len(extra) == 1 else "were"
        return f"unknown key(s) ({', '.join(quote(k, 40) for k in extra[:10])} {verb} unexpected)"
    if err.validator == "pattern" and err.schema.get("pattern") == DEVICE_PATTERN:
        return f"{quote(str(err.instance), 40)} is not a device (cpu, cuda or cuda:N)"
    if err.validator == "anyOf" and not err.absolute_path:
        return "needs a 'model' section, a 'bn' section, or both"
    if err.validator == "oneOf" and {"const": "auto"} in err.schema.get("oneOf", []):
        return (
            f"expected 'auto' or a non-empty list of distinct names, not {quote(err.instance, 60)}"
        )
    return one_line(err.message, 300)
