"""Box monitors for a neural network's layers: a scikit-learn estimator and its parts.

::

    from boxwatch.offline.monitors import BoxMonitor

    monitor = BoxMonitor().fit(activations_by_layer, y_true, y_pred)

Modules: :mod:`.estimator` (:class:`BoxMonitor`), :mod:`.taukmeans` (tau-k-means clusters),
:mod:`.coverage` (resolution-box coverage and the tau search), :mod:`.evaluation`
(outcome counts, AUROC, thresholds), :mod:`.params` (parameter domains: validation and
config schema).
"""

from boxwatch.offline.monitors.estimator import DEFAULT_TAUS, BoxMonitor, BoxSweep, build_sweep

__all__ = ["DEFAULT_TAUS", "BoxMonitor", "BoxSweep", "build_sweep"]
