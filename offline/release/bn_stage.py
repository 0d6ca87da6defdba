"""The BN half of a build: read the network, compile the classifier, verify rules and queries.

The artifact receives the diagram, the rules in the gate's form (``bn/rules.json``: premise
as state indices, conclusion as class states, verdict) and the full verification report.
With ``bn.repair`` the summary (and the report) also hold repair proposals for the violated
rules (:mod:`boxwatch.offline.bn.repair`), each re-verified, their network files going to
the report folder: never applied, never in the artifact; a repaired network is the input of
a new, signed build.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from boxwatch.agent.diagram import DecisionDiagram
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.gate import RuleEntry, encode_rules
from boxwatch.agent.inputs import show_path
from boxwatch.offline.bn.classifier import ClassifierSpec, ResolvedSpec, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier, spec_terminals
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import default_max_memory, format_bytes, memory_guard, parse_size
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.repair import RepairReport, fraction_text, repair
from boxwatch.offline.bn.rules import ClassifierSchema, Rule, Spec, load_spec
from boxwatch.offline.bn.verify import BNVerifier, RuleResult, VerificationReport
from boxwatch.offline.progress import Progress
from boxwatch.offline.release.config import BuildConfig
from boxwatch.offline.release.records import (
    BNSection,
    BNSummary,
    FmoSummary,
    RepairChange,
    RepairProposal,
    RepairReason,
    RepairTarget,
    RuleSummary,
    TiePair,
)

REPAIRS = "repairs"
"""The report folder's subfolder for repair proposals' network files."""


@dataclass
class BNInputs:
    """A validated BN section: network, resolved classifier spec, parsed rules and queries."""

    file: Path
    network: Network
    spec: ResolvedSpec
    rules: Spec
    counterexamples: int
    max_memory: int | None = None
    repair: bool = False
    repair_proposals: int = 1
    repair_seconds: float = 60.0


@dataclass
class BNOutcome:
    """Compiled diagram, gate rules, verification report, and their summaries; with
    ``bn.repair`` the proposals' network files (report-folder paths -> bytes)."""

    diagram: DecisionDiagram
    gate_rules: list[dict[str, Any]]
    verification: dict[str, Any]
    contents: dict[str, Any]
    rule_verdicts: list[dict[str, Any]]
    summary: BNSummary
    files: dict[str, bytes] = field(default_factory=dict)


def schema_for(network: Network, spec: ResolvedSpec) -> ClassifierSchema:
    """What rule files are checked against: the classifier's features, class and terminals."""
    terminals = spec_terminals(network, spec)
    features = {f: network.states[f] for f in spec.order}
    others = [v for v in network.variables if v not in features and v != spec.class_variable]
    return ClassifierSchema(features, spec.class_variable, terminals, others, spec.decision)


def prepare(cfg: BuildConfig) -> BNInputs:
    """Read the network and rule files of ``cfg``'s ``bn`` section; raise all problems at once."""
    b = cfg.spec.bn
    assert b is not None  # the caller checked the config has a bn section
    path = cfg.resolve(b.file)
    if not path.is_file():
        raise ConfigError(f"bn.file: {show_path(path)}: no such file")
    _check_decision(b)
    network = _read_network(path, b)
    spec = resolve_spec(
        network,
        ClassifierSpec(
            class_variable=b.class_,
            positive=b.positive,
            threshold=None if b.threshold is None else float(b.threshold),
            features=b.features,
            order=b.order,
            decision=b.decision,
        ),
    )
    problems: list[str] = []
    max_memory = None
    if b.max_memory is not None:
        try:
            max_memory = parse_size(str(b.max_memory))
        except ValueError as exc:
            problems.append(f"bn.max_memory: {exc}")
    merged = _read_specs(cfg, b, schema_for(network, spec), problems)
    if problems:
        raise ConfigError(problems)
    return BNInputs(
        path,
        network,
        spec,
        merged,
        b.counterexamples,
        max_memory,
        b.repair,
        b.repair_proposals,
        b.repair_seconds,
    )


