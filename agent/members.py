"""The artifact's member names: the one place that spells them.

The builder writes these members and the agent reads them (``tests/agent/test_members.py``
checks that nobody else spells them out):

* :data:`MODEL_SPEC` -- model format, input preprocessing, pooling, monitored layers,
  class names and model version;
* :data:`BOXES_PREFIX` ``.json`` + ``.npz`` -- the fitted box monitors;
* :data:`DIAGRAM_META` + :data:`DIAGRAM_ARRAYS` -- the compiled BN classifier;
* :data:`RULES` -- verified rules for the gate (format: :mod:`boxwatch.agent.gate`);
* :data:`VERIFICATION` -- the BN's full verification report (classifier, rules,
  monotonicity), for whoever audits the artifact; the agent does not read it;
* :data:`REFIT` -- in an artifact ``refit`` made from a parent (``offline/refit/refit.py``):
  the parent's id and digest and what the labelled captures changed; the agent does not
  read it;
* :data:`REFIT_ROWS` -- beside it: the labelled captured inputs its boxes were clustered on
  (raw inputs, labelled and predicted classes), so that refitting the child again keeps
  them; the agent does not read it.
* :data:`TRAIN_PREDICTIONS` -- each training row's predicted class and the training set's
  digest (format: ``offline/release/train_predictions.py``), so that a refit finds the
  rows of the classes it re-clusters without running the whole training set through the
  model; the agent does not read it.
"""

from __future__ import annotations

MODEL_SPEC = "model/spec.json"
BOXES_PREFIX = "monitors/boxes"
DIAGRAM_PREFIX = "bn/"
DIAGRAM_JSON = "diagram.json"
DIAGRAM_NPZ = "diagram.npz"
DIAGRAM_META = DIAGRAM_PREFIX + DIAGRAM_JSON
DIAGRAM_ARRAYS = DIAGRAM_PREFIX + DIAGRAM_NPZ
RULES = DIAGRAM_PREFIX + "rules.json"
VERIFICATION = DIAGRAM_PREFIX + "verification.json"
REFIT = "monitors/refit.json"
REFIT_ROWS = "monitors/refit_rows.npz"
TRAIN_PREDICTIONS = "monitors/train_predictions.npz"
