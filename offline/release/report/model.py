"""The report's model section: the model, the monitored layers (and why these), each layer's
chosen tau and boxes per class."""

from __future__ import annotations

import json

from boxwatch.offline.release.records import (
    BuildSummary,
    LayerChoiceSummary,
    ModelSummary,
    MonitorSummary,
)
from boxwatch.offline.release.report.figures import class_names, layer_names
from boxwatch.offline.release.report.markup import esc, fmt_value, given, num, omitted, table, text


def model_section(summary: BuildSummary) -> str:
    """The model's file, digest, classes and accuracy; the monitor's layers, taus and boxes."""
    model, monitor = given(summary.model), given(summary.monitor)
    out = ['<section id="model"><h2>Model and monitor</h2>']
    if model is None:
        out.append(omitted("model-omitted", "No model in this build (the config has none)."))
    else:
        out.append(_model_table(model))
    if monitor is None:
        out.append(
            omitted(
                "monitor-omitted",
                "No box monitor in this build (the config has no model or no monitor section).",
            )
        )
    else:
        out.append(_monitor_layers(monitor, model))
    out.append("</section>")
    return "".join(out)


def _model_table(model: ModelSummary) -> str:
    acc = model.accuracy
    rows: list[tuple[str, ...]] = [
        ("File", f"<code>{text('model-path', model.path)}</code>"),
        ("Format", text("model-format", model.format)),
        ("Digest", f"<code>{text('model-digest', model.digest)}</code>"),
        (
            "Classes",
            f"{num('model-n-classes', len(model.classes))}: "
            f"{esc(', '.join(map(str, model.classes)))}",
        ),
        ("Layers", esc(", ".join(map(str, model.layers)))),
        ("Accuracy (train)", num("model-accuracy-train", acc.train)),
        ("Accuracy (validation)", num("model-accuracy-validation", given(acc.validation))),
    ]
    return table(("Model", ""), [(esc(k), v) for k, v in rows], table_id="model-table")


def _monitor_layers(monitor: MonitorSummary, model: ModelSummary | None) -> str:
    classes_n = max([len(v) for v in monitor.tau.values()] + [0])
    classes = class_names(model, classes_n)
    taus = list(monitor.taus)
    contrast = (
        f" (contrast layers: {esc(', '.join(monitor.contrast_layers))})"
        if monitor.contrast_layers
        else ""
    )
    out = [
        f"<p>Monitored layers: {esc(', '.join(layer_names(monitor)))}. Candidate \u03c4: "
        f'<span id="monitor-taus" data-value="{esc(json.dumps(taus))}">'
        f"{esc(', '.join(fmt_value(t) for t in taus))}</span>. "
        f"\u03c4 selection: {text('monitor-tau-selection', monitor.tau_selection)}; "
        f"calibrated on: {text('monitor-calibration-set', monitor.calibration_set)}; "
        f"score: {text('monitor-score', monitor.score)}{contrast}.</p>",
        layer_choice(given(monitor.layer_choice)),
    ]
    rows = []
    for i, layer in enumerate(layer_names(monitor)):
        tau = monitor.tau.get(layer) or []
        boxes = monitor.boxes.get(layer)
        good, bad = (boxes.good, boxes.bad) if boxes is not None else ([], [])
        for k in range(max(len(tau), len(good), len(bad))):
            rows.append(
                (
                    esc(layer),
                    esc(classes[k] if k < len(classes) else f"class {k}"),
                    num(f"monitor-tau-L{i}-C{k}", tau[k] if k < len(tau) else None),
                    num(f"monitor-boxes-good-L{i}-C{k}", good[k] if k < len(good) else None),
                    num(f"monitor-boxes-bad-L{i}-C{k}", bad[k] if k < len(bad) else None),
                )
            )
    out.append(
        table(
            ("Layer", "Class", "Chosen \u03c4", "Good boxes", "Bad boxes"),
            rows,
            numeric=(False, False, True, True, True),
            table_id="monitor-table",
        )
    )
    return "".join(out)


def layer_choice(choice: LayerChoiceSummary | None) -> str:
    """Why these layers: the config's list, or the auto choice's ranking of every candidate
    (each with its torch modules, pooling and features)."""
    if choice is None:
        return ""
    head = (
        f"<p>Layer choice: {text('layer-choice-mode', choice.mode)} "
        f"({text('layer-choice-rule', choice.rule)}"
    )
    rows = given(choice.rows)
    if choice.mode == "auto":
        head += (
            f"; ranked on {esc(rows.train if rows else None)} training and "
            f"{esc(rows.validation if rows else None)} {esc(given(choice.set))} inputs"
        )
    head += f"; pooling {esc(given(choice.pooling))}).</p>"
    candidates = [
        (
            text(f"layer-choice-{j}-layer", c.layer),
            text(f"layer-choice-{j}-modules", ", ".join(given(c.modules) or []) or "-"),
            esc(c.kind),
            text(f"layer-choice-{j}-pooling", given(c.pooling) or "-"),
            esc(c.features),
            num(f"layer-choice-{j}-auroc", c.auroc),
            text(f"layer-choice-{j}-chosen", "yes" if c.chosen else "no"),
            text(f"layer-choice-{j}-reason", c.reason),
        )
        for j, c in enumerate(given(choice.candidates) or [])
    ]
    if not candidates:
        return head
    return head + table(
        (
            "Candidate",
            "Torch module",
            "Kind",
            "Pooling",
            "Features",
            "Held-out-class AUROC",
            "Chosen",
            "Why",
        ),
        candidates,
        numeric=(False, False, False, False, True, True, False, False),
        table_id="layer-choice-table",
    )
