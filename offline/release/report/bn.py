"""The report's Bayesian-network section: the compiled diagram, the rules with their
counterexamples (drawn for the violated ones), the monotonicity queries, and (``bn.repair``)
the repair proposals for the violated rules."""

from __future__ import annotations

from collections import Counter

from boxwatch.offline.release.records import BNSummary, BuildSummary, RepairTarget
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
    repairs = given(bn.repairs)
    if repairs is not None:
        out.append("<h3>Repair proposals (not applied)</h3>")
        out.append(_repairs(repairs))
    return "".join(out) + "</section>"


def _repairs(targets: list[RepairTarget]) -> str:
    """One row per proposal under its violated rule; the proof where no single parameter
    repairs it."""
    rows = []
    notes = []
    for j, t in enumerate(targets):
        if not t.proposals:
            rows.append(
                (text(f"repair-{j}-target", t.target), esc(f"none ({t.verdict})"), *[""] * 6)
            )
        for k, p in enumerate(t.proposals):
            rows.append(
                (
                    text(f"repair-{j}-target", t.target) if k == 0 else "",
                    "<br>".join(esc(c.parameter) for c in p.changes),
                    "<br>".join(esc(f"{c.old} \u2192 {c.new}") for c in p.changes),
                    num(f"repair-{j}-{k}-change", float(p.change)),
                    num(f"repair-{j}-{k}-minimum", None if p.minimum is None else float(p.minimum)),
                    num(f"repair-{j}-{k}-flips", p.flips),
                    f'<span id="repair-{j}-{k}-reverified">{"yes" if p.reverified else "no"}</span>',
                    f"<code>{esc(p.file)}</code>",
                )
            )
        if t.no_single_parameter:
            kinds = Counter(r.kind for r in t.no_single_parameter)
            shown = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
            notes.append(
                f"<li>{esc(t.target)}: no single parameter repairs it (exact, each of the "
                f"{t.parameters} parameters: {esc(shown)}; summary.json lists each one's "
                f"reason); pairs tried: {t.pairs_tried} of {t.pairs_total}.</li>"
            )
    out = [
        "<p>The smallest change of the network's parameters that makes each violated rule "
        "hold while the rules that held still hold: the largest absolute change of one CPT "
        "entry, the row's other entries co-varied proportionally, then the inputs whose "
        "decision flips. Each proposal was written as a network file (in the report "
        "folder) and re-verified by compiling and verifying it. Nothing was applied: a "
        "repaired network is the input of a new, signed build.</p>",
        table(
            (
                "Rule",
                "Parameter",
                "Old \u2192 new",
                "Change",
                "Minimum",
                "Flipped inputs",
                "Re-verified",
                "File",
            ),
            rows,
            numeric=(False, False, False, True, True, True, False, False),
            table_id="bn-repairs-table",
        ),
    ]
    if notes:
        out.append(f"<ul>{''.join(notes)}</ul>")
    return "".join(out)


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
