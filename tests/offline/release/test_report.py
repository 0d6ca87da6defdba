"""The build report: self-contained HTML whose figures and numbers come from summary.json."""

from __future__ import annotations

import base64
import copy
import io
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from boxwatch.offline.release.report import (
    CELL_COLORS,
    REPORT_NAME,
    SUMMARY_NAME,
    render_report,
    restriction,
    rule_figure,
    summary_json,
    write_report,
)

TAUS = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.01]
LAYERS = ["fc1", "logits"]
CLASSES = ["zero", "one", "two"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = {
    "fig-coverage": "Fig. 5",
    "fig-outcomes": "Fig. 7",
    "fig-precision-recall": "Fig. 8",
    "fig-operating-point": "Operating point",
    "fig-rule-1": "Rule r-debit",
}


def _rates(c: dict) -> dict:
    p = c["tp"] + c["fp"]
    r = c["tp"] + c["fn"] + c["mp"]
    precision = c["tp"] / p if p else None
    recall = c["tp"] / r if r else None
    f1 = (
        2 * precision * recall / (precision + recall)
        if precision is not None and recall is not None and precision + recall
        else None
    )
    return {"precision": precision, "recall": recall, "f1": f1}


def _counts(rng: np.random.Generator, shrink: float) -> dict:
    """Outcome counts of 600 negatives and 300 positives for a monitor of coarseness shrink."""
    neg_reject = int(rng.binomial(600, 0.02 + 0.3 * shrink))
    neg_unc = int(rng.binomial(600 - neg_reject, 0.05))
    pos_reject = int(rng.binomial(300, 0.3 + 0.6 * shrink))
    pos_unc = int(rng.binomial(300 - pos_reject, 0.1))
    return {
        "tp": pos_reject,
        "fp": neg_reject,
        "tn": 600 - neg_reject - neg_unc,
        "fn": 300 - pos_reject - pos_unc,
        "mp": pos_unc,
        "mn": neg_unc,
    }


def make_summary(seed: int = 0) -> dict:
    """A realistic build summary: 2 layers, 3 classes, 12 taus, a BN with 2 rules and 2 FMO."""
    rng = np.random.default_rng(seed)
    tau, boxes, coverage, curves, per_layer = {}, {}, {}, {}, {}
    for i, layer in enumerate(LAYERS):
        tau[layer] = [TAUS[4 + i], TAUS[6], TAUS[8 - i]]
        boxes[layer] = {
            "good": [int(v) for v in rng.integers(3, 40, 3)],
            "bad": [int(v) for v in rng.integers(0, 6, 3)],
        }
        coverage[layer] = {
            "taus": TAUS,
            "per_class": [
                [
                    float(np.clip(0.05 + 0.9 * t ** (0.4 + 0.3 * k) + rng.normal(0, 0.01), 0, 1))
                    for t in TAUS
                ]
                for k in range(3)
            ],
        }
        rows = [_counts(rng, 1 - t) for t in TAUS]
        curve = {key: [r[key] for r in rows] for key in ("tp", "fp", "tn", "fn", "mp", "mn")}
        rates = [_rates(r) for r in rows]
        curve.update(
            taus=TAUS,
            precision=[r["precision"] for r in rates],
            recall=[r["recall"] for r in rates],
        )
        curves[layer] = curve
        chosen = _counts(rng, 0.5)
        per_layer[layer] = {**chosen, **_rates(chosen)}
    combined = _counts(rng, 0.6)
    known = rng.normal(0.0, 1.0, 2000)
    unknown = rng.normal(2.2, 1.2, 800)
    edges = np.linspace(-4, 7, 31)
    threshold = float(np.quantile(known, 0.95))
    return {
        "metadata": {
            "name": "digits-demo",
            "model_version": "1.4.2",
            "builder_version": "0.3.0",
            "created_at": "2026-12-02T10:00:00Z",
        },
        "artifact": {
            "path": "out/digits.bwa",
            "artifact_id": "3fa1c0de9b8e7d6c",
            "key_id": "ed25519:7c1f00aa",
            "sha256": "ab" * 32,
            "bytes": 183_204,
        },
        "model": {
            "path": "examples/digits/model.onnx",
            "format": "onnx",
            "digest": "cd" * 32,
            "classes": CLASSES,
            "layers": LAYERS,
            "accuracy": {"train": 0.98731, "validation": 0.9512},
        },
        "monitor": {
            "layers": LAYERS,
            "taus": TAUS,
            "tau": tau,
            "tau_selection": "f1",
            "score": "fused",
            "contrast_layers": LAYERS[:1],
            "calibration_set": "validation",
            "boxes": boxes,
            "coverage": coverage,
            "curves": curves,
            "evaluation": {"combined": {**combined, **_rates(combined)}, "per_layer": per_layer},
            "calibration": {
                "threshold": threshold,
                "target_acceptance": 0.95,
                "known_acceptance": float(np.mean(known <= threshold)),
                "unknown_acceptance": float(np.mean(unknown <= threshold)),
                "n_known": 2000,
                "n_unknown": 800,
            },
            "detection": {
                "auroc": 0.90412345,
                "fpr_at_95": float(np.mean(unknown <= threshold)),
                "histogram": {
                    "edges": [float(e) for e in edges],
                    "known": np.histogram(known, edges)[0].tolist(),
                    "unknown": np.histogram(unknown, edges)[0].tolist(),
                },
            },
            "histogram": {
                "set": "test",
                "edges": [float(e) for e in edges],
                "correct_known": np.histogram(known[:1900], edges)[0].tolist(),
                "misclassified_known": np.histogram(known[1900:] + 1.5, edges)[0].tolist(),
                "unknown": {
                    "unknown": np.histogram(unknown, edges)[0].tolist(),
                    "unknown_far": np.histogram(unknown[:300] + 2.0, edges)[0].tolist(),
                },
            },
            "baselines": {
                "point": "test",
                "set": "test",
                "accepted_share": 0.9512,
                "n_correct": 1900,
                "n_misclassified": 100,
                "rows": [
                    {
                        "method": "box monitor (emitted accept)",
                        "correct_known": 0.9512,
                        "misclassified_known": 0.41,
                        "unknown": {"unknown": 0.2113, "unknown_far": 0.0123},
                        "auroc": {"unknown": 0.90412345, "unknown_far": 0.99876},
                        "error_auroc": 0.8123,
                        "aurc": 0.0213,
                    },
                    {
                        "method": "msp",
                        "correct_known": 0.9512,
                        "misclassified_known": 0.33,
                        "unknown": {"unknown": 0.4511, "unknown_far": 0.2045},
                        "auroc": {"unknown": 0.8311, "unknown_far": 0.9021},
                        "error_auroc": 0.8711,
                        "aurc": 0.0187,
                        "threshold": -0.6123,
                    },
                    {
                        "method": "knn",
                        "correct_known": 0.9517,
                        "misclassified_known": 0.52,
                        "unknown": {"unknown": 0.3012, "unknown_far": 0.0},
                        "auroc": {"unknown": 0.8812, "unknown_far": 1.0},
                        "error_auroc": 0.7123,
                        "aurc": 0.0302,
                        "threshold": -0.8012,
                        "layer": "fc1",
                    },
                ],
                "not_computed": {"react": "needs the output layer's weights"},
            },
            "operating_points": [
                {
                    "set": "unknown",
                    "n": 800,
                    "acceptance": float(np.mean(unknown <= threshold)),
                    "auroc": 0.90412345,
                },
                {"set": "unknown_far", "n": 300, "acceptance": 0.0123, "auroc": 0.99876},
            ],
        },
        "bn": {
            "file": "examples/credit/credit.net",
            "class": "CreditWorthiness",
            "positive": "Positive",
            "threshold": 0.5,
            "features": ["Age", "Debit", "Income", "Assets"],
            "order": ["Income", "Assets", "Debit", "Age"],
            "states": {
                "Age": ["16-21", "22-64", "65+"],
                "Debit": ["low", "medium", "high"],
                "Income": ["low", "high"],
                "Assets": ["poor", "average", "wealthy"],
            },
            "nodes": 17,
            "nodes_quasi": 23,
            "positives": 31,
            "inputs": 54,
            "ties": 0,
            "seconds": 0.0421,
            "rules": [
                {
                    "id": "r-income",
                    "premise": {"Income": ["high"], "Assets": ["wealthy"]},
                    "conclusion": "Positive",
                    "verdict": "holds",
                    "violations": 0,
                    "probability": None,
                    "counterexamples": [],
                },
                {
                    "id": "r-debit",
                    "premise": {"Debit": ["low"], "Assets": ["average", "wealthy"]},
                    "conclusion": "Positive",
                    "verdict": "violated",
                    "violations": 4,
                    "probability": 0.0375,
                    # the builder lists every feature; a free one with all its allowed states
                    "counterexamples": [
                        {
                            "Age": ["16-21"],
                            "Debit": ["low"],
                            "Income": ["low"],
                            "Assets": ["average", "wealthy"],
                        },
                        {"Age": ["16-21", "22-64"], "Debit": ["low"], "Assets": ["average"]},
                    ],
                },
            ],
            "fmo": [
                {
                    "id": "fmo-assets",
                    "feature": "Assets",
                    "kind": "fmo",
                    "reason": "",
                    "given": {"Income": ["high"]},
                    "verdict": "holds",
                    "witness": None,
                },
                {
                    "id": "inc-age",
                    "feature": "Age",
                    "kind": "increasing",
                    "reason": "the positive class is lost as Age rises",
                    "given": {"Debit": ["low", "medium"]},
                    "verdict": "violated",
                    "witness": {
                        "fixed": {"Income": "low", "Assets": "poor", "Debit": "low"},
                        "values": ["16-21", "22-64"],
                        "classes": ["Positive", "Negative"],
                    },
                },
            ],
        },
        "policy": {
            "fail_on": ["rule_violated", "min_recall"],
            "failed": ["rule r-debit is violated (4 inputs)"],
        },
        "timings": {"activations": 1.234, "monitors": 3.5, "bn": 0.0421},
    }


class _Collect(HTMLParser):
    """Every element's attributes and text, by id; plus all src/href values and tag names."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict] = {}
        self.urls: list[str] = []
        self.tags: list[str] = []
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href") and v is not None]
        if "id" in a:
            self.by_id[a["id"]] = {"tag": tag, "attrs": a, "text": "", "children": []}
        for _, open_id in self._open:
            if open_id is not None:
                self.by_id[open_id]["children"].append((tag, a))
        if tag not in ("img", "meta", "br", "link"):
            self._open.append((tag, a.get("id")))

    def handle_endtag(self, tag):
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break

    def handle_data(self, data):
        for _, open_id in self._open:
            if open_id is not None:
                self.by_id[open_id]["text"] += data


def parse(page: str) -> _Collect:
    p = _Collect()
    p.feed(page)
    p.close()
    return p


@pytest.fixture(scope="module")
def summary() -> dict:
    return make_summary()


@pytest.fixture(scope="module")
def written(summary, tmp_path_factory) -> Path:
    """The report of the full summary, written once into a folder that did not exist."""
    return write_report(summary, tmp_path_factory.mktemp("report") / "new" / "dir")


@pytest.fixture(scope="module")
def page(written) -> str:
    return written.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def doc(page) -> _Collect:
    return parse(page)


def expected_numbers(s: dict) -> dict[str, object]:
    """Element id -> summary value, for every number the report must show."""
    m, bn = s["monitor"], s["bn"]
    out: dict[str, object] = {
        "artifact-bytes": s["artifact"]["bytes"],
        "model-accuracy-train": s["model"]["accuracy"]["train"],
        "model-accuracy-validation": s["model"]["accuracy"]["validation"],
        "detection-auroc": m["detection"]["auroc"],
        "detection-fpr-at-95": m["detection"]["fpr_at_95"],
    }
    for key in (
        "threshold",
        "target_acceptance",
        "known_acceptance",
        "unknown_acceptance",
        "n_known",
        "n_unknown",
    ):
        out["calibration-" + key.replace("_", "-")] = m["calibration"][key]
    for i, layer in enumerate(m["layers"]):
        for k in range(len(m["tau"][layer])):
            out[f"monitor-tau-L{i}-C{k}"] = m["tau"][layer][k]
            out[f"monitor-boxes-good-L{i}-C{k}"] = m["boxes"][layer]["good"][k]
            out[f"monitor-boxes-bad-L{i}-C{k}"] = m["boxes"][layer]["bad"][k]
        for key, value in m["evaluation"]["per_layer"][layer].items():
            out[f"eval-L{i}-{key}"] = value
    for key, value in m["evaluation"]["combined"].items():
        out[f"eval-combined-{key}"] = value
    for j, point in enumerate(m["operating_points"]):
        for key in ("n", "acceptance", "auroc"):
            out[f"operating-point-{j}-{key}"] = point[key]
    compared = m["baselines"]
    out["baselines-accepted-share"] = compared["accepted_share"]
    out["baselines-n-correct"] = compared["n_correct"]
    out["baselines-n-misclassified"] = compared["n_misclassified"]
    for j, row in enumerate(compared["rows"]):
        out[f"baseline-{j}-correct"] = row["correct_known"]
        out[f"baseline-{j}-misclassified"] = row["misclassified_known"]
        out[f"baseline-{j}-error-auroc"] = row["error_auroc"]
        out[f"baseline-{j}-aurc"] = row["aurc"]
        for name, share in row["unknown"].items():
            out[f"baseline-{j}-{name}"] = share
            out[f"baseline-{j}-auroc-{name}"] = row["auroc"][name]
    for key in ("threshold", "nodes", "positives", "inputs", "ties", "seconds"):
        out[f"bn-{key}"] = bn[key]
    out["bn-nodes-quasi"] = bn["nodes_quasi"]
    for j, rule in enumerate(bn["rules"]):
        out[f"rule-{j}-violations"] = rule["violations"]
        out[f"rule-{j}-probability"] = rule["probability"]
    for j, secs in enumerate(s["timings"].values()):
        out[f"timing-{j}"] = secs
    return out


def shown_as(text: str, value: object) -> bool:
    """Whether the visible ``text`` reads as ``value`` (4 significant decimals for floats)."""
    if value is None:
        return text == "n/a"
    if isinstance(value, int):
        return text == str(value)
    return math.isclose(float(text), value, rel_tol=1e-3, abs_tol=5e-5)


def png_of(doc: _Collect, fig_id: str) -> bytes:
    (img,) = [a for tag, a in doc.by_id[fig_id]["children"] if tag == "img"]
    prefix = "data:image/png;base64,"
    assert img["src"].startswith(prefix)
    return base64.b64decode(img["src"][len(prefix) :], validate=True)


def test_page_is_self_contained_and_small(page, doc):
    assert page.startswith("<!DOCTYPE html>")
    assert "script" not in doc.tags and "link" not in doc.tags and "iframe" not in doc.tags
    assert doc.urls and all(u.startswith(("#", "data:image/png;base64,")) for u in doc.urls)
    assert "http://" not in page and "https://" not in page
    assert "url(" not in page and "@import" not in page
    assert len(page.encode()) < 2_000_000


@pytest.mark.parametrize("fig_id", list(FIGURES))
def test_each_figure_is_an_embedded_png_with_its_caption(doc, fig_id):
    fig = doc.by_id[fig_id]
    assert fig["tag"] == "figure"
    assert FIGURES[fig_id] in fig["text"]
    data = png_of(doc, fig_id)
    assert data.startswith(PNG_MAGIC)
    pixels = imread(io.BytesIO(data))
    assert 250 <= pixels.shape[1] <= 1000 and 150 <= pixels.shape[0] <= 1000
    assert pixels[..., :3].std() > 0.05


def test_only_violated_rules_are_drawn(doc):
    assert "fig-rule-1" in doc.by_id and "fig-rule-0" not in doc.by_id


def test_numbers_by_id_equal_the_summary(summary, doc):
    for elem_id, value in expected_numbers(summary).items():
        assert elem_id in doc.by_id, elem_id
        elem = doc.by_id[elem_id]
        assert json.loads(elem["attrs"]["data-value"]) == value, elem_id
        assert shown_as(elem["text"], value), (elem_id, elem["text"], value)


def test_text_fields_and_policy_by_id(summary, doc):
    text = {k: v["text"] for k, v in doc.by_id.items()}
    assert text["meta-name"] == summary["metadata"]["name"]
    assert text["meta-model-version"] == summary["metadata"]["model_version"]
    assert text["meta-created-at"] == summary["metadata"]["created_at"]
    assert text["artifact-id"] == summary["artifact"]["artifact_id"]
    assert text["artifact-key-id"] == summary["artifact"]["key_id"]
    assert text["policy-status"] == "FAIL"
    taus = doc.by_id["monitor-taus"]
    assert json.loads(taus["attrs"]["data-value"]) == summary["monitor"]["taus"]
    assert [float(t) for t in taus["text"].split(", ")] == summary["monitor"]["taus"]
    assert text["policy-reason-0"] == summary["policy"]["failed"][0]
    for j, rule in enumerate(summary["bn"]["rules"]):
        assert text[f"rule-{j}-id"] == rule["id"]
        assert text[f"rule-{j}-verdict"] == rule["verdict"]
    for j, query in enumerate(summary["bn"]["fmo"]):
        assert text[f"fmo-{j}-verdict"] == query["verdict"]
    assert text["monitor-tau-selection"] == "f1"
    assert text["monitor-score"] == "fused"
    assert [text[f"operating-point-{j}-set"] for j in range(2)] == ["unknown", "unknown_far"]
    assert text["monitor-calibration-set"] == "validation"
    rules_table = doc.by_id["bn-rules-table"]["text"]
    # Debit = low is forced by the premise and Assets left free: neither is repeated
    assert rules_table.endswith("Age = 16-21; Income = low")
    fmo_table = doc.by_id["bn-fmo-table"]["text"]
    assert "Debit \u2208 {low, medium}" in fmo_table and "16-21 \u2192 22-64" in fmo_table


def test_baselines_say_their_matched_point_and_show_every_row(summary, doc):
    text = {k: v["text"] for k, v in doc.by_id.items()}
    assert text["baselines-point"] == "test" and text["baselines-set"] == "test"
    rows = summary["monitor"]["baselines"]["rows"]
    assert [text[f"baseline-{j}-method"] for j in range(len(rows))] == [
        "box monitor (emitted accept)",
        "MSP",
        "KNN k=50",
    ]
    assert [text[f"baseline-{j}-reads"] for j in range(len(rows))] == ["-", "logits", "fc1"]
    assert "needs the output layer" in text["baseline-not-computed-react"]
    head = doc.by_id["baselines-ranking-table"]["text"]
    for column in ("AUROC vs unknown", "AUROC vs unknown_far", "Error AUROC", "AURC"):
        assert column in head
    s = copy.deepcopy(summary)
    s["monitor"]["baselines"]["point"] = "validation"
    s["monitor"]["baselines"]["set"] = "validation"
    del s["monitor"]["coverage"], s["monitor"]["curves"]
    page = render_report(s)
    assert 'id="baselines-point">validation<' in page and "No data.test was given" in page


def test_score_histogram_shows_every_unknown_set_and_the_misclassified_inputs(summary, doc):
    caption = doc.by_id["fig-operating-point"]["text"]
    for series in (
        "correct known (test)",
        "misclassified known (test)",
        *summary["monitor"]["histogram"]["unknown"],
    ):
        assert series in caption, series
    s = copy.deepcopy(summary)  # a summary without it: the fit's known and data.unknown
    del s["monitor"]["histogram"], s["monitor"]["coverage"], s["monitor"]["curves"]
    caption = parse(render_report(s)).by_id["fig-operating-point"]["text"]
    assert "known (validation)" in caption and "misclassified" not in caption


def test_passing_policy_shows_pass(summary):
    s = copy.deepcopy(summary)
    s["policy"]["failed"] = []
    doc = parse(render_report({k: s[k] for k in ("metadata", "artifact", "policy")}))
    assert doc.by_id["policy-status"]["text"] == "PASS"
    assert "policy-reasons" not in doc.by_id


def test_write_report_round_trips_summary_and_leaves_no_temp_files(summary, written):
    out = written.parent
    assert written.name == REPORT_NAME and out.name == "dir"
    assert sorted(p.name for p in out.iterdir()) == sorted([REPORT_NAME, SUMMARY_NAME])
    text = (out / SUMMARY_NAME).read_text(encoding="utf-8")
    assert json.loads(text) == summary
    assert text == json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n"


def test_existing_report_is_replaced_whole_and_kept_on_failure(summary, tmp_path):
    (tmp_path / REPORT_NAME).write_text("OLD " * 200_000)
    (tmp_path / SUMMARY_NAME).write_text("{}")
    small = {k: v for k, v in summary.items() if k != "monitor"}
    write_report(small, tmp_path)
    new = (tmp_path / REPORT_NAME).read_text(encoding="utf-8")
    assert "OLD" not in new and new.rstrip().endswith("</html>")
    bad = copy.deepcopy(summary)
    bad["monitor"]["curves"]["fc1"]["precision"][3] = float("nan")
    bad["bn"]["nodes"] = np.int64(3)
    with pytest.raises(ValueError, match=r"curves\.fc1\.precision\[3\].*bn\.nodes \(int64\)"):
        write_report(bad, tmp_path)
    assert (tmp_path / REPORT_NAME).read_text(encoding="utf-8") == new
    assert json.loads((tmp_path / SUMMARY_NAME).read_text()) == small
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([REPORT_NAME, SUMMARY_NAME])


def test_summary_json_rejects_infinity(summary):
    bad = copy.deepcopy(summary)
    bad["monitor"]["detection"]["auroc"] = math.inf
    with pytest.raises(ValueError, match=r"detection\.auroc=inf"):
        summary_json(bad)


@pytest.mark.parametrize("absent", ["monitor", "bn", "model"])
def test_absent_sections_are_omitted_and_said(summary, absent):
    s = {k: copy.deepcopy(v) for k, v in summary.items() if k != absent}
    if "monitor" in s:  # keep the test quick: only the operating-point figure is drawn
        del s["monitor"]["coverage"], s["monitor"]["curves"]
    doc = parse(render_report(s))
    assert f"{absent}-omitted" in doc.by_id
    if absent == "monitor":
        assert not any(
            i.startswith(
                (
                    "fig-coverage",
                    "fig-outcomes",
                    "fig-precision",
                    "fig-operating",
                    "calibration-",
                    "eval-",
                )
            )
            for i in doc.by_id
        )
        assert "fig-rule-1" in doc.by_id
    if absent == "bn":
        assert not any(i.startswith(("fig-rule", "rule-", "fmo-", "bn-n")) for i in doc.by_id)
        assert "fig-operating-point" in doc.by_id and "eval-combined-f1" in doc.by_id
    if absent == "model":
        assert "model-format" not in doc.by_id and "fig-operating-point" in doc.by_id


def test_partial_monitor_without_unknown_inputs_renders(summary):
    s = copy.deepcopy(summary)
    m = s["monitor"]
    m["detection"] = {
        "auroc": None,
        "fpr_at_95": None,
        "histogram": {**m["detection"]["histogram"], "unknown": None},
    }
    m["calibration"]["unknown_acceptance"] = None
    del m["coverage"], m["curves"]
    doc = parse(render_report(s))
    assert doc.by_id["detection-auroc"]["text"] == "n/a"
    assert doc.by_id["calibration-unknown-acceptance"]["attrs"]["data-value"] == "null"
    assert "fig-coverage-omitted" in doc.by_id and "fig-outcomes-omitted" in doc.by_id
    assert "fig-operating-point" in doc.by_id


def test_strings_are_escaped(summary):
    evil = '<script>alert("x")</script>'
    s = copy.deepcopy(summary)
    del s["monitor"]["curves"], s["monitor"]["coverage"]  # quick; class names are in a table
    s["metadata"]["name"] = evil
    s["policy"]["failed"] = [evil]
    s["model"]["classes"][0] = evil
    s["bn"]["rules"][1]["id"] = evil
    s["bn"]["fmo"][1]["witness"] = {"Income": evil}
    s["timings"] = {evil: 1.0}
    page = render_report(s)
    doc = parse(page)
    assert "<script" not in page.lower() and "script" not in doc.tags
    assert page.count("&lt;script&gt;") >= 5
    assert doc.by_id["meta-name"]["text"] == evil


def _blue_pixels(uri: str) -> int:
    pixels = imread(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))[..., :3]
    blue = np.array([int(CELL_COLORS["violating"][i : i + 2], 16) for i in (1, 3, 5)]) / 255
    return int(np.all(np.abs(pixels - blue) < 0.02, axis=-1).sum())


def test_rule_drawing_shades_the_counterexample_cells(summary):
    bn = summary["bn"]
    rule = copy.deepcopy(bn["rules"][1])
    rule["counterexamples"] = [{"Debit": ["low"]}]
    first = rule_figure(bn, rule)
    one = _blue_pixels(first)
    rule["counterexamples"] = [{"Debit": ["low"], "Age": ["16-21", "22-64"]}]
    three = _blue_pixels(rule_figure(bn, rule))
    assert three > 2.2 * one > 0
    rule["counterexamples"] = [
        {"Debit": ["low"], "Age": ["16-21", "22-64", "65+"], "Assets": ["wealthy", "average"]}
    ]  # both free: drawn grey
    assert rule_figure(bn, rule) == first  # the same drawing, byte for byte


def test_restriction_keeps_only_features_pinned_beyond_the_premise(summary):
    bn = summary["bn"]
    premise = bn["rules"][1]["premise"]
    cube = {
        "Age": ["65+", "16-21", "22-64"],
        "Debit": ["low"],
        "Assets": ["average"],
        "Income": ["low", "high"],
    }
    assert restriction(cube, premise, bn["states"]) == {"Assets": ["average"]}
    assert restriction({"Age": ["16-21"]}, premise, bn["states"]) == {"Age": ["16-21"]}
