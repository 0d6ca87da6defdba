"""Credit case study end to end: sampled data, learned BNs, Table 3 rules, brute-force check."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from bn_tables import brute_monotone, brute_rule, cube_all_violate, table_of
from locations import ROOT, SHARED_BN

NETWORK = SHARED_BN / "credit.net"


def case_study():
    if not NETWORK.is_file():
        pytest.skip(f"{NETWORK} is absent (../shared data not available)")
    spec = importlib.util.spec_from_file_location(
        "credit_case_study", ROOT / "bench" / "credit_case_study.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.shared_data
def test_learned_credit_models_verify_consistently_with_brute_force():
    cs = case_study()
    data = cs.sample_records(n=3000, seed=1)
    assert len(data) == 3000 and cs.CLASS in data.columns
    train, test = cs.split(data, seed=1)
    assert (len(train), len(test)) == (2100, 900)
    states = dict(cs.load_network(NETWORK).states)
    models = cs.learn_models(train, states, n_models=4, seed=3)
    assert {m.structure for m in models} <= {"tan", "chow-liu"}
    for learned in models:
        net = learned.network
        assert net.parents[cs.CLASS] == ()
        diagram, report, accuracy = cs.verify_model(learned, test, counterexamples=3)
        assert 0.5 < accuracy <= 1.0
        table = table_of(diagram)
        index = {f: i for i, f in enumerate(diagram.features)}
        assert len(report.rules) == 11 and len(report.monotonicity) == 2
        spec_rules = cs.load_spec(
            cs.EXAMPLES / "rules.yaml", cs.ClassifierSchema.from_diagram(diagram, net.variables)
        ).rules
        for rule, res in zip(spec_rules, report.rules, strict=True):
            allowed = [
                list(rule.premise.get(f, range(len(s))))
                for f, s in zip(diagram.features, diagram.states, strict=True)
            ]
            bad = [t for t, lab in enumerate(diagram.terminals) if lab not in rule.conclusion]
            assert (res.premise_inputs, res.violating_inputs) == brute_rule(table, allowed, bad)
            for c in res.counterexamples:
                cube = {index[f]: diagram.states[index[f]].index(s) for f, s in c.fixed.items()}
                assert cube_all_violate(table, allowed, cube, bad)
        for res in report.monotonicity:
            i = diagram.features.index(res.feature)
            order = [diagram.states[i].index(s) for s in ("poor", "average", "wealthy")]
            allowed = [list(range(len(s))) for s in diagram.states]
            given = {
                "Worth": "High",
                "Debit": "interval1",
                "Profession": "Medium_income_profession",
                "WorkHistory": "Stable",
                "PaymentHistory": "Excellent",
            }
            for f, s in given.items():
                allowed[index[f]] = [diagram.states[index[f]].index(s)]
            want = brute_monotone(table, i, order, allowed, diagram.positive_terminal, res.kind)
            assert res.holds == want
        assert np.isfinite([r.violating_probability for r in report.rules]).all()
