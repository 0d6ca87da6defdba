"""The release-pipeline build: one config in, one signed artifact and a report out.

::

    from boxwatch.offline.release import build, load_config, prepare, write_report

    prepared = prepare(load_config("build.yaml"))     # every check, no training yet
    outcome = build(prepared, private_key)             # outcome.artifact (bytes), .summary

Modules: :mod:`.config` (the build config), :mod:`.datasets` (data readers),
:mod:`.pipeline` (prepare, build, policies), :mod:`.monitor_stage` and :mod:`.bn_stage`
(the two halves of the artifact), :mod:`.report` (HTML report and summary).
"""

from boxwatch.offline.release.config import BuildConfig, load_config
from boxwatch.offline.release.pipeline import BuildOutcome, Prepared, build, prepare
from boxwatch.offline.release.report import write_report

__all__ = [
    "BuildConfig",
    "BuildOutcome",
    "Prepared",
    "build",
    "load_config",
    "prepare",
    "write_report",
]
