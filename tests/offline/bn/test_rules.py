"""The YAML rule language: conditions, declared state orders, and all-at-once errors."""

from __future__ import annotations

import pytest
import yaml
from locations import ROOT, SHARED_BN

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.rules import ClassifierSchema, load_spec, parse_spec

DATA = SHARED_BN

SCHEMA = ClassifierSchema(
    features={
        "Debit": ("d1", "d2", "d3"),
        "Worth": ("High", "Medium", "Low"),
        "Age": ("a1", "a2", "a3", "a4"),
        "Reliability": ("Reliable", "Unreliable"),
    },
    class_variable="Credit",
    class_states=("Positive", "Negative"),
    other_variables=("Income",),
)
WORTH_UP = {"Worth": ["Low", "Medium", "High"]}  # declared order: network index 2, 1, 0


def premise_of(cond, var="Age", states=None):
    data = {"states": states or {}, "rules": [{"name": "r", "if": {var: cond}, "then": "Positive"}]}
    return parse_spec(data, SCHEMA).rules[0].premise[var]


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        (2, (2,)),
        ("2", (2,)),
        ("a3", (2,)),
        ("== 1", (1,)),
        ("!= a1", (1, 2, 3)),
        ("< 2", (0, 1)),
        ("<= 2", (0, 1, 2)),
        ("> 0", (1, 2, 3)),
        (">= a3", (2, 3)),
        ([0, "a4"], (0, 3)),
        ("in [a2, 3]", (1, 3)),
        ("1..2", (1, 2)),
        ("a2..a4", (1, 2, 3)),
        ({">=": 1, "<": 3}, (1, 2)),
        (">= 1 and < 3", (1, 2)),
        ({"in": [3, 0]}, (0, 3)),
    ],
)
def test_conditions_allow_the_stated_ordinal_positions(cond, expected):
    assert premise_of(cond) == expected


def test_declared_order_maps_indices_and_comparisons_to_network_states():
    # Worth rises Low < Medium < High; in the network, High is index 0 and Low index 2.
    assert premise_of(2, "Worth", WORTH_UP) == (0,)
    assert premise_of("> 0", "Worth", WORTH_UP) == (0, 1)
    assert premise_of("> 0", "Worth") == (1, 2)
    assert premise_of("High", "Worth", WORTH_UP) == (0,)


def test_conclusion_by_name_index_list_and_declared_order():
    def conclusion(then, states=None):
        data = {"states": states or {}, "rules": [{"name": "r", "then": then}]}
        return parse_spec(data, SCHEMA).rules[0].conclusion

    assert conclusion("Negative") == ("Negative",)
    assert conclusion(1) == ("Negative",)
    assert conclusion(1, {"Credit": ["Negative", "Positive"]}) == ("Positive",)
    assert conclusion({"Credit": "Positive"}) == ("Positive",)
    assert set(conclusion(["Positive", "Negative"])) == {"Positive", "Negative"}


def test_monotonicity_query_order_and_defaults():
    data = {
        "states": WORTH_UP,
        "monotonicity": [
            {"name": "q", "feature": "Worth", "given": {"Debit": 0, "Age": "> 1"}},
            {"name": "d", "feature": "Age", "check": "decreasing"},
        ],
    }
    q, d = parse_spec(data, SCHEMA).queries
    assert (q.kind, q.order, q.given) == ("fmo", (2, 1, 0), {"Debit": (0,), "Age": (2, 3)})
    assert (d.kind, d.order, d.given) == ("decreasing", (0, 1, 2, 3), {})


