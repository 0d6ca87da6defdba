"""Closing the loop: reviewed captures become a signed, checked monitor update.

::

    from boxwatch.offline.refit import join, read_captures, read_labels

    joined = join(read_captures("captures/", shape), read_labels("labels.jsonl"), classes, y_pred)

Modules: :mod:`.feedback` (the captured inputs and the reviewers' labels, joined by record
id), :mod:`.archive` (a topic read up to its end offsets, and its directory export),
:mod:`.refit` (a child artifact whose affected classes are re-clustered and whose
operating point is recalibrated), :mod:`.capture_report` (clusters of rejected inputs:
shift told apart from new kinds of input).
"""

from typing import TYPE_CHECKING

from boxwatch.agent.lazy import lazy_exports

# The public names, by the module that defines them, each imported when first read.
_EXPORTS = {
    "feedback": (
        "LABEL_KINDS",
        "Captures",
        "Label",
        "LabelledCaptures",
        "Labels",
        "export_captures",
        "join",
        "read_captures",
        "read_captures_topic",
        "read_labels",
        "read_labels_topic",
    ),
}

if TYPE_CHECKING:
    from boxwatch.offline.refit.feedback import (
        LABEL_KINDS,
        Captures,
        Label,
        LabelledCaptures,
        Labels,
        export_captures,
        join,
        read_captures,
        read_captures_topic,
        read_labels,
        read_labels_topic,
    )
else:
    __getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "LABEL_KINDS",
    "Captures",
    "Label",
    "LabelledCaptures",
    "Labels",
    "export_captures",
    "join",
    "read_captures",
    "read_captures_topic",
    "read_labels",
    "read_labels_topic",
]
