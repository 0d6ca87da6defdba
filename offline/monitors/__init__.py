"""Box monitors for a neural network's layers: a scikit-learn estimator and its parts.

::

    from boxwatch.offline.monitors import BoxMonitor

    monitor = BoxMonitor().fit(activations_by_layer, y_true, y_pred)

Modules: :mod:`.estimator` (:class:`BoxMonitor`), :mod:`.taukmeans` (tau-k-means clusters),
:mod:`.coverage` (resolution-box coverage and the tau search), :mod:`.evaluation`
(outcome counts, AUROC, thresholds), :mod:`.params` (parameter domains: validation and
config schema), :mod:`.baselines` (the table of baseline detectors the monitor is compared
with).
"""

from typing import TYPE_CHECKING

from boxwatch.agent.lazy import lazy_exports

# The public names, by the module that defines them, each imported when first read: the
# tau-k-means, coverage and evaluation modules do not load the estimator.
_EXPORTS = {
    "estimator": ("DEFAULT_TAUS", "BoxMonitor", "BoxSweep", "build_sweep"),
}

if TYPE_CHECKING:
    from boxwatch.offline.monitors.estimator import DEFAULT_TAUS, BoxMonitor, BoxSweep, build_sweep
else:
    __getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["DEFAULT_TAUS", "BoxMonitor", "BoxSweep", "build_sweep"]
