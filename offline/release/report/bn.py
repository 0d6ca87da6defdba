"""The report's Bayesian-network section: the compiled diagram, the rules with their
counterexamples (drawn for the violated ones) and the monotonicity queries."""

from __future__ import annotations

from boxwatch.offline.release.records import BNSummary, BuildSummary
from boxwatch.offline.release.report.figures import (
    MAX_COUNTEREXAMPLES_DRAWN,
    restriction,
    rule_figure,
)
from boxwatch.offline.release.report.markup import (
    MISSING,
    cube_text,
    esc,
    figure,
    given,
    num,
    omitted,
    table,
    text,
    witness_text,
)


def bn_section(summary: BuildSummary) -> str:
    """The diagram's figures, the rules and the FMO queries (or why the section is empty)."""
    bn = given(summary.bn)
    out = ['<section id="bn"><h2>Bayesian-network classifier</h2>']
    if bn is None:
        out.append(
            omitted(
                "bn-omitted", "No Bayesian network in this build (the config has no BN section)."
            )
        )
        return "".join(out) + "</section>"
    out.append("<h3>Compiled decision diagram</h3>")
    out.append(_diagram(bn))
    out.append("<h3>If-then rules</h3>")
    out.append(_rules(bn))
    out.append("<h3>Feature monotonicity (FMO) queries</h3>")
    out.append(_fmo(bn))
    return "".join(out) + "</section>"


def _diagram(bn: BNSummary) -> str:
    decision = given(bn.decision) or "threshold"
    rows = [
        ("File", f"<code>{text('bn-file', bn.file)}</code>"),
        ("Class variable", text("bn-class", bn.class_)),
        ("Decision", text("bn-decision", decision)),
        ("Positive state", text("bn-positive", bn.positive)),
        ("Decision threshold", num("bn-threshold", bn.threshold)),
        ("Features", esc(", ".join(map(str, bn.features)))),
        ("Variable order", esc(", ".join(map(str, bn.order)))),
        ("Diagram nodes", num("bn-nodes", bn.nodes)),
        ("Quasi-reduced nodes", num("bn-nodes-quasi", bn.nodes_quasi)),
        ("Positive inputs", num("bn-positives", bn.positives)),
        ("All inputs", num("bn-inputs", bn.inputs)),
        (
            "Ties at the threshold" if decision != "argmax" else "Ties between states",
            num("bn-ties", bn.ties),
        ),
        ("Compile time (s)", num("bn-seconds", bn.seconds)),
    ]
    if decision == "argmax":
        decided = given(bn.decided) or {}
        pairs = given(bn.tie_pairs) or []
        rows.insert(
            -1,
            ("Inputs decided per state", esc(", ".join(f"{k}: {v:,}" for k, v in decided.items()))),
        )
        rows.insert(
            -1,
            (
                "Ties per pair of states",
                esc(", ".join(f"{'/'.join(p.states)}: {p.inputs:,}" for p in pairs) or "none"),
            ),
        )
    return table(("Quantity", "Value"), [(esc(k), v) for k, v in rows], table_id="bn-compile-table")


def _rules(bn: BNSummary) -> str:
    if not bn.rules:
        return omitted("bn-rules-omitted", "No rules were checked.")
    rows = []
    for j, r in enumerate(bn.rules):
        first = (
            cube_text(
                restriction(r.counterexamples[0], r.premise, bn.states),
                bn.features,
                "any input the premise allows",
            )
            if r.counterexamples
            else MISSING
        )
        rows.append(
            (
                text(f"rule-{j}-id", r.id),
                cube_text(r.premise, bn.features),
                esc(f"{bn.class_} = {r.conclusion}"),
                f'<span id="rule-{j}-verdict" class="{esc(r.verdict)}">{esc(r.verdict)}</span>',
                num(f"rule-{j}-violations", r.violations),
                num(f"rule-{j}-probability", r.probability),
                first,
            )
        )
    out = [
        table(
            (
                "Rule",
                "Premise",
                "Conclusion",
                "Verdict",
                "Violating inputs",
                "Probability",
                "First counterexample",
            ),
            rows,
            numeric=(False, False, False, False, True, True, False),
            table_id="bn-rules-table",
        )
    ]
    for j, r in enumerate(bn.rules):
        if r.verdict == "violated":
            total = len(r.counterexamples)
            shown = min(total, MAX_COUNTEREXAMPLES_DRAWN)
            out.append(
                figure(
                    f"fig-rule-{j}",
                    rule_figure(bn, r),
                    f"rule {r.id} counterexamples",
                    f"Rule {esc(r.id)} (violated) \u2014 query: green states are allowed "
                    f"by the premise, red ones excluded; the class should be "
                    f"{esc(bn.class_)} = {esc(r.conclusion)}. Counterexamples "
                    f"drawn: {shown} of {total}; their blue states give another class, grey "
                    f"means any allowed state.",
                )
            )
    return "".join(out)


def _fmo(bn: BNSummary) -> str:
    if not bn.fmo:
        return omitted("bn-fmo-omitted", "No FMO queries were checked.")
    rows = [
        (
            text(f"fmo-{j}-id", q.id),
            esc(q.feature),
            esc(q.kind),
            cube_text(q.given, bn.features, "any"),
            f'<span id="fmo-{j}-verdict" class="{esc(q.verdict)}">{esc(q.verdict)}</span>',
            esc(q.reason),
            "\u2014" if q.witness is None else witness_text(q.witness),
        )
        for j, q in enumerate(bn.fmo)
    ]
    return table(
        ("Query", "Feature", "Kind", "Given", "Verdict", "Reason", "Witness"),
        rows,
        table_id="bn-fmo-table",
    )
