"""Every closed vocabulary of boxwatch, declared once.

Metrics label values, the agent's config validation, the build config's JSON schema, the
estimators' parameter checks and the CLI choices all import these tuples; nothing else
spells them out (``tests/agent/test_vocab.py`` checks it). Order matters where a code indexes a
name: verdict ``0`` is ``VERDICTS[0]``, gate outcome ``1`` is ``GATE_OUTCOMES[1]``.
"""

from __future__ import annotations

VERDICTS: tuple[str, str, str] = ("accept", "uncertainty", "reject")
"""A box monitor's verdicts, by verdict code."""

GATE_OUTCOMES: tuple[str, str, str] = ("certified", "blocked", "unverified")
"""The BN rule gate's outcomes, by outcome code."""

RULE_VERDICTS: tuple[str, str] = ("holds", "violated")
"""A verified rule's verdict (``bn/rules.json``, the verification report)."""

GATE_ACTIONS = ("release", "review", "none")
"""What the agent's gate policy may do with a gated record (``gate.policy``)."""

BOX_KERNELS = ("native", "numpy")
"""Box-test implementations; the setting ``box_kernel`` also takes ``auto``."""

KAFKA_LIBRARIES = ("kafka-python", "confluent-kafka")
"""Kafka clients behind ``kafka.library``; :data:`boxwatch.agent.kafka.clients.LIBRARIES` has
one row (its adapter) for each, in this order (a test checks)."""

COMBINE_RULES = ("any", "majority", "all", "calibrated")
"""How a box monitor combines its layers' verdicts."""

NORMALIZATIONS = ("none", "l2")
"""How activations are normalised before the box tests."""

SCORES = ("distance", "fused")
"""A box monitor's out-of-box score."""

SCORE_MEANS = ("quadratic", "arithmetic")
"""How a box monitor's scaled score terms make its score: their root mean square, or (box
format 1 and 2) the mean of the distance terms plus the mean of the contrast terms."""

UNCERTAINTY_RULES = ("error-model", "confidence", "bad-box")
"""What makes a calibrated box monitor emit *uncertainty* for an input within its score
threshold: its error model's probability that the model is wrong above a calibrated cut,
the model's confidence below a calibrated floor, or (artifacts built before either) a bad
box of the predicted class."""

ERROR_SCORES = ("auto", "softmax")
"""How a box monitor ranks the model's own mistakes: ``auto`` learns an error model on the
labelled validation mistakes (softmax confidence where there are too few of them), or the
softmax confidence alone."""

ERROR_FEATURES = ("log_confidence", "log_doubt", "margin", "box_score", "contrast")
"""What an error model reads, per input: the log of the model's confidence and of one minus
it, the gap between its two top outputs, ``log1p`` of the monitor's score, and the mean
contrast term (how near the input lies to another class's boxes)."""

MODEL_OUTPUTS = ("logits", "probabilities")
"""What a model outputs (a box monitor's ``output``): logits (confidence = top softmax
probability) or rows that already are class probabilities (confidence = the top one)."""

POOLINGS = ("flatten", "avg", "max", "grid")
"""How a convolutional layer's maps (or an image input) become features."""

INPUT_KINDS = ("image", "signal", "vector")
"""What a model's input is (``model.input_kind``): an image ``[C, H, W]`` (more spatial axes
allowed), a signal or sequence ``[C, L]`` (or ``[L]``), a vector of features ``[D]``; it sets
how the build pools the input for its monitor."""

SELECTIONS = ("held-out-class", "f1", "coverage")
"""How the builder picks tau per layer and class (``monitor.selection``)."""

INPUT_DTYPES = ("float32", "float64", "float16", "uint8", "int64")
"""Model input dtypes the preprocessing accepts."""

REASON_VERDICTS: dict[str, tuple[str, ...]] = {
    "familiar": ("accept",),
    "low_confidence": ("uncertainty",),
    "bad_box": ("uncertainty",),
    "outside_boxes": ("reject", "uncertainty"),
    "between_classes": ("reject",),
    "energy": ("reject",),
    "mahalanobis": ("reject",),
    "not_finite": ("reject",),
    "out_of_range": VERDICTS,
}
"""Why an input got its verdict, and the verdicts each reason comes with (docs/records.md
says what each means; a test checks that it lists exactly these)."""

VERDICT_REASONS = tuple(REASON_VERDICTS)
"""The reasons, by reason code (the verdict record's ``reason``, the capture copy's
``boxwatch-reason`` header, label ``reason`` of ``boxwatch_agent_verdict_reasons_total``)."""

AGENT_OUTPUTS = ("verdict", "gate", "dead_letter", "capture", "release", "review")
"""The records the agent produces, by kind (``Output.kind``, label ``kind`` of
``boxwatch_agent_outputs_total`` and of the omitted and dropped outputs' counters)."""

DEAD_LETTER_REASONS = (
    "not_json",
    "bad_schema",
    "missing_id",
    "duplicate_id",
    "bad_content_type",
    "bad_dtype",
    "bad_shape",
    "not_finite",
    "too_large",
    "unknown_variable",
    "unknown_state",
    "missing_evidence",
    "model_error",
    "bad_header",
)
"""Why a record went to the dead-letter topic (header ``boxwatch-dlq-reason``, label
``reason`` of ``boxwatch_agent_invalid_records_total``)."""
