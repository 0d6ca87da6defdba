"""``boxwatch verify-bn``: check expert rules and monotonicity of a BN classifier with SAT."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import one_line, show_path
from boxwatch.commands.console import EXIT_FAILED, EXIT_USAGE, VerbExit, echo_err, finish
from boxwatch.commands.options import classifier_options, limit_options, progress_option
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import (
    CompileTimeError,
    Deadline,
    default_max_memory,
    format_bytes,
    memory_guard,
)
from boxwatch.offline.bn.rules import ClassifierSchema, Spec, load_spec
from boxwatch.offline.bn.verify import BNVerifier, VerificationReport
from boxwatch.offline.progress import Progress


def _prob(p: float | None) -> str:
    return "-" if p is None else f"{p:.4g}"


def render_report(report: VerificationReport) -> str:
    """Aligned text tables: one row per rule, then one per monotonicity query."""
    out: list[str] = []
    if report.rules:
        rows = [("rule", "verdict", "violating inputs", "P(violating)", "first counterexample")]
        for r in report.rules:
            first = str(r.counterexamples[0]) if r.counterexamples else "-"
            rows.append(
                (
                    r.rule,
                    r.verdict,
                    f"{r.violating_inputs:,} of {r.premise_inputs:,}",
                    _prob(r.violating_probability),
                    first,
                )
            )
        out.append(_align(rows))
    if report.monotonicity:
        rows = [("query", "check", "feature", "verdict", "why / witness")]
        for m in report.monotonicity:
            why = m.reason
            if m.witness is not None:
                fixed = ", ".join(f"{k}={v}" for k, v in m.witness.fixed.items())
                why = f"{m.reason} with {fixed}"
            rows.append((m.query, m.kind, m.feature, m.verdict, why))
        out.append(_align(rows))
    return "\n\n".join(out) if out else "(no rules or queries)"


def _align(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(v.ljust(w) for v, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in rows
    )


def load_specs(rules: Path, fmo: Path | None, schema: ClassifierSchema, deadline: Deadline) -> Spec:
    """Both files, reporting every problem of both at once; FMO inherits rule state orders."""
    problems: list[str] = []
    spec = Spec()
    try:
        spec = load_spec(rules, schema, deadline=deadline)
    except CompileTimeError:
        raise
    except ConfigError as exc:
        problems.extend(exc.problems)
    if fmo is not None:
        try:
            extra = load_spec(fmo, schema, default_order=spec.state_order, deadline=deadline)
            spec = Spec(
                spec.rules + extra.rules,
                spec.queries + extra.queries,
                {**spec.state_order, **extra.state_order},
            )
        except CompileTimeError:
            raise
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return spec


def yaml_file_option(flag: str, dest: str, what: str, **kwargs: Any) -> Callable[..., Any]:
    """An option naming a YAML file; its help reads "YAML file of ``what``"."""
    return click.option(
        flag,
        dest,
        type=click.Path(dir_okay=False, path_type=Path),
        help=f"YAML file of {what}",
        **kwargs,
    )


@click.command("verify-bn")
@classifier_options
@yaml_file_option(
    "--rules",
    "rules_path",
    "if-then rules (and optionally monotonicity queries and state orders); see docs/rules.md.",
    required=True,
)
@yaml_file_option(
    "--fmo",
    "fmo_path",
    "monotonicity queries; uses the state orders of --rules unless it declares its own.",
    default=None,
)
@click.option(
    "--counterexamples",
    "k",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Compact counterexamples per violated rule (K).",
)
@limit_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@progress_option
def verify_bn(
    network_file: Path,
    wanted: ClassifierSpec,
    rules_path: Path,
    fmo_path: Path | None,
    k: int,
    max_memory: int | None,
    max_seconds: float | None,
    as_json: bool,
    progress: Progress,
) -> None:
    """Verify if-then rules and monotonicity of a BN classifier, exhaustively.

    Compiles FILE into its exact decision diagram, encodes it into CNF and asks a SAT
    solver. A violated rule is reported with the exact number of violating inputs, their
    probability under the network, and K compact counterexamples (features not listed may
    take any value the premise allows). FILE is a network file: {formats}. Reading,
    compiling and verifying show their progress on stderr when they run over 2 s (--quiet:
    none); the report goes to stdout.

    Exit status: 0 every rule and query holds; 1 some are violated; 2 invalid input (every
    problem of the rule files is listed, one per line).

    \b
    Examples:
      boxwatch verify-bn credit.net --class CreditWorthiness --positive Positive \\
          --threshold 0.5 --rules examples/credit/rules.yaml --fmo examples/credit/fmo.yaml
      boxwatch verify-bn child.bif.gz --class BirthAsphyxia --positive no --threshold 0.9 \\
          --rules child-rules.yaml --counterexamples 10 --json
      boxwatch verify-bn child.bif.gz --class Disease --decision argmax \\
          --rules examples/child/disease-rules.yaml
    """
    limit = default_max_memory() if max_memory is None else max_memory
    try:
        start = time.perf_counter()
        deadline = Deadline(max_seconds, show_path(network_file), start)
        with memory_guard(limit):
            deadline.enter("reading the network", "give a smaller network")
            with progress.phase("reading the network"):
                network = load_network(network_file, max_memory=limit, deadline=deadline)
            deadline.enter("choosing the feature order", "give --order")
            with progress.phase("choosing the feature order"):
                spec = resolve_spec(network, wanted, deadline=deadline)
            with progress.phase("compiling") as phase:
                compiled = compile_classifier(
                    network, spec, max_memory=limit, deadline=deadline, progress=phase.set_done
                )
            diagram = compiled.diagram
            schema = ClassifierSchema.from_diagram(diagram, network.variables)
            deadline.enter("verifying the rules", "give fewer rules or queries")
            specs = load_specs(rules_path, fmo_path, schema, deadline)
            checks = len(specs.rules) + len(specs.queries)
            with (
                progress.phase("verifying rules and queries", checks) as phase,
                BNVerifier(diagram, network=network, deadline=deadline) as verifier,
            ):
                report = verifier.verify(specs, counterexamples=k, progress=phase.set_done)
    except (ConfigError, MemoryError) as exc:
        raise bn_verb_exit(exc, network_file, limit) from exc
    seconds = time.perf_counter() - start
    if compiled.row_sums is not None and (warning := compiled.row_sums.warning()):
        echo_err(f"warning: {show_path(network_file)}: {warning}")
    if as_json:
        info: dict[str, Any] = {
            **report.to_dict(),
            "file": str(network_file),
            "compile": compiled.summary(),
            "seconds": seconds,
        }
        click.echo(json.dumps(info, indent=2, sort_keys=True))
    else:
        click.echo(render_report(report))
        if compiled.row_sums is not None:
            click.echo(f"\nreading: {compiled.row_sums.text()}")
    n_rules = sum(r.holds for r in report.rules)
    n_mono = sum(m.holds for m in report.monotonicity)
    mono = (
        f", {n_mono} of {len(report.monotonicity)} monotonicity queries hold"
        if report.monotonicity
        else ", no monotonicity queries asked"
    )
    echo_err(
        f"{network_file}: {n_rules} of {len(report.rules)} rules hold{mono} "
        f"({diagram.n_nodes} diagram nodes, {seconds:.2f} s)"
    )
    if not report.all_hold:
        finish(EXIT_FAILED)


def bn_verb_exit(exc: ConfigError | MemoryError, network_file: Path, limit: int) -> VerbExit:
    """How a BN verb (verify-bn, repair-bn) ends on bad input or memory: exit 2, one line per
    problem, the memory limit named."""
    if isinstance(exc, ConfigError):
        return VerbExit(EXIT_USAGE, tuple(one_line(f"error: {p}") for p in exc.problems))
    return VerbExit(
        EXIT_USAGE,
        (
            f"error: {show_path(network_file)}: out of memory (limit {format_bytes(limit)}); "
            "give fewer features or raise --max-memory",
        ),
    )
