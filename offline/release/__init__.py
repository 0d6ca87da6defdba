"""The release-pipeline build: one config in, one signed artifact and a report out.

::

    from boxwatch.offline.release import build, load_config, prepare, write_report

    prepared = prepare(load_config("build.yaml"))     # every check, no training yet
    outcome = build(prepared, private_key)             # outcome.artifact (bytes), .summary

Modules: :mod:`.config` (the build config), :mod:`.datasets` (data readers),
:mod:`.pipeline` (prepare, build, policies), :mod:`.monitor_stage` and :mod:`.bn_stage`
(the two halves of the artifact), :mod:`.report` (HTML report and summary).
"""

from typing import TYPE_CHECKING

from boxwatch.agent.lazy import lazy_exports

# The public names, by the module that defines them, each imported when first read: the
# config and data readers do not load the pipeline, the estimator or matplotlib.
_EXPORTS = {
    "config": ("BuildConfig", "load_config"),
    "pipeline": ("BuildOutcome", "Prepared", "build", "prepare"),
    "report": ("write_report",),
}

if TYPE_CHECKING:
    from boxwatch.offline.release.config import BuildConfig, load_config
    from boxwatch.offline.release.pipeline import BuildOutcome, Prepared, build, prepare
    from boxwatch.offline.release.report import write_report
else:
    __getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "BuildConfig",
    "BuildOutcome",
    "Prepared",
    "build",
    "load_config",
    "prepare",
    "write_report",
]
