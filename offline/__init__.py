"""The offline builder: BN compilation and verification, monitor training, artifact building.

Needs the ``offline`` extra (pgmpy, python-sat, scikit-learn, torch, matplotlib). Four
subpackages, each with a short public API in its ``__init__``:

* :mod:`.bn` -- Bayesian-network classifiers: read, compile to a decision diagram, verify;
* :mod:`.monitors` -- the box-monitor estimator and its parts (tau-k-means, coverage,
  evaluation);
* :mod:`.release` -- the release-pipeline build: config, data sets, BN and monitor stages,
  report;
* :mod:`.refit` -- closing the loop: captured inputs and reviewers' labels joined by id, the
  refit they feed.
"""
