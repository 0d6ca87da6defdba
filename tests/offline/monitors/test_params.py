"""``BoxMonitor`` declares its parameters' domains once (``_parameter_constraints``): fit
reports every value outside them, and the build config's monitor schema is generated from
them, so both refuse the same values."""

from __future__ import annotations

import inspect
import numbers

import jsonschema
import numpy as np
import pytest
import yaml

from boxwatch.agent import vocab
from boxwatch.agent.errors import ConfigError
from boxwatch.offline.monitors.estimator import BoxMonitor, MonitorValueError
from boxwatch.offline.monitors.evaluation import DEFAULT_TARGET_ACCEPTANCE, detection
from boxwatch.offline.monitors.params import (
    Boolean,
    Interval,
    Names,
    Options,
    RandomStates,
    json_schema,
    validate_params,
)
from boxwatch.offline.release.config import SCHEMA, load_config

CONSTRAINTS = BoxMonitor._parameter_constraints
MONITOR_SCHEMA = SCHEMA["properties"]["monitor"]["properties"]
# BoxMonitor's parameters the config sets as they are (the config's tau has its own form).
CONFIG_PARAMETERS = sorted(set(MONITOR_SCHEMA) - {"tau"})


def _problems(**params) -> dict[str, str]:
    return validate_params(CONSTRAINTS, params)


def test_every_init_parameter_has_a_domain_and_every_domain_a_parameter():
    init = set(inspect.signature(BoxMonitor.__init__).parameters) - {"self"}
    assert init == set(CONSTRAINTS)


def test_every_default_lies_in_its_domain():
    assert validate_params(CONSTRAINTS, BoxMonitor().get_params(deep=False)) == {}


def test_defaults_are_read_from_the_estimator():
    params = BoxMonitor().get_params()
    assert params["target_acceptance"] == DEFAULT_TARGET_ACCEPTANCE
    assert (
        detection(np.arange(100.0), np.arange(100.0)).target_acceptance
        == (params["target_acceptance"])
    )


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("target_acceptance", 1.5, "target_acceptance=1.5 should be a float in (0, 1)"),
        ("target_acceptance", 0, "target_acceptance=0 should be a float in (0, 1)"),
        ("target_acceptance", "high", "target_acceptance='high' should be a float in (0, 1)"),
        ("target_acceptance", float("nan"), "target_acceptance=nan should be a float in (0, 1)"),
        ("confidence_share", 1.0, "confidence_share=1.0 should be a float in [0, 1)"),
        ("calibration_share", -0.1, "calibration_share=-0.1 should be a float in [0, 1)"),
        ("contrast_classes", -1, "contrast_classes=-1 should be an int >= 0"),
        ("contrast_classes", 1.5, "contrast_classes=1.5 should be an int >= 0"),
        ("max_clusters", 0, "max_clusters=0 should be an int >= 1"),
        ("n_init", True, "n_init=True should be an int >= 1"),
        ("eps_ival", 0.0, "eps_ival=0.0 should be a float > 0"),
        ("eps_cov", -0.5, "eps_cov=-0.5 should be a float >= 0"),
        ("combine", "vote", "combine='vote' should be one of 'any', 'majority', 'all', "),
        ("selection", "fixed", "selection='fixed' should be one of 'held-out-class', "),
        ("normalize", None, "normalize=None should be one of 'none', 'l2'"),
        ("energy_term", 1, "energy_term=1 should be a bool"),
        ("mahalanobis_term", "yes", "mahalanobis_term='yes' should be a bool"),
        (
            "score_layers",
            [],
            "score_layers=[] should be a non-empty list of distinct names or None",
        ),
        ("score_layers", ["a", "a"], "score_layers=['a', 'a'] should be a non-empty list"),
        ("layers", "a", "layers='a' should be a non-empty list of distinct names or None"),
        ("contrast_layers", "all", "contrast_layers='all' should be a non-empty list of "),
        ("contrast_layers", np.array(["a"]), "contrast_layers=array(['a']) should be a "),
        ("taus", [], "taus=[] should be a non-empty list of floats in [0, 1]"),
        ("taus", (0.5, 2), "taus=[0.5, 2] should be a non-empty list of floats in [0, 1]"),
        ("tau", 1.5, "tau=1.5 should be a float in [0, 1], a mapping {layer: "),
        ("tau", {"a": [0.5, -1]}, "tau={'a': [0.5, -1]} should be a float in [0, 1]"),
        ("tau", "search", "tau='search' should be a float in [0, 1], a mapping"),
        ("random_state", -1, "random_state=-1 should be an int in [0, 4294967295] or a numpy"),
        ("random_state", "seed", "random_state='seed' should be an int in [0, 4294967295]"),
    ],
)
def test_a_bad_value_is_refused_with_the_value_shown(name, value, message):
    problems = _problems(**{name: value})
    assert list(problems) == [name]
    assert problems[name].startswith(message), problems[name]


@pytest.mark.parametrize(
    "name,value",
    [
        ("target_acceptance", np.float32(0.9)),
        ("confidence_share", 0),
        ("contrast_classes", np.int64(0)),
        ("energy_term", np.bool_(False)),
        ("score_layers", ("a", "b")),
        ("taus", np.array([0.5, 0.1])),
        ("tau", {"a": 0.5, "b": [0.1, 0.2]}),
        ("tau", 0),
        ("random_state", np.random.RandomState(1)),
        ("random_state", None),
        ("layers", None),
    ],
)
def test_values_of_the_other_kinds_in_a_domain_are_accepted(name, value):
    assert _problems(**{name: value}) == {}


