"""``boxwatch compile-bn``: compile a Bayesian-network classifier and report its diagram."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import show_path
from boxwatch.commands.console import EXIT_USAGE, echo_err, fail
from boxwatch.commands.options import classifier_options, limit_options, progress_option
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import (
    MAX_TIE_PAIRS,
    METHODS,
    CompileResult,
    compile_classifier,
)
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import Deadline, default_max_memory, format_bytes, memory_guard
from boxwatch.offline.bn.plan import CompileLimitError
from boxwatch.offline.progress import Progress


def _table(result: CompileResult, parse_seconds: float) -> str:
    d = result.diagram
    per_level = "\n".join(
        f"  {i:>3}  {f:<28} {len(d.states[i]):>5} {q:>8} {r:>8}"
        for i, (f, q, r) in enumerate(
            zip(d.features, result.nodes_quasi_per_level, result.nodes_per_level, strict=True)
        )
    )
    if d.is_argmax:
        decided = ", ".join(f"{k} {v:,}" for k, v in (result.decided or {}).items())
        pairs = ", ".join(f"{a}/{b} {n:,}" for (a, b), n in (result.tie_pairs or {}).items())
        if not result.tie_pairs_counted:
            pairs = f"pairs not counted (more than {MAX_TIE_PAIRS:,} tied pairs)"
        head = (
            f"classifier   argmax_c P({d.class_variable} = c | x)\n"
            f"method       {result.method}\n"
            f"nodes        {result.nodes} reduced, {result.nodes_quasi} quasi-reduced "
            f"(internal), {result.edges} edges\n"
            f"decided      {decided} (of {result.inputs:,} inputs)\n"
            f"ties         {result.ties:,} (states within {result.tie_tolerance:g} of the "
            f"largest posterior, decided the lowest state index){': ' + pairs if pairs else ''}\n"
            f"impossible   {result.impossible:,} (probability 0, decided {d.terminals[0]})\n"
        )
    else:
        head = (
            f"classifier   P({d.class_variable} = {d.positive} | x) >= {d.threshold:g}\n"
            f"method       {result.method}\n"
            f"nodes        {result.nodes} reduced, {result.nodes_quasi} quasi-reduced "
            f"(internal), {result.edges} edges\n"
            f"positives    {result.positives:,} of {result.inputs:,} inputs\n"
            f"ties         {result.ties:,} (posterior exactly T, decided positive)\n"
            f"exact path   {result.exact_inputs:,} inputs within the float error bound, "
            "decided in exact rational arithmetic\n"
            f"exact        {_exactness(result)}\n"
            f"impossible   {result.impossible:,} (probability 0, decided negative)\n"
        )
    reading = result.row_sums.text() if result.row_sums else "-"
    return (
        head + f"constant     {'yes' if d.root < d.n_terminals else 'no'}\n"
        f"reading      {reading}\n"
        f"seconds      {result.seconds:.4f} compile, {parse_seconds:.4f} parse\n"
        f"estimate     {result.estimate.text() if result.estimate else '-'}\n"
        f"  lvl  feature                      states    quasi  reduced\n{per_level}"
    )


def _exactness(result: CompileResult) -> str:
    """Whether the diagram is the classifier of the network as read, in one line."""
    if result.certified:
        return "yes: the diagram equals the classifier of the network as read with P >= T"
    return (
        f"NO: {result.uncertified:,} inputs within the {result.method} route's float error "
        "bound were too many to recompute exactly; decided positive (P within rounding of T)"
    )


@click.command("compile-bn")
@classifier_options
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="auto",
    show_default=True,
    help="joint: the joint table (fast while it fits); decompose: split the "
    "features (for huge feature spaces); jointree: messages along a chain of cuts, "
    "one block of features at a time, partial inputs decided early; auto: the route "
    "estimated fastest among those within the limits.",
)
@limit_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@progress_option
def compile_bn(
    network_file: Path,
    wanted: ClassifierSpec,
    method: str,
    max_memory: int | None,
    max_seconds: float | None,
    as_json: bool,
    progress: Progress,
) -> None:
    """Compile a BN classifier into an exact ordered decision diagram and report its size.

    FILE is a network file: {formats}. The figures (reduced and quasi-reduced node counts, positives, ties, the
    route's estimate) go to stdout.

    Decisions are exact: the diagram is P(class = positive | x) >= T with every CPT
    number the decimal written in FILE, each CPT row divided by its sum ("reading": rows
    off 1 by more than 1e-6 draw a warning), and T as typed. Inputs whose
    float posterior lies within the computation's error bound of T are recomputed in exact
    rational arithmetic ("exact path"); "ties" counts posteriors exactly T (decided
    positive). A route that cannot certify every decision says so ("exact  NO").

    Each route (joint table, or a split of the features at the cheapest cut) is sized
    before it starts; the fastest one within --max-memory (and --max-seconds) runs (reading,
    ordering and compiling show their progress on stderr when they run over 2 s; --quiet
    shows none), else the fastest whose estimate is within its stated accuracy of the limits
    (2x memory, 3x time). When none is, or memory runs out anyway, or the command runs past
    --max-seconds (reading, planning or in a route), it exits 2 with one line naming the
    estimates and the limits (or how far it got).

    \b
    Examples:
      boxwatch compile-bn alarm.bif.gz --class DISCONNECT --positive FALSE --threshold 0.9
      boxwatch compile-bn child.bif.gz --class BirthAsphyxia --positive no \\
          --threshold 0.9 --order LVHreport,GruntingReport,RUQO2,LowerBodyO2,XrayReport,Age,CO2Report
      boxwatch compile-bn credit.net --class CreditWorthiness --positive Positive \\
          --threshold 0.5 --json
      boxwatch compile-bn child.bif.gz --class Disease --decision argmax
      boxwatch compile-bn munin1.bif.gz --class DIFFN_SEV --positive NO --threshold 0.5 \\
          --max-memory 4G --max-seconds 120
    """
    limit = default_max_memory() if max_memory is None else max_memory
    try:
        with memory_guard(limit):
            start = time.perf_counter()
            deadline = Deadline(max_seconds, show_path(network_file), start)
            deadline.enter("reading the network", "give a smaller network")
            with progress.phase("reading the network"):
                network = load_network(network_file, max_memory=limit, deadline=deadline)
            parse_seconds = time.perf_counter() - start
            deadline.enter("choosing the feature order", "give --order")
            with progress.phase("choosing the feature order"):
                spec = resolve_spec(network, wanted, deadline=deadline)
            with progress.phase("compiling") as phase:
                result = compile_classifier(
                    network,
                    spec,
                    method=method,
                    max_memory=limit,
                    progress=phase.set_done,
                    deadline=deadline,
                )
    except ConfigError as exc:
        fail(exc, EXIT_USAGE)
    except MemoryError:
        fail(
            CompileLimitError(
                f"{show_path(network_file)}: out of memory (limit {format_bytes(limit)}); "
                "give fewer features or raise --max-memory"
            ),
            EXIT_USAGE,
        )
    if result.row_sums is not None and (warning := result.row_sums.warning()):
        echo_err(f"warning: {show_path(network_file)}: {warning}")
    if as_json:
        info = {**result.summary(), "parse_seconds": parse_seconds, "file": str(network_file)}
        click.echo(json.dumps(info, indent=2, sort_keys=True))
    else:
        click.echo(_table(result, parse_seconds))
    echo_err(
        f"{network_file}: compiled {len(spec.order)} features into {result.nodes} nodes "
        f"in {result.seconds:.3f} s"
    )
