"""The build config: a YAML file validated against a JSON schema, all problems at once.

``docs/build-config.md`` is the reference; :data:`SCHEMA` is the machine form. Paths in the
config are relative to the config file. Secrets (the signing key) never live here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from boxwatch.agent import vocab
from boxwatch.agent.errors import ConfigError

_PATH = {"type": "string", "minLength": 1}
_NAMES = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
          "uniqueItems": True}
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
                "external_data": {"type": "array", "items": _PATH},
                "preprocessing": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "shape": {"type": "array", "items": {"type": "integer", "minimum": 1},
                                  "minItems": 1},
                        "dtype": {"enum": list(vocab.INPUT_DTYPES)},
                        "scale": {"type": "number"},
                        "offset": {"type": "number"},
                    },
                },
                "pooling": {"enum": list(vocab.POOLINGS)},
            },
        },
        "classes": _NAMES,
        "layers": _NAMES,
        "data": {
            "type": "object",
            "additionalProperties": False,
            "required": ["train"],
            "properties": {"train": _DATASET, "validation": _DATASET, "unknown": _DATASET},
            # More unknown sets (e.g. unknown_far), for the report's operating point only.
            "patternProperties": {"^unknown_[A-Za-z0-9_]+$": _DATASET},
        },
        "monitor": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "tau": {"oneOf": [_TAU, {"type": "array", "items": _TAU, "minItems": 1},
                                  {"const": "search"}]},
                "selection": {"enum": list(vocab.SELECTIONS)},
                "combine": {"enum": list(vocab.COMBINE_RULES)},
                "normalize": {"enum": list(vocab.NORMALIZATIONS)},
                "score_layers": _NAMES,
                "score": {"enum": list(vocab.SCORES)},
                "contrast_layers": {"oneOf": [_NAMES, {"const": "auto"}]},
                "contrast_classes": {"type": "integer", "minimum": 0},
                "target_acceptance": {"type": "number", "exclusiveMinimum": 0,
                                      "exclusiveMaximum": 1},
                "random_state": {"type": "integer"},
            },
        },
        "bn": {
            "type": "object",
            "additionalProperties": False,
            "required": ["file", "class", "positive", "threshold"],
            "properties": {
                "file": _PATH,
                "class": {"type": "string", "minLength": 1},
                "positive": {"type": "string", "minLength": 1},
                "threshold": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "features": _NAMES,
                "order": _NAMES,
                "rules": _PATH,
                "fmo": _PATH,
                "counterexamples": {"type": "integer", "minimum": 0, "maximum": 1000},
                "max_memory": {"oneOf": [{"type": "integer", "minimum": 1},
                                         {"type": "string", "minLength": 1}]},
            },
        },
        "policy": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "fail_on": {"type": "array", "uniqueItems": True,
                            "items": {"enum": ["rule_violated", "fmo_violated", "bn_ties"]}},
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
    """A schema-valid config with its file location (to resolve relative paths)."""

    raw: dict[str, Any]
    path: Path

    def resolve(self, relative: str) -> Path:
        """A config path, relative to the config file's folder."""
        p = Path(relative)
        return p if p.is_absolute() else (self.path.parent / p)

    def section(self, name: str) -> dict[str, Any]:
        return self.raw.get(name) or {}


def load_config(path: str | Path) -> BuildConfig:
    """Read and schema-check a build config; raise :class:`ConfigError` listing every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML ({problem})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping")
    validator = jsonschema.Draft202012Validator(SCHEMA)
    problems = [
        f"{path}: {_where(err)}: {_message(err)}"
        for err in sorted(validator.iter_errors(raw), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if problems:
        raise ConfigError(problems)
    return BuildConfig(raw=raw, path=path.resolve())


def _where(err: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "(top level)"


def _message(err: jsonschema.ValidationError) -> str:
    if err.validator == "additionalProperties":
        return err.message.replace("Additional properties are not allowed", "unknown key(s)")
    if err.validator == "anyOf" and not err.absolute_path:
        return "needs a 'model' section, a 'bn' section, or both"
    return err.message