def test_every_error_is_reported_at_once_naming_rule_and_term():
    data = {
        "states": {"Worth": ["Low", "High"], "Nope": ["a"]},
        "rules": [
            {"name": "unknown_var", "if": {"Salary": 1}, "then": "Positive"},
            {"name": "unknown_state", "if": {"Debit": "huge"}, "then": "Positive"},
            {"name": "empty", "if": {"Age": "> 3", "Debit": "2..1"}, "then": "Positive"},
            {"name": "on_class", "if": {"Credit": "Positive"}, "then": "Positive"},
            {"name": "not_feature", "if": {"Income": 0}, "then": "Positive"},
            {"name": "bad_then", "if": {"Debit": 0}, "then": "Maybe"},
            {"name": "bad_op", "if": {"Debit": "~ 1"}},
        ],
        "monotonicity": [
            {"name": "q", "feature": "Debit", "given": {"Debit": 0}, "check": "sideways"}
        ],
    }
    with pytest.raises(ConfigError) as info:
        parse_spec(data, SCHEMA, source="r.yaml")
    problems = info.value.problems
    expected = [
        ("'Worth'", "exactly once"),
        ("'Nope'", "not a feature"),
        ("'unknown_var'", "unknown variable 'Salary'"),
        ("'unknown_state'", "'huge'"),
        ("'empty'", "Age: '> 3'"),
        ("'empty'", "Debit: '2..1'"),
        ("'on_class'", "class variable"),
        ("'not_feature'", "not a feature of this classifier"),
        ("'bad_then'", "'Maybe'"),
        ("'bad_op'", "'~ 1'"),
        ("'bad_op'", "'then'"),
        ("query 'q'", "sideways"),
        ("query 'q'", "must not be constrained"),
    ]
    for where, what in expected:
        assert any(where in p and what in p for p in problems), (where, what, problems)
    assert all(p.startswith("r.yaml") for p in problems)


def test_load_spec_reports_yaml_syntax_errors_with_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rules:\n  - name: a\n    if: {Debit: [1, 2}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:3"):
        load_spec(path, SCHEMA)
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml", SCHEMA)


def test_default_order_from_another_file_applies_unless_overridden(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump({"monotonicity": [{"name": "q", "feature": "Worth"}]}))
    assert load_spec(path, SCHEMA, default_order=WORTH_UP).queries[0].order == (2, 1, 0)
    assert load_spec(path, SCHEMA).queries[0].order == (0, 1, 2)


def credit_schema():
    """The credit classifier's schema, read from the network when ../shared is present."""
    path = DATA / "credit.net"
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared data not available)")
    from boxwatch.offline.bn.formats import load_network

    net = load_network(path)
    features = {v: net.states[v] for v in net.variables if v != "CreditWorthiness"}
    return ClassifierSchema(features, "CreditWorthiness", net.states["CreditWorthiness"])


@pytest.mark.shared_data
def test_credit_example_files_parse_with_the_papers_reading():
    schema = credit_schema()
    rules_spec = load_spec(ROOT / "examples" / "credit" / "rules.yaml", schema)
    assert [r.name for r in rules_spec.rules] == [f"rule{k}" for k in range(11)]
    assert all(r.conclusion == ("Positive",) for r in rules_spec.rules)
    order = rules_spec.state_order
    assert order["Worth"][2] == "High" and order["Debit"][0] == "interval1"
    assert order["Profession"][1] == "Medium_income_profession"
    assert order["WorkHistory"][3] == "Stable" and order["PaymentHistory"][3] == "Excellent"
    rule4 = rules_spec.rules[4]
    assert {schema.features["Assets"][j] for j in rule4.premise["Assets"]} == {"poor"}
    fmo = load_spec(ROOT / "examples" / "credit" / "fmo.yaml", schema, default_order=order)
    q = fmo.queries[0]
    assert q.feature == "Assets" and q.kind == "fmo"
    assert [schema.features["Assets"][j] for j in q.order] == ["poor", "average", "wealthy"]
    assert {schema.features["Worth"][j] for j in q.given["Worth"]} == {"High"}


def test_yes_no_on_off_and_true_false_states_are_not_booleans(tmp_path):
    schema = ClassifierSchema(
        features={"smoke": ("no", "yes"), "light": ("off", "on"), "HISTORY": ("TRUE", "FALSE")},
        class_variable="bronc",
        class_states=("yes", "no"),
    )
    path = tmp_path / "r.yaml"
    path.write_text(
        "rules:\n  - name: r\n    if: {smoke: yes, light: [on], HISTORY: false}\n    then: no\n"
    )
    rule = load_spec(path, schema).rules[0]
    assert rule.premise == {"smoke": (1,), "light": (1,), "HISTORY": (1,)}
    assert rule.conclusion == ("no",)
