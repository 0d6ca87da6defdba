"""Credit case study (BN paper Sec. 5.2, Tables 3-4): learn 10 BNs, verify expert rules.

A stand-in for the paper's Credit10k: 10,000 records sampled (seeded) from
``../shared/data/bn/credit.net``; the generator ships, not the data. Split 7:3. Each of 10
networks: structure by pgmpy's TreeSearch on a random 10% of the training split ("tan" with
CreditWorthiness as class, or "chow-liu" rooted at CreditWorthiness, chosen by seed, so the
class only has outgoing edges), parameters on the whole training split (maximum likelihood
or Bayesian BDeu, chosen by seed). Each is compiled into its decision diagram for
``P(CreditWorthiness = Positive | other 11 variables) >= 0.5`` and checked against the 11
rules of Table 3 (``examples/credit/rules.yaml``) and the FMO query of Sec. 5.2
(``examples/credit/fmo.yaml``). Prints a table like Table 4, plus the rules' compliance
under two other readings of their ordinal indices (network file order, alphabetical).

Run: ``.venv/bin/python bench/credit_case_study.py`` (about a minute on 2 cores).
Writes its table to bench/RESULTS.md under "## credit_case_study".
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_section

from boxwatch.offline.bn.classifier import ClassifierSpec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.rules import ClassifierSchema, Spec, load_spec, parse_spec
from boxwatch.offline.bn.verify import BNVerifier, VerificationReport

ROOT = Path(__file__).resolve().parents[1]
NETWORK = ROOT.parent / "shared" / "data" / "bn" / "credit.net"
EXAMPLES = ROOT / "examples" / "credit"
HEADING = "## credit_case_study (bench/credit_case_study.py)"
CLASS = "CreditWorthiness"
POSITIVE = "Positive"
THRESHOLD = 0.5
N_RECORDS = 10_000
N_MODELS = 10
SEED = 0


@dataclass
class LearnedModel:
    """One learned BN and how it was learned."""

    index: int
    structure: str
    estimator: str
    network: Network


def sample_records(path: Path = NETWORK, n: int = N_RECORDS, seed: int = SEED) -> Any:
    """``n`` records (pandas DataFrame of state names) forward-sampled from the network."""
    from pgmpy.sampling import BayesianModelSampling

    model = load_network(path).to_pgmpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = BayesianModelSampling(model).forward_sample(size=n, seed=seed, show_progress=False)
    return data[sorted(data.columns)].astype(str)


def split(data: Any, seed: int = SEED, train_fraction: float = 0.7) -> tuple[Any, Any]:
    """Seeded 7:3 split into (train, test)."""
    order = np.random.default_rng(seed).permutation(len(data))
    cut = int(round(train_fraction * len(data)))
    return data.iloc[order[:cut]].reset_index(drop=True), data.iloc[order[cut:]].reset_index(
        drop=True
    )


def learn_models(
    train: Any, states: dict[str, tuple[str, ...]], n_models: int = N_MODELS, seed: int = SEED
) -> list[LearnedModel]:
    """The paper's recipe: tree structure on a 10% sample, parameters on all of ``train``."""
    from pgmpy.estimators import BayesianEstimator, MaximumLikelihoodEstimator, TreeSearch
    from pgmpy.models import DiscreteBayesianNetwork

    from boxwatch.offline.bn.formats import from_pgmpy

    names = {v: list(s) for v, s in states.items()}
    out = []
    for b in range(n_models):
        rng = np.random.default_rng([seed, b])
        sample = train.sample(frac=0.1, random_state=int(rng.integers(2**31)))
        structure = str(rng.choice(["tan", "chow-liu"]))
        estimator = str(rng.choice(["mle", "bayes"]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if structure == "tan":
                dag = TreeSearch(sample, n_jobs=1).estimate(
                    estimator_type="tan", class_node=CLASS, show_progress=False
                )
            else:
                dag = TreeSearch(sample, root_node=CLASS, n_jobs=1).estimate(
                    estimator_type="chow-liu", show_progress=False
                )
            model = DiscreteBayesianNetwork(dag.edges())
            model.add_nodes_from(train.columns)
            if estimator == "mle":
                cpds = MaximumLikelihoodEstimator(model, train, state_names=names).get_parameters()
            else:
                cpds = BayesianEstimator(model, train, state_names=names).get_parameters(
                    prior_type="BDeu", equivalent_sample_size=10
                )
            model.add_cpds(*cpds)
        out.append(LearnedModel(b, structure, estimator, from_pgmpy(model)))
    return out


def verify_model(
    learned: LearnedModel,
    test: Any,
    rules: Path = EXAMPLES / "rules.yaml",
    fmo: Path = EXAMPLES / "fmo.yaml",
    counterexamples: int = 2,
    reading: str = "declared",
) -> tuple[Any, VerificationReport, float]:
    """Compile, check rules + FMO; returns (diagram, report, test accuracy).

    ``reading`` ``"declared"`` uses the state orders declared in the rules file; ``"file"``
    (the network file's order) and ``"alphabetical"`` (the order pgmpy gives states learned
    from data) drop them and the FMO queries: sensitivity checks of the rules' reading.
    """
    net = learned.network
    features = [v for v in net.variables if v != CLASS]
    diagram = compile_classifier(
        net, ClassifierSpec(CLASS, POSITIVE, THRESHOLD, features=features)
    ).diagram
    schema = ClassifierSchema.from_diagram(diagram, net.variables)
    if reading == "declared":
        spec = load_spec(rules, schema)
        extra = load_spec(fmo, schema, default_order=spec.state_order)
        spec = Spec(spec.rules, extra.queries, spec.state_order)
    else:
        data = yaml.safe_load(rules.read_text())
        data.pop("states", None)
        if reading == "alphabetical":
            data["states"] = {f: sorted(s) for f, s in schema.features.items()}
        spec = Spec(parse_spec(data, schema, source=str(rules)).rules, [], {})
    with BNVerifier(diagram, network=net) as verifier:
        report = verifier.verify(spec, counterexamples=counterexamples)
    X = diagram.encode(test[list(diagram.features)].to_dict("records"))  # records: features only
    predicted = np.asarray(diagram.terminals)[diagram.predict(X)]
    accuracy = float((predicted == test[CLASS].to_numpy()).mean())
    return diagram, report, accuracy


def main() -> None:
    if not NETWORK.is_file():
        print(f"skipped: {NETWORK} is absent (../shared data not available)", file=sys.stderr)
        return
    logging.getLogger("pgmpy").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    data = sample_records()
    train, test = split(data)
    states = dict(load_network(NETWORK).states)
    models = learn_models(train, states)
    t_learn = time.perf_counter() - t0
    rows = []
    for m in models:
        diagram, report, acc = verify_model(m, test)
        held = sum(r.holds for r in report.rules)
        fmo = report.monotonicity[0]
        _, plain, _ = verify_model(m, test, reading="file")
        _, alpha, _ = verify_model(m, test, reading="alphabetical")
        rows.append((m, diagram, report, held, acc, fmo, plain, alpha))
    cols = ["", *[f"BN{m.index}" for m, *_ in rows]]
    table = [
        cols,
        ["structure", *[m.structure for m, *_ in rows]],
        ["parameters", *[m.estimator for m, *_ in rows]],
        ["diagram nodes", *[str(d.n_nodes) for _, d, *_ in rows]],
        ["rules hold (UNSAT)", *[str(r[3]) for r in rows]],
        ["rules violated (SAT)", *[str(len(r[2].rules) - r[3]) for r in rows]],
        ["compliance %", *[f"{100 * r[3] / len(r[2].rules):.2f}" for r in rows]],
        ["rules hold, file state order", *[str(sum(x.holds for x in r[6].rules)) for r in rows]],
        ["rules hold, alphabetical order", *[str(sum(x.holds for x in r[7].rules)) for r in rows]],
        ["test accuracy %", *[f"{100 * r[4]:.2f}" for r in rows]],
        ["FMO Assets (Sec. 5.2)", *[r[5].verdict for r in rows]],
        ["Assets increasing", *[r[2].monotonicity[1].verdict for r in rows]],
    ]
    lines = ["| " + " | ".join(row) + " |" for row in table]
    lines.insert(1, "|" + "---|" * len(cols))
    per_rule = [
        "| rule | " + " | ".join(f"BN{m.index}" for m, *_ in rows) + " |",
        "|" + "---|" * (len(rows) + 1),
    ]
    for k, rule in enumerate(rows[0][2].rules):
        cells = []
        for r in rows:
            res = r[7].rules[k]
            cells.append(
                "holds"
                if res.holds
                else f"{res.violating_inputs:,} ({100 * (res.violating_probability or 0):.2f}%)"
            )
        per_rule.append(f"| {rule.rule} | " + " | ".join(cells) + " |")
    example = next(
        ((r[0], res) for r in rows for res in r[7].rules if not res.holds and res.counterexamples),
        None,
    )
    if example is not None:
        m, res = example
        per_rule += [
            "",
            f"Example (alphabetical order, BN{m.index}, {res.rule}): "
            f"{res.violating_inputs:,} of {res.premise_inputs:,} premise inputs "
            "violate; compact counterexamples: "
            + "; ".join(f"{{{c}}} ({c.inputs} inputs)" for c in res.counterexamples)
            + " (an empty cube: every premise input violates)"
            * (res.counterexamples[0].n_fixed == 0),
        ]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join(
        [
            f"_{when}; this machine: {os.cpu_count()} cores, {mem:.0f} GB RAM, Python "
            f"{platform.python_version()}; sampling + learning {t_learn:.0f} s, total "
            f"{time.perf_counter() - t0:.0f} s_",
            "",
            f"{N_RECORDS:,} records sampled from credit.net (seed {SEED}), split 7:3; classifier "
            f"P({CLASS} = {POSITIVE} | 11 features) >= {THRESHOLD}; rules: "
            "examples/credit/rules.yaml (Table 3, state orders declared there). The paper's "
            "Table 4 came from its own Credit10k sample and seeds: compare the shape, not the "
            "numbers.",
            "",
            *lines,
            "",
            "The declared reading (rules.yaml) is the issue's; the network file's order and the "
            "alphabetical order pgmpy gives states learned from data (likely the paper code's "
            "indices) show how much the reading matters. Violating inputs per rule under the "
            "alphabetical reading (share of BN probability mass in brackets):",
            "",
            *per_rule,
        ]
    )
    print(text)
    write_section(HEADING, text)


if __name__ == "__main__":
    main()
