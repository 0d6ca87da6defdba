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

from typing import TYPE_CHECKING

from boxwatch.agent.lazy import lazy_exports

# The public names, by the module that defines them, each imported when first read: the
# config and data readers do not load the pipeline, the estimator or matplotlib.
_EXPORTS = {
    "config": ("BuildConfig", "load_config"),
    "pipeline": ("BuildOutcome", "Prepared", "build", "prepare"),
    "records": ("BuildSummary",),
    "report": ("write_report",),
}

if TYPE_CHECKING:
    from boxwatch.offline.release.config import BuildConfig, load_config
    from boxwatch.offline.release.pipeline import BuildOutcome, Prepared, build, prepare
    from boxwatch.offline.release.records import BuildSummary
    from boxwatch.offline.release.report import write_report
else:
    __getattr__ = lazy_exports(__name__, _EXPORTS)

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
