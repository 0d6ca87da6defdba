"""``boxwatch repair-bn``: the smallest parameter changes that make a BN classifier's violated
rules hold, written as network files and re-verified exactly."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import click

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import show_path
from boxwatch.commands.console import EXIT_FAILED, echo_err, finish
from boxwatch.commands.options import (
    SecondsParam,
    SizeParam,
    classifier_options,
    progress_option,
)
from boxwatch.commands.verify_bn import bn_verb_exit, load_specs, yaml_file_option
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import Deadline, default_max_memory, memory_guard
from boxwatch.offline.bn.repair import (
    BREAKS,
    CONFLICT,
    DEFAULT_PROPOSALS,
    DEFAULT_SECONDS,
    TOGETHER,
    UNMOVABLE,
    RepairReport,
    TargetResult,
    fraction_text,
    repair,
)
from boxwatch.offline.bn.rules import ClassifierSchema
from boxwatch.offline.bn.verify import BNVerifier
from boxwatch.offline.progress import Phase, Progress


class _Steps:
    """The repair's ``progress(step, done, total)`` calls as phases of a :class:`Progress`:
    one phase per step, opened when the step first reports and closed at the next."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._step = ""
        self._phase: Phase | None = None

    def __call__(self, step: str, done: int, total: int) -> None:
        if step != self._step or self._phase is None:
            self.close()
            self._step = step
            self._phase = self._progress.phase(step, total).__enter__()
        self._phase.set_done(done, total)

    def close(self, ok: bool = True) -> None:
        """End the open step's phase (``ok=False``: it failed, no end line)."""
        if self._phase is not None:
            error = None if ok else RuntimeError
            self._phase.__exit__(error, None, None)
            self._phase = None