def test_fit_reports_every_bad_parameter_at_once():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=30)
    acts = {"a": rng.normal(size=(30, 4))}
    monitor = BoxMonitor(
        ["a"],
        target_acceptance=1.5,
        combine="vote",
        random_state=-1,
        score_layers=["a", "zz"],
        eps_ival=0,
    )
    with pytest.raises(MonitorValueError) as info:
        monitor.fit(acts, y, y)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    text = str(info.value)
    for needle in (
        "target_acceptance=1.5",
        "combine='vote'",
        "random_state=-1",
        "eps_ival=0",
        "score layer 'zz' is not monitored",
    ):
        assert needle in text, text


def test_calibrate_checks_its_target_against_the_same_domain():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=60)
    acts = {"a": rng.normal(size=(60, 4)) + 3 * y[:, None]}
    monitor = BoxMonitor(["a"], tau=0.5, calibration_share=0).fit(acts, y, y)
    with pytest.raises(MonitorValueError, match=r"target_acceptance=1\.0 should be a float in"):
        monitor.calibrate(acts, y, target_acceptance=1.0)


def test_validate_params_names_an_undeclared_parameter():
    assert validate_params({"a": [Boolean()]}, {"b": 1}) == {"b": "b=1: no such parameter"}


@pytest.mark.parametrize(
    "closed,fragment",
    [
        ("both", {"minimum": 0, "maximum": 1}),
        ("left", {"minimum": 0, "exclusiveMaximum": 1}),
        ("right", {"exclusiveMinimum": 0, "maximum": 1}),
        ("neither", {"exclusiveMinimum": 0, "exclusiveMaximum": 1}),
    ],
)
def test_an_interval_becomes_its_json_schema(closed, fragment):
    interval = Interval(numbers.Real, 0, 1, closed=closed)
    assert json_schema([interval]) == {"type": "number", **fragment}
    assert json_schema([Interval(numbers.Integral, 1, None, closed="left")]) == {
        "type": "integer",
        "minimum": 1,
    }


def test_json_schema_leaves_out_what_a_config_cannot_spell():
    assert json_schema([Options(("auto",))]) == {"const": "auto"}
    assert json_schema([Names(), Options(("auto",)), None])["oneOf"][1] == {"const": "auto"}
    assert json_schema([RandomStates(), None]) == {
        "type": "integer",
        "minimum": 0,
        "maximum": 2**32 - 1,
    }
    with pytest.raises(ValueError, match="no config form for None"):
        json_schema([None])


def test_config_schema_enums_are_the_estimators_vocabularies():
    for name, vocabulary in (
        ("selection", vocab.SELECTIONS),
        ("combine", vocab.COMBINE_RULES),
        ("normalize", vocab.NORMALIZATIONS),
        ("score", vocab.SCORES),
        ("score_mean", vocab.SCORE_MEANS),
        ("error_score", vocab.ERROR_SCORES),
    ):
        (options,) = CONSTRAINTS[name]
        assert isinstance(options, Options) and options.options == vocabulary
        assert MONITOR_SCHEMA[name] == {"enum": list(vocabulary)}


def test_the_config_sets_the_documented_parameters():
    assert CONFIG_PARAMETERS == sorted(
        [
            "selection",
            "combine",
            "normalize",
            "score_layers",
            "score",
            "score_mean",
            "peak_factor",
            "energy_term",
            "mahalanobis_term",
            "contrast_layers",
            "contrast_classes",
            "target_acceptance",
            "confidence_share",
            "error_score",
            "n_jobs",
            "random_state",
        ]
    )
    assert all(MONITOR_SCHEMA[name] == json_schema(CONSTRAINTS[name]) for name in CONFIG_PARAMETERS)


# Values a YAML config can hold. Not None (a config omits the key to get the default) nor
# integral floats such as 1.0, which JSON Schema counts as integers and the estimator does
# not (fit reports them).
CONFIG_VALUES = [
    -1,
    0,
    1,
    64,
    2**32,
    -0.5,
    0.5,
    0.95,
    1.5,
    True,
    False,
    "auto",
    "vote",
    "",
    *vocab.SELECTIONS,
    *vocab.COMBINE_RULES,
    *vocab.NORMALIZATIONS,
    *vocab.SCORES,
    *vocab.SCORE_MEANS,
    [],
    ["a"],
    ["a", "b"],
    ["a", "a"],
    [""],
    [0.5],
    {"a": 1},
]


@pytest.mark.parametrize("name", CONFIG_PARAMETERS)
def test_config_schema_and_estimator_accept_the_same_values(name):
    validator = jsonschema.Draft202012Validator(MONITOR_SCHEMA[name])
    for value in CONFIG_VALUES:
        assert validator.is_valid(value) == (not _problems(**{name: value})), (name, value)


@pytest.mark.parametrize(
    "name,value",
    [
        ("target_acceptance", 1.0),
        ("target_acceptance", 0),
        ("confidence_share", 1),
        ("contrast_classes", -1),
        ("combine", "vote"),
        ("selection", "fixed"),
        ("score_mean", "geometric"),
        ("energy_term", "yes"),
        ("score_layers", []),
        ("contrast_layers", "all"),
        ("random_state", -1),
    ],
)
def test_a_config_with_a_bad_monitor_value_is_refused(tmp_path, name, value):
    assert _problems(**{name: value})
    path = tmp_path / "build.yaml"
    path.write_text(
        yaml.safe_dump({"version": 1, "model": {"path": "m.onnx"}, "monitor": {name: value}})
    )
    with pytest.raises(ConfigError, match=f"monitor.{name}"):
        load_config(path)
