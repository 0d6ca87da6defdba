"""The YAML rule language: conditions, declared state orders, and all-at-once errors."""

from __future__ import annotations

import itertools
import re
import time

import pytest
import yaml
from deadlines import Countdown
from locations import ROOT, SHARED_BN

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn import rules as rules_module
from boxwatch.offline.bn.limits import CompileTimeError
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


# ---------------------------------------------------------------------------- hostile terms
def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _spaced(pattern: str, n: int) -> str:
    """``pattern`` with each ``_`` replaced by ``n`` characters of a whitespace run."""
    return pattern.replace("_", " " * n).replace("~", "\t" * n)


SPACED_TERMS = [
    ">= a1_a2",
    "<=_a1~a2",
    "a1_a2",
    "a1_.._",
    "a1.._a2_a3",
    "== a1_and_a2",
    "in [_a1_a2_]",
    "a1_..a2..._a3",
    "!=~",
]


@pytest.mark.parametrize("pattern", SPACED_TERMS)
def test_a_condition_with_long_whitespace_runs_parses_in_linear_time(pattern):
    """No backtracking over whitespace runs: 20,000 spaces take milliseconds, and a run
    eight times longer takes about eight times as long (the old regex took 41 s on 40 KB)."""

    def parse(n: int) -> None:
        data = {"rules": [{"name": "r", "if": {"Age": _spaced(pattern, n)}, "then": "Positive"}]}
        with pytest.raises(ConfigError, match="rule 'r'"):
            parse_spec(data, SCHEMA)

    small = min(_seconds(lambda: parse(2_500)) for _ in range(3))
    large = min(_seconds(lambda: parse(20_000)) for _ in range(3))
    assert large < 0.5, f"{large:.2f} s"
    assert large < 8 * 4 * max(small, 1e-3), (small, large)


_OLD_EXPR = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*(.+?)\s*$")
_OLD_RANGE = re.compile(r"^\s*(.+?)\s*\.\.\s*(.+?)\s*$")


def test_operator_and_range_terms_split_as_the_regular_expressions_did():
    """Every string of up to 5 characters over the terms' alphabet splits into the same
    operator and operands (after stripping, as the parser uses them) as the old
    backtracking expressions."""
    alphabet = ["a", ".", " ", "\n", "<", "=", "\t"]
    for size in range(6):
        for chars in itertools.product(alphabet, repeat=size):
            text = "".join(chars)
            m = _OLD_EXPR.match(text)
            old = (m.group(1), m.group(2).strip()) if m else None
            got = rules_module._split_operator(text)
            assert (got[0], got[1].strip()) == old if got else old is None, repr(text)
            stripped = text.strip()
            m = _OLD_RANGE.match(stripped)
            old = (m.group(1).strip(), m.group(2).strip()) if m else None
            got = rules_module._split_range(stripped)
            assert (got[0].strip(), got[1].strip()) == old if got else old is None, repr(text)


BIG = 20_000
BIG_SCHEMA = ClassifierSchema(
    features={"Many": tuple(f"s{j}" for j in range(BIG)), "Two": ("x", "y")},
    class_variable="C",
    class_states=tuple(f"c{j}" for j in range(BIG)),
    decision="argmax",
)


@pytest.mark.parametrize(
    "spec",
    [
        {"rules": [{"name": "r", "if": {"Many": [f"s{j}" for j in range(BIG)]}, "then": "c0"}]},
        {"rules": [{"name": "r", "if": {"Many": ["s19999"] * 50_000}, "then": "c0"}]},
        {"rules": [{"name": "r", "if": {"Many": "in [" + "s19999, " * 50_000 + "s0]"}, "then": 1}]},
        {"rules": [{"name": "r", "if": {"Two": "x"}, "then": [f"c{j}" for j in range(BIG)]}]},
        {"rules": [{"name": "r", "if": {"Many": {"in": ["s19998", "s19999"] * 25_000}}}]},
        {
            "states": {
                "Many": [f"s{j}" for j in reversed(range(BIG))],
                "C": list(BIG_SCHEMA.class_states),
            },
            "monotonicity": [{"name": "q", "feature": "Many", "given": {"Two": "y"}}],
        },
    ],
    ids=["every-state", "last-state-repeated", "in-text", "conclusion", "in-mapping", "orders"],
)
def test_a_condition_listing_many_states_is_linear(spec):
    """State names are looked up, not searched for: 50,000 names of a 20,000-state feature
    in well under a second (a list scan each took 174 s for 800k)."""
    try:
        took = _seconds(lambda: parse_spec(spec, BIG_SCHEMA))
    except ConfigError as exc:  # "in-mapping" has no conclusion: still parsed whole
        assert "'then'" in str(exc)
        took = _seconds(lambda: pytest.raises(ConfigError, parse_spec, spec, BIG_SCHEMA))
    assert took < 1.0, f"{took:.2f} s"


@pytest.mark.parametrize("digits", [20, 4_299, 4_400, 100_000])
@pytest.mark.parametrize("form", ["{}", "in [{}]", "{}..1", "<= {}"])
def test_an_index_of_thousands_of_digits_is_out_of_range_in_one_line(digits, form):
    """Beyond Python's int-string limit (4,300 digits) too: a short message, no crash."""
    data = {"rules": [{"name": "r", "if": {"Age": form.format("7" * digits)}, "then": "Positive"}]}
    with pytest.raises(ConfigError) as info:
        parse_spec(data, SCHEMA)
    (problem,) = info.value.problems
    assert len(problem) < 600, problem[:300]
    assert "out of range 0..3" in problem or (form == "{}" and "not a condition" in problem)


@pytest.mark.parametrize("token", ["\u0661", "\u00b2", "\uff11", "1\u0663"])
def test_indices_are_ascii_digits(token):
    """``\\d`` and ``int`` take other scripts' digits; a state index is ASCII digits only."""
    data = {"rules": [{"name": "r", "if": {"Age": token}, "then": "Positive"}]}
    with pytest.raises(ConfigError, match="unknown state"):
        parse_spec(data, SCHEMA)


def test_messages_show_a_long_state_list_cut():
    data = {"rules": [{"name": "r", "if": {"Many": "nope"}, "then": "c0"}]}
    with pytest.raises(ConfigError) as info:
        parse_spec(data, BIG_SCHEMA)
    (problem,) = info.value.problems
    assert "'s0', 's1'" in problem and f"{BIG:,} states" in problem and len(problem) < 800


def test_reading_a_rules_file_stops_at_the_deadline(tmp_path):
    """The YAML of a rules file (seconds for a few MB) is read under the command's clock."""
    path = tmp_path / "r.yaml"
    items = ", ".join(["a1"] * 50_000)
    path.write_text(f"rules:\n  - name: r\n    if: {{Age: [{items}]}}\n    then: Positive\n")
    with pytest.raises(CompileTimeError, match=r"reading .*r\.yaml"):
        load_spec(path, SCHEMA, deadline=Countdown(3))