def _check_decision(b: BNSection) -> None:
    """``positive`` and ``threshold`` go with ``decision: threshold`` only, and both."""
    given = b.positive is not None, b.threshold is not None
    if b.decision == "threshold" and not all(given):
        raise ConfigError(
            "bn: positive and threshold are required with decision: threshold "
            "(or set decision: argmax)"
        )
    if b.decision == "argmax" and any(given):
        raise ConfigError(
            "bn: positive and threshold apply to decision: threshold only; "
            "decision: argmax decides the most probable class state"
        )


def _read_network(path: Path, b: BNSection) -> Network:
    """The network file, parsed within the memory bound compiling will have."""
    try:
        limit = parse_size(str(b.max_memory)) if b.max_memory is not None else default_max_memory()
    except ValueError:
        limit = default_max_memory()  # reported by prepare()
    try:
        with memory_guard(limit):  # parsing is held to the same bound as compiling
            return load_network(path, max_memory=limit)
    except MemoryError:
        raise ConfigError(
            f"bn.file: {show_path(path)}: out of memory while reading it "
            f"(limit {format_bytes(limit)}); raise bn.max_memory"
        ) from None


def _read_specs(
    cfg: BuildConfig, b: BNSection, schema: ClassifierSchema, problems: list[str]
) -> Spec:
    """The rules and FMO files, merged (their problems added to ``problems``)."""
    merged = Spec()
    for key, relative in (("rules", b.rules), ("fmo", b.fmo)):
        if relative is None:
            continue
        rpath = cfg.resolve(relative)
        if not rpath.is_file():
            problems.append(f"bn.{key}: {rpath}: no such file")
            continue
        try:
            part = load_spec(rpath, schema, default_order=merged.state_order)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        merged.rules += part.rules
        merged.queries += part.queries
        merged.state_order.update(part.state_order)
    return merged


# Fields that depend on timing (seconds; which exact engine answered first under a time
# budget): dropped from the artifact, which must be byte-identical across rebuilds.
_UNREPRODUCIBLE = ("seconds", "engine")


def _reproducible(value: Any) -> Any:
    """``value`` without the timing-dependent fields, recursively."""
    if isinstance(value, dict):
        return {k: _reproducible(v) for k, v in value.items() if k not in _UNREPRODUCIBLE}
    if isinstance(value, list):
        return [_reproducible(v) for v in value]
    return value


def run(bn: BNInputs, progress: Progress | None = None) -> BNOutcome:
    """Compile and verify; everything deterministic. ``progress`` shows both phases
    (default: nothing shown)."""
    progress = Progress(mode="off") if progress is None else progress
    with progress.phase("compiling the BN classifier") as phase:
        result = compile_classifier(
            bn.network, bn.spec, max_memory=bn.max_memory, progress=phase.set_done
        )
    d = result.diagram
    checks = len(bn.rules.rules) + len(bn.rules.queries)
    with progress.phase("verifying rules and queries", checks) as phase:
        with BNVerifier(d, network=bn.network) as verifier:
            report = verifier.verify(
                bn.rules, counterexamples=bn.counterexamples, progress=phase.set_done
            )
    schema = ClassifierSchema.from_diagram(d, bn.network.variables)
    gate_rules = encode_rules(
        RuleEntry(rule.name, rule.premise, rule.conclusion, res.verdict)
        for rule, res in zip(bn.rules.rules, report.rules, strict=True)
    )
    figures = result.summary()
    rules = [
        _rule_summary(rule, res, schema, d)
        for rule, res in zip(bn.rules.rules, report.rules, strict=True)
    ]
    fmo = [
        FmoSummary(
            id=m.query,
            feature=m.feature,
            kind=m.kind,
            verdict=m.verdict,
            reason=m.reason,
            given=q.to_dict(schema)["given"],
            witness=m.witness.to_dict() if m.witness else None,
        )
        for q, m in zip(bn.rules.queries, report.monotonicity, strict=True)
    ]
    summary = BNSummary(
        file=str(bn.file),
        class_=d.class_variable,
        decision=d.decision,
        positive=d.positive,
        threshold=d.threshold,
        features=sorted(d.features),
        order=list(d.features),
        terminals=list(d.terminals),
        decided=figures["decided"],
        tie_pairs=[TiePair(states=p["states"], inputs=p["inputs"]) for p in figures["tie_pairs"]],
        states={f: list(s) for f, s in zip(d.features, d.states, strict=True)},
        nodes=figures["nodes"],
        nodes_quasi=figures["nodes_quasi"],
        positives=figures["positives"],
        inputs=figures["inputs"],
        ties=figures["ties"],
        exact_inputs=figures["exact_inputs"],
        certified=figures["certified"],
        seconds=round(figures["seconds"], 4),
        rules=rules,
        fmo=fmo,
    )
    contents = {
        "class": d.class_variable,
        "positive": d.positive,
        "threshold": d.threshold,
        "features": list(d.features),
        "nodes": d.n_nodes,
        "ties": figures["ties"],
    }
    if d.is_argmax:
        contents["decision"] = d.decision
        contents["states"] = list(d.terminals)
    verdicts = [{"id": r.id, "verdict": r.verdict, "violations": r.violations} for r in rules]
    verification = _reproducible(report.to_dict())
    files: dict[str, bytes] = {}
    if bn.repair:
        repairs, files = _repairs(bn, report)
        summary = msgspec.structs.replace(summary, repairs=repairs)
    return BNOutcome(d, gate_rules, verification, contents, verdicts, summary, files)


