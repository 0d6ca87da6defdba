"""The build config schema: the documented example validates; mistakes are all reported."""

from __future__ import annotations

import re

import pytest
from locations import ROOT

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.release.config import load_config


def test_documented_example_is_valid(tmp_path):
    doc = (ROOT / "docs" / "build-config.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", doc, re.DOTALL).group(1)
    path = tmp_path / "build.yaml"
    path.write_text(example)
    cfg = load_config(path)
    assert cfg.raw["bn"]["threshold"] == 0.5
    assert cfg.resolve("model.onnx") == tmp_path / "model.onnx"


def test_bundled_demo_config_is_valid():
    load_config(ROOT / "examples" / "demo" / "build.yaml")


@pytest.mark.parametrize(
    "text,needles",
    [
        ("version: 2\nmodel: {path: m.onnx}\n", ["version"]),
        ("version: 1\n", ["needs a 'model' section, a 'bn' section"]),
        (
            "version: 1\nmodel: {path: m.onnx, colour: red}\nmonitr: {}\n",
            ["unknown key(s) ('colour'", "unknown key(s) ('monitr'"],
        ),
        (
            "version: 1\nbn: {file: x.net, class: C, positive: p, threshold: 1.5}\n",
            ["bn.threshold"],
        ),
        (
            "version: 1\nmodel: {path: m.onnx}\nmonitor: {tau: [0.5, 2], combine: sometimes}\n",
            ["monitor.tau", "monitor.combine"],
        ),
    ],
)
def test_schema_problems_listed_together(tmp_path, text, needles):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    for needle in needles:
        assert needle in str(info.value), (needle, info.value.problems)


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("version: 1\nmodel:\n  path: [unclosed\n")
    with pytest.raises(ConfigError, match=r"c.yaml:\d+:\d+: invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "none.yaml")


def test_unknown_sets_are_the_one_naming_rule_of_the_config():
    """The build's held-out sets and the refit's guard both take their unknown sets from
    here: ``unknown`` first, then ``unknown_*`` by name, nothing else."""
    from boxwatch.offline.release.config import unknown_sets

    names = ["train", "unknown_b", "validation", "unknownish", "unknown", "unknown_a", "test"]
    assert unknown_sets(names) == ["unknown", "unknown_a", "unknown_b"]
    assert unknown_sets(["train"]) == []
