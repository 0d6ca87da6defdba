"""The release-pipeline build: one config in, one signed artifact and a report out.

::

    from boxwatch.offline.release import build, load_config, prepare, write_report

    prepared = prepare(load_config("build.yaml"))     # every check, no training yet
    outcome = build(prepared, private_key)             # outcome.artifact (bytes), .summary
    write_report(outcome.summary, "report/")           # report.html and summary.json

Modules: :mod:`.records` (the build's data, typed: config sections in, outcomes and the
summary out), :mod:`.config` (the build config), :mod:`.datasets` (data readers),
:mod:`.pipeline` (prepare, build), :mod:`.layer_choice` (``layers: auto``),
:mod:`.monitor_stage` and :mod:`.bn_stage` (the two halves of the artifact),
:mod:`.emitted` (what the agent will emit on the build's data), :mod:`.report` (the HTML
report and ``summary.json``, one module per part of the page).
"""

from boxwatch.offline.release.config import BuildConfig, load_config
from boxwatch.offline.release.pipeline import BuildOutcome, Prepared, build, prepare
from boxwatch.offline.release.records import BuildSummary
from boxwatch.offline.release.report import write_report

__all__ = [
    "BuildConfig",
    "BuildOutcome",
    "BuildSummary",
    "Prepared",
    "build",
    "load_config",
    "prepare",
    "write_report",
]