def _align(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(v.ljust(w) for v, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in rows
    )


_KINDS = {
    UNMOVABLE: "no value repairs some violating input of {rule}",
    CONFLICT: "inputs of {rule} need values on either side of each other",
    TOGETHER: "the values that repair {rule} leave none for the other violated rules",
    BREAKS: "{why}",
}


def _why(t: TargetResult) -> list[str]:
    """The proof that no single parameter repairs ``t``, grouped by kind of reason."""
    kinds: Counter[str] = Counter()
    first: dict[str, str] = {}
    for item in t.proof:
        kind = _KINDS[item.kind].format(rule=item.rule, why=item.why)
        kinds[kind] += 1
        first.setdefault(kind, f"{item.parameter}: {item.why}")
    lines = [
        f"  no single-parameter repair: for each of the {t.parameters} parameters the set of "
        "values that repairs it is empty (exact):"
    ]
    for kind, n in kinds.most_common():
        lines.append(f"    {n} parameter{'s' if n > 1 else ''}: {kind}; e.g. {first[kind]}")
    return lines


def render(report: RepairReport) -> str:
    """One row per proposal (best first) under its target; the proof where none exists."""
    out: list[str] = []
    head = (
        "target",
        "parameter",
        "old -> new",
        "change",
        "minimum",
        "flips",
        "re-verified",
        "file",
    )
    rows: list[tuple[str, ...]] = [head]
    notes: list[str] = []
    for t in report.targets:
        if not t.proposals:
            none = "no single parameter (proved), no pair found" if t.complete else "none found"
            rows.append((t.name, f"({none})", "", "", "", "", "", ""))
        for i, p in enumerate(t.proposals):
            for j, c in enumerate(p.changes):
                first = j == 0
                rows.append(
                    (
                        t.name if i == 0 and first else "",
                        c.parameter,
                        f"{fraction_text(c.old)} -> {fraction_text(c.new)}",
                        fraction_text(p.change) if first else "",
                        (f"{float(p.minimum):.8g}" if p.minimum is not None else "-")
                        if first
                        else "",
                        f"{p.flips:,}" if first else "",
                        ("yes" if p.reverified else "NO") if first else "",
                        Path(p.file).name if first else "",
                    )
                )
        if not t.single and t.complete:
            notes.append(f"{t.name}:")
            notes.extend(_why(t))
            notes.append(
                f"  pairs: {t.pairs_tried} of {t.pairs_total} tried"
                + (f", {len(t.proposals)} found" if t.proposals else ", none found")
            )
        elif not t.complete:
            notes.append(
                f"{t.name}: the search stopped at --max-seconds after {t.parameters} "
                "parameters: no proof either way"
            )
    out.append(_align(rows))
    if notes:
        out.append("\n".join(notes))
    return "\n\n".join(out)


@click.command("repair-bn")
@classifier_options
@yaml_file_option(
    "--rules",
    "rules_path",
    "if-then rules to repair (the format of verify-bn; see docs/rules.md).",
    required=True,
)
@yaml_file_option(
    "--fmo",
    "fmo_path",
    "monotonicity queries: re-verified on every proposal (not repaired).",
    default=None,
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("repairs"),
    show_default=True,
    help="Directory the proposals are written to (created when missing).",
)
@click.option(
    "--proposals",
    "n_proposals",
    type=click.IntRange(min=1, max=100),
    default=DEFAULT_PROPOSALS,
    show_default=True,
    help="Proposals per violated rule, smallest change first.",
)
@click.option(
    "--max-seconds",
    type=SecondsParam(),
    default=DEFAULT_SECONDS,
    show_default=True,
    help="Search budget: the pair search stops when it is spent (and the single-parameter "
    "analysis, which then proves nothing); the output says how far each got.",
)
@click.option(
    "--max-memory",
    type=SizeParam(),
    default=None,
    help="Memory reading and each compilation may use, e.g. 4G (default: half of this "
    "machine's RAM).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@progress_option
def repair_bn(
    network_file: Path,
    wanted: ClassifierSpec,
    rules_path: Path,
    fmo_path: Path | None,
    out_dir: Path,
    n_proposals: int,
    max_seconds: float,
    max_memory: int | None,
    as_json: bool,
    progress: Progress,
) -> None:
    """Propose the smallest changes of a BN's parameters that make its violated rules hold.

    For each violated rule: the smallest change that makes it hold while every rule that
    held still holds (and, with two or more violated, one that makes every rule hold).
    Change is measured by the largest absolute change of one CPT entry, the row's other
    entries co-varied proportionally (Chan & Darwiche's single-parameter co-variation), then
    by the number of inputs whose decision flips. Single parameters come first, decided
    exactly (rational arithmetic): the proposal is a short decimal strictly inside the set
    of values that repair, and "minimum" is the exact smallest change that parameter allows;
    where no single parameter works the output proves it (why, for each parameter) and a
    search of pairs runs within --max-seconds (not proved minimal). Each proposal is written
    to --out in FILE's format and re-verified with verify-bn's exact machinery; nothing is
    applied: a repaired network is the input of a new, signed build. FILE: {formats}.

    Exit status: 0 no rule violated, or every violated rule has a proposal that
    re-verified; 1 some violated rule has none; 2 invalid input (one line per problem).

    \b
    Examples:
      boxwatch repair-bn child.bif.gz --class Disease --positive Lung --threshold 0.2 \\
          --rules examples/child/lung-rules.yaml --out repairs/
      boxwatch repair-bn child.bif.gz --class Disease --decision argmax \\
          --rules examples/child/disease-rules.yaml --json
    """
    limit = default_max_memory() if max_memory is None else max_memory
    steps = _Steps(progress)
    ok = False
    try:
        start = time.perf_counter()
        deadline = Deadline(None, show_path(network_file), start)
        with memory_guard(limit):
            with progress.phase("reading the network"):
                network = load_network(network_file, max_memory=limit)
            with progress.phase("choosing the feature order"):
                spec = resolve_spec(network, wanted)
            with progress.phase("compiling") as phase:
                compiled = compile_classifier(
                    network, spec, max_memory=limit, progress=phase.set_done
                )
            schema = ClassifierSchema.from_diagram(compiled.diagram, network.variables)
            specs = load_specs(rules_path, fmo_path, schema, deadline)
            checks = len(specs.rules) + len(specs.queries)
            with (
                progress.phase("verifying rules and queries", checks) as phase,
                BNVerifier(compiled.diagram, network=network) as verifier,
            ):
                original = verifier.verify(specs, counterexamples=0, progress=phase.set_done)
            report = repair(
                network,
                spec,
                specs,
                out_dir=out_dir,
                source=network_file,
                proposals=n_proposals,
                max_seconds=max_seconds,
                max_memory=limit,
                original=original,
                progress=steps,
            )
        ok = True
    except (ConfigError, MemoryError) as exc:
        raise bn_verb_exit(exc, network_file, limit) from exc
    finally:
        steps.close(ok)
    if compiled.row_sums is not None and (warning := compiled.row_sums.warning()):
        echo_err(f"warning: {show_path(network_file)}: {warning}")
    if as_json:
        click.echo(json.dumps({**report.to_dict(), "file": str(network_file)}, indent=2))
    elif report.targets:
        click.echo(render(report))
    violated = [name for name, v in report.verdicts.items() if v != "holds"]
    rules = [t for t in report.targets if t.name in violated]
    fixed = [t for t in rules if any(p.reverified for p in t.proposals)]
    made = sum(len(t.proposals) for t in report.targets)
    good = sum(p.reverified for t in report.targets for p in t.proposals)
    if not violated:
        echo_err(f"{network_file}: all {len(report.verdicts)} rules hold: nothing to repair")
        return
    echo_err(
        f"{network_file}: {len(violated)} of {len(report.verdicts)} rules violated; "
        f"{len(fixed)} of them repaired; {made} proposals ({good} re-verified) in "
        f"{show_path(out_dir)} ({report.seconds:.2f} s)"
    )
    if len(fixed) < len(rules):
        finish(EXIT_FAILED)
