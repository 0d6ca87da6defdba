"""Author the example credit network: the paper's 12 variables and structure, our own CPTs.

SYNTHETIC: the numbers come from the scoring rule below, not from any real lending data.
Variable and state names are the paper's (spelling included), so the same rule files serve
this network and the paper's; each variable's states are listed from least to most
favourable for the applicant, the ordinal order ``rules.yaml`` declares:

* PaymentHistory: NoAceptable < Without_Reference < Aceptable < Excellent  (3 = Excellent)
* WorkHistory: Unjustified_no_work < Justified_no_work < Unstable < Stable (3 = Stable)
* Debit, Income, Age: amounts increasing, interval1 < interval2 < interval3
  (Debit 0 = lowest debt)
* Assets: poor < average < wealthy; Worth: Low < Medium < High (2 = High)
* Profession: low < medium < high income (1 = medium income)
* Reliability, RatioDebInc, FutureIncome: the unfavourable state first
* CreditWorthiness: Negative, Positive

A child's distribution over its ordered states is a softmax of ``sharpness * (goodness -
state position)`` where goodness is a weighted mean of the parents' normalised positions,
so better parents make better states likelier. Run ``python examples/credit/make_bn.py``
to regenerate ``credit.net`` (Hugin format); the output is committed.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

STATES: dict[str, list[str]] = {
    "PaymentHistory": ["NoAceptable", "Without_Reference", "Aceptable", "Excellent"],
    "WorkHistory": ["Unjustified_no_work", "Justified_no_work", "Unstable", "Stable"],
    "Reliability": ["Unreliable", "Reliable"],
    "Debit": ["interval1", "interval2", "interval3"],
    "Income": ["interval1", "interval2", "interval3"],
    "RatioDebInc": ["Unfavorable", "Favorable"],
    "Assets": ["poor", "average", "wealthy"],
    "Worth": ["Low", "Medium", "High"],
    "Profession": ["Low_income_profession", "Medium_income_profession", "High_income_profession"],
    "FutureIncome": ["Not_promissing", "Promissing"],
    "Age": ["interval1", "interval2", "interval3"],
    "CreditWorthiness": ["Negative", "Positive"],
}

# child -> (parents, weights on the parents' goodness; negative = more is worse, sharpness)
PARENTS: dict[str, tuple[list[str], list[float], float]] = {
    "Reliability": (["PaymentHistory", "WorkHistory"], [0.65, 0.35], 5.0),
    "RatioDebInc": (["Debit", "Income"], [-0.6, 0.4], 6.0),
    "Worth": (["Income", "Assets"], [0.4, 0.6], 5.0),
    "FutureIncome": (["Worth", "Profession"], [0.5, 0.5], 4.0),
    "CreditWorthiness": (
        ["Reliability", "RatioDebInc", "FutureIncome", "Age"],
        [0.3, 0.45, 0.17, 0.08],
        7.0,
    ),
}
PRIORS: dict[str, list[float]] = {
    "PaymentHistory": [0.1, 0.2, 0.4, 0.3],
    "WorkHistory": [0.1, 0.15, 0.3, 0.45],
    "Debit": [0.4, 0.35, 0.25],
    "Income": [0.3, 0.45, 0.25],
    "Assets": [0.35, 0.45, 0.2],
    "Profession": [0.3, 0.45, 0.25],
    "Age": [0.3, 0.45, 0.25],
}


def cpt(child: str) -> np.ndarray:
    """Table of shape (*parent cards, child card): P(child | parents) by the scoring rule."""
    parents, weights, sharpness = PARENTS[child]
    cards = [len(STATES[p]) for p in parents]
    k = len(STATES[child])
    table = np.empty((*cards, k))
    positions = np.arange(k) / (k - 1)
    for combo in itertools.product(*(range(c) for c in cards)):
        goodness = sum(
            w * (idx / (c - 1) if w > 0 else 1 - idx / (c - 1))
            for w, idx, c in zip(weights, combo, cards, strict=True)
        ) / sum(abs(w) for w in weights)
        logits = -sharpness * np.abs(goodness - positions)
        p = np.exp(logits - logits.max())
        table[combo] = np.round(p / p.sum(), 6)
        table[combo][-1] = 1.0 - table[combo][:-1].sum()
    return table


def _fmt_rows(table: np.ndarray) -> str:
    if table.ndim == 1:
        return "(" + " ".join(f"{v:.6f}" for v in table) + ")"
    return "(" + "".join(_fmt_rows(sub) for sub in table) + ")"


def render() -> str:
    """The whole network in Hugin .net syntax."""
    out = ["net", "{", "}"]
    for name, states in STATES.items():
        quoted = " ".join(f'"{s}"' for s in states)
        out += [f"node {name}", "{", f"states = ( {quoted} );", "}"]
    for name in STATES:
        if name in PARENTS:
            parents = PARENTS[name][0]
            out += [
                f"potential ( {name} | {' '.join(parents)} )",
                "{",
                f"data = ({_fmt_rows(cpt(name))}) ;",
                "}",
            ]
        else:
            out += [
                f"potential ( {name} |  )",
                "{",
                f"data = ({_fmt_rows(np.array(PRIORS[name]))}) ;",
                "}",
            ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    (HERE / "credit.net").write_text(render())
    print(f"wrote {HERE / 'credit.net'}")