def _repairs(
    bn: BNInputs, report: VerificationReport
) -> tuple[list[RepairTarget] | UnsetType, dict[str, bytes]]:
    """Repair proposals for the violated rules (written to a temporary folder while they are
    re-verified), as summary records and the files' bytes; none when every rule holds."""
    with tempfile.TemporaryDirectory(prefix="boxwatch-repair-") as tmp:
        got = repair(
            bn.network,
            bn.spec,
            bn.rules,
            out_dir=tmp,
            source=bn.file,
            proposals=bn.repair_proposals,
            max_seconds=bn.repair_seconds,
            max_memory=bn.max_memory,
            original=report,
        )
        files = {f"{REPAIRS}/{p.name}": p.read_bytes() for p in sorted(Path(tmp).iterdir())}
    return (_repair_targets(got) if got.targets else UNSET), files


def _repair_targets(got: RepairReport) -> list[RepairTarget]:
    """The repair report as summary records (numbers as exact decimal strings)."""
    return [
        RepairTarget(
            target=t.name,
            rules=list(t.rules),
            verdict=t.verdict,
            proposals=[
                RepairProposal(
                    changes=[
                        RepairChange(
                            parameter=c.parameter,
                            variable=c.variable,
                            row=dict(c.row),
                            state=c.state,
                            old=fraction_text(c.old),
                            new=fraction_text(c.new),
                            row_old=list(c.row_old),
                            row_new=list(c.row_new),
                        )
                        for c in p.changes
                    ],
                    change=fraction_text(p.change),
                    minimum=None if p.minimum is None else fraction_text(p.minimum),
                    flips=p.flips,
                    reverified=p.reverified,
                    verdicts=dict(p.verdicts),
                    file=f"{REPAIRS}/{Path(p.file).name}",
                )
                for p in t.proposals
            ],
            parameters=t.parameters,
            complete=t.complete,
            no_single_parameter=[
                RepairReason(parameter=i.parameter, rule=i.rule, kind=i.kind, why=i.why)
                for i in (t.proof if not t.single and t.complete else [])
            ],
            pairs_tried=t.pairs_tried,
            pairs_total=t.pairs_total,
        )
        for t in got.targets
    ]


def _rule_summary(
    rule: Rule, res: RuleResult, schema: ClassifierSchema, d: DecisionDiagram
) -> RuleSummary:
    """A rule's verdict, its violating inputs and counterexamples (every feature's states)."""
    premise = rule.to_dict(schema)["premise"]
    return RuleSummary(
        id=rule.name,
        premise=premise,
        conclusion=", ".join(rule.conclusion),
        verdict=res.verdict,
        violations=res.violating_inputs,
        probability=res.violating_probability,
        counterexamples=[
            {
                f: [c.fixed[f]]
                if f in c.fixed
                else list(premise.get(f, d.states[d.features.index(f)]))
                for f in d.features
            }
            for c in res.counterexamples
        ],
    )
