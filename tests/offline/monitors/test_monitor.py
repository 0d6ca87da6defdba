"""BoxMonitor (offline estimator): fitting, verdicts, scores, tau selection, calibration,
round trip to the agent runtime, evaluation outcomes, and the bundled digits model."""

from __future__ import annotations

import numpy as np
import pytest
from locations import ROOT
from sklearn.exceptions import NotFittedError

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent.boxes import ACCEPT, REJECT, UNCERTAIN, BoxRuntime, normalize_features
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.agent.members import BOXES_PREFIX
from boxwatch.agent.taps import OnnxTap
from boxwatch.offline.monitors.estimator import BoxMonitor, build_sweep
from boxwatch.offline.monitors.evaluation import (
    Outcomes,
    auroc,
    detection,
    outcome_counts,
    outcomes_per_class,
    tau_curves,
)

DIGITS_MODEL = ROOT / "examples" / "digits" / "model.onnx"

# Table 1 of the paper: layer-2 features, true labels and predictions (class 1 -> 0, 2 -> 1).
TABLE1 = np.array(
    [
        (0.078, 0.062),
        (0.222, 0.162),
        (0.69, 0.61),
        (0.79, 0.71),
        (0.289, 0.281),
        (0.389, 0.381),
        (0.566, 0.614),
        (0.666, 0.714),
    ]
)
TABLE1_TRUE = np.array([0, 0, 0, 0, 1, 1, 1, 1])
TABLE1_PRED = np.array([0, 0, 0, 0, 0, 0, 1, 1])


def synthetic(seed=0, n=300, d=6, n_classes=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, size=n)
    centres = np.random.default_rng(100).normal(
        scale=4.0, size=(n_classes, d)
    )  # same for every seed
    acts = {
        "a": centres[y] + rng.normal(size=(n, d)),
        "b": np.abs(centres[y][:, :3] + rng.normal(size=(n, 3))),
    }
    pred = np.where(rng.random(n) < 0.9, y, rng.integers(0, n_classes, size=n))
    return acts, y, pred


def test_fit_on_table1_reproduces_example6():
    # The paper's reading (combine="any"): boxes from every training input, no hold-out.
    mon = BoxMonitor(["l2"], tau=0.7, normalize="none", combine="any").fit(
        {"l2": TABLE1}, TABLE1_TRUE, TABLE1_PRED
    )
    good_lo, good_hi = mon.runtime_.good["l2"].boxes_of(0)
    order = np.argsort(good_lo[:, 0])
    np.testing.assert_allclose(good_lo[order], [[0.078, 0.062], [0.69, 0.61]], rtol=1e-6)
    np.testing.assert_allclose(good_hi[order], [[0.222, 0.162], [0.79, 0.71]], rtol=1e-6)
    v = mon.predict({"l2": np.array([(0.14, 0.13), (0.58, 0.56)])}, np.array([0, 0]))
    assert v.names().tolist() == ["accept", "reject"]


def test_every_good_training_point_is_in_a_box_of_its_class():
    acts, y, pred = synthetic()
    for normalize in ("none", "l2"):
        mon = BoxMonitor(tau=0.1, normalize=normalize, max_clusters=8, combine="any").fit(
            acts, y, pred
        )
        good = y == pred
        v = mon.predict({k: a[good] for k, a in acts.items()}, pred[good])
        for layer in ("a", "b"):
            assert np.all(v.per_layer[layer] != REJECT)
        assert np.all(mon.outlier_score({k: a[good] for k, a in acts.items()}, pred[good]) == 0)
        bad = ~good  # bad training points sit in a bad box: never plain accept
        vb = mon.predict({k: a[bad] for k, a in acts.items()}, pred[bad])
        assert np.all(vb.per_layer["a"] != ACCEPT)


def test_fit_is_deterministic_and_seed_is_used():
    acts, y, pred = synthetic(1)
    m1 = BoxMonitor(tau=0.05, max_clusters=8, random_state=3).fit(acts, y, pred)
    m2 = BoxMonitor(tau=0.05, max_clusters=8, random_state=3).fit(acts, y, pred)
    for layer in ("a", "b"):
        np.testing.assert_array_equal(m1.runtime_.good[layer].lo, m2.runtime_.good[layer].lo)
        np.testing.assert_array_equal(m1.runtime_.bad[layer].hi, m2.runtime_.bad[layer].hi)
    assert _members_equal(m1.to_members(), m2.to_members())
    m3 = BoxMonitor(tau=0.05, max_clusters=8, random_state=4).fit(acts, y, pred)
    assert m3.tau_["a"].tolist() == m1.tau_["a"].tolist()


def _members_equal(a, b):
    if a.keys() != b.keys() or a["monitors/boxes.json"] != b["monitors/boxes.json"]:
        return False
    return all(np.array_equal(a[k][n], b[k][n]) for k in a if k.endswith(".npz") for n in a[k])


def test_combine_rule_and_per_layer_tau_mapping():
    acts, y, pred = synthetic(2)
    mon = BoxMonitor(tau={"a": 0.5, "b": [0.1, 0.2, 0.3]}, combine="all").fit(acts, y, pred)
    np.testing.assert_array_equal(mon.tau_["a"], [0.5] * 3)
    np.testing.assert_array_equal(mon.tau_["b"], [0.1, 0.2, 0.3])
    v = mon.predict(acts, pred)
    per = np.stack([v.per_layer["a"], v.per_layer["b"]])
    assert np.all((v.combined == REJECT) == np.all(per == REJECT, axis=0))
    assert np.all((v.combined == ACCEPT) == np.all(per == ACCEPT, axis=0))


def test_auto_tau_by_validation_f1():
    acts, y, pred = synthetic(3)
    vacts, vy, vpred = synthetic(4, n=200)
    rng = np.random.default_rng(0)
    unknown = {
        "a": rng.normal(scale=6, size=(150, 6)),
        "b": np.abs(rng.normal(scale=6, size=(150, 3))),
    }
    val = (
        {k: np.vstack([vacts[k], unknown[k]]) for k in vacts},
        np.concatenate([vy, np.full(150, -1)]),
        np.concatenate([vpred, rng.integers(0, 3, 150)]),
    )
    taus = (1.0, 0.5, 0.1, 0.01)
    mon = BoxMonitor(tau="auto", taus=taus, selection="f1", max_clusters=8).fit(
        acts, y, pred, validation=val
    )
    for layer in ("a", "b"):
        table = mon.selection_["f1"][layer]
        assert table.shape == (4, 3)
        best = table.max(axis=0)
        chosen_rows = [taus.index(t) for t in mon.tau_[layer]]
        np.testing.assert_allclose(table[chosen_rows, range(3)], best)
        # Cross-check one entry against the evaluation module.
        sweep = build_sweep(
            acts, y, pred, layers=["a", "b"], taus=taus, n_classes=3, max_clusters=8
        )
        verdicts = sweep.verdicts(val[0], val[2])[layer][mon.tau_[layer][0]]
        assert outcomes_per_class(verdicts, val[1], val[2], 3)[0].f1 == pytest.approx(best[0])


def test_a_sweep_of_some_classes_gives_them_the_whole_sweeps_boxes():
    acts, y, pred = synthetic(8, n=400, n_classes=4)
    taus = (1.0, 0.5, 0.1)
    whole = build_sweep(acts, y, pred, layers=["a", "b"], taus=taus, n_classes=4, max_clusters=8)
    own = {"a": np.array([0.5, 0.1, 1.0, 0.1]), "b": np.array([0.1, 0.5, 0.5, 1.0])}
    for class_taus in (None, own):
        some = build_sweep(
            acts,
            y,
            pred,
            layers=["a", "b"],
            taus=taus,
            n_classes=4,
            max_clusters=8,
            class_taus=class_taus,
            classes=[3, 1],
        )
        for layer in ("a", "b"):
            for kind in ("good", "bad"):
                for tau in taus:
                    got = getattr(some, kind)[layer][tau]
                    assert got.counts()[[0, 2]].tolist() == [0, 0]
                    for c in (1, 3):
                        t = tau if class_taus is None else float(own[layer][c])
                        want = getattr(whole, kind)[layer][t].boxes_of(c)
                        for a, b in zip(got.boxes_of(c), want, strict=True):
                            np.testing.assert_array_equal(a, b)
            assert some.k_good[layer][:, [0, 2]].sum() == 0
            assert (some.k_good[layer][:, [1, 3]] > 0).any()


def test_adopt_takes_fitted_boxes_and_calibrate_sets_their_operating_point():
    acts, y, pred = synthetic(9)
    vacts, vy, vpred = synthetic(10, n=200)
    fitted = BoxMonitor(tau=0.1, max_clusters=8).fit(acts, y, pred, validation=(vacts, vy, vpred))
    members = fitted.to_members()
    runtime = BoxRuntime.from_members(members, members)
    runtime.threshold, runtime.score_scales = None, {}
    adopted = BoxMonitor(tau=0.1, max_clusters=8).adopt(runtime)
    assert adopted.runtime_ is runtime and adopted.layers_ == fitted.layers_
    np.testing.assert_array_equal(adopted.tau_["a"], fitted.tau_["a"])
    cal = adopted.calibrate(vacts, vpred, y_true_known=vy)
    assert cal.threshold == pytest.approx(fitted.calibration_.threshold)
    assert runtime.threshold == pytest.approx(fitted.runtime_.threshold)
    assert runtime.score_scales == pytest.approx(fitted.runtime_.score_scales)


def test_auto_tau_without_validation_uses_coverage_search():
    acts, y, pred = synthetic(5, n=300)
    mon = BoxMonitor(tau="auto", max_clusters=4, eps_ival=0.05).fit(acts, y, pred)
    assert mon.selection_ is None
    for layer in ("a", "b"):
        assert np.all((mon.tau_[layer] >= 0) & (mon.tau_[layer] <= 1))


def test_calibrate_reaches_target_and_measures_unknowns():
    acts, y, pred = synthetic(6)
    mon = BoxMonitor(tau=0.05, max_clusters=8).fit(acts, y, pred)
    kacts, _, kpred = synthetic(7, n=300)
    rng = np.random.default_rng(1)
    uacts = {
        "a": rng.normal(scale=8, size=(300, 6)),
        "b": np.abs(rng.normal(scale=8, size=(300, 3))),
    }
    upred = rng.integers(0, 3, 300)
    cal = mon.calibrate(
        kacts, kpred, target_acceptance=0.9, acts_unknown=uacts, y_pred_unknown=upred
    )
    sk = mon.outlier_score(kacts, kpred)
    assert np.mean(sk <= cal.threshold) >= 0.9
    assert cal.known_acceptance == pytest.approx(np.mean(sk <= cal.threshold))
    su = mon.outlier_score(uacts, upred)
    assert cal.unknown_acceptance == pytest.approx(np.mean(su <= cal.threshold))
    assert cal.unknown_acceptance < 0.5
    np.testing.assert_array_equal(mon.decide(uacts, upred), su <= cal.threshold)
    # The agent runtime rebuilt from the members reproduces scores and decisions.
    rt = BoxRuntime.from_members(mon.to_members(), mon.to_members())
    np.testing.assert_array_equal(rt.scores(uacts, upred), su)
    assert rt.threshold == cal.threshold


def test_score_grows_with_distance_from_boxes():
    acts, y, pred = synthetic(8)
    mon = BoxMonitor(["a"], tau=0.1, normalize="none").fit(acts, y, pred)
    far = {"a": acts["a"][:50] * 50.0}
    near = {"a": acts["a"][:50]}
    assert np.all(mon.outlier_score(far, pred[:50]) >= mon.outlier_score(near, pred[:50]) - 1e-12)


def test_config_errors_name_every_problem():
    acts, y, pred = synthetic(9, n=100)
    with pytest.raises(ConfigError) as err:
        BoxMonitor(["a", "zz"], combine="vote", normalize="zscore").fit(acts, y, pred)
    text = str(err.value)
    assert "combine='vote'" in text and "normalize='zscore'" in text and "zz" in text
    with pytest.raises(NotFittedError, match="not fitted"):
        BoxMonitor().predict(acts, pred)
    with pytest.raises(ValueError, match="rows"):
        BoxMonitor(tau=0.5).fit({"a": acts["a"][:10]}, y, pred)


def test_outcome_counts_follow_table2():
    verdicts = np.array([ACCEPT, REJECT, UNCERTAIN, ACCEPT, REJECT, UNCERTAIN, ACCEPT])
    y_true = np.array([0, 0, 0, 1, -1, 2, 1])
    y_pred = np.array([0, 0, 0, 0, 0, 0, 1])
    counts = outcome_counts(verdicts, y_true, y_pred, 3)
    assert counts[0].tolist() == [1, 1, 1, 1, 1, 1]
    assert counts[1].tolist() == [1, 0, 0, 0, 0, 0]
    o = Outcomes(*counts[0])
    assert o.precision == 0.5 and o.recall == pytest.approx(1 / 3) and o.f1 == pytest.approx(0.4)
    curves = tau_curves({0.1: verdicts, 0.5: verdicts}, y_true, y_pred, 3)
    assert list(curves) == [0.5, 0.1]


def test_auroc_and_fpr():
    assert auroc(np.array([0, 1, 2]), np.array([3, 4])) == 1.0
    assert auroc(np.array([1, 1]), np.array([1, 1])) == 0.5
    d = detection(np.arange(100), np.array([50, 96, 200]))
    assert d.threshold == 94 and d.fpr == pytest.approx(1 / 3)


def test_digits_model_monitor_flags_unseen_digits():
    """The bundled MLP (digits 0-7): monitors on both hidden layers, 8 and 9 as unknowns."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    known = digits.target < 8
    tap = OnnxTap(DIGITS_MODEL, ["/act1/Relu_output_0", "/act2/Relu_output_0"])
    logits, acts = tap.run(x)
    pred = logits.argmax(1)
    idx = np.flatnonzero(known)
    train, held = idx[::2], idx[1::2]
    mon = BoxMonitor(tau=0.05, max_clusters=8, random_state=0).fit(
        {k: a[train] for k, a in acts.items()}, digits.target[train], pred[train], n_classes=8
    )
    unk = np.flatnonzero(~known)
    cal = mon.calibrate(
        {k: a[held] for k, a in acts.items()},
        pred[held],
        target_acceptance=0.95,
        acts_unknown={k: a[unk] for k, a in acts.items()},
        y_pred_unknown=pred[unk],
    )
    sk = mon.outlier_score({k: a[held] for k, a in acts.items()}, pred[held])
    su = mon.outlier_score({k: a[unk] for k, a in acts.items()}, pred[unk])
    assert auroc(sk, su) > 0.85
    # 0.61 with the default quadratic score mean (0.55 with the arithmetic one, whose AUROC
    # is lower): 8 and 9 drawn in 8x8 pixels are near unknowns for a 0-7 model.
    assert cal.unknown_acceptance < 0.65


def test_defaults_fit_calibrate_and_predict():
    """BoxMonitor() with defaults: combine="calibrated", calibrated inside fit on a held-out
    share of train (no validation) or on the validation data, and the emitted verdicts
    accept target_acceptance of the correctly classified calibration inputs."""
    acts, y, pred = synthetic(10, n=400)
    mon = BoxMonitor().fit(acts, y, pred)
    assert mon.combine == "calibrated" and mon.target_acceptance == 0.95
    held = mon.calibration_rows_
    assert 0.15 * len(y) <= len(held) <= 0.25 * len(y)
    v = mon.predict({k: a[held] for k, a in acts.items()}, pred[held])
    right = y[held] == pred[held]
    cal = mon.calibration_
    assert cal.population == "correctly classified known" and cal.n_known == right.sum()
    assert cal.known_acceptance == pytest.approx(np.mean(v.combined[right] == ACCEPT))
    assert cal.known_acceptance >= 0.95
    # With validation data: calibrated on its correctly classified known rows.
    vacts, vy, vpred = synthetic(11, n=300)
    mon = BoxMonitor(target_acceptance=0.9).fit(acts, y, pred, validation=(vacts, vy, vpred))
    assert len(mon.calibration_rows_) == 0
    v = mon.predict(vacts, vpred).combined
    right = vy == vpred
    assert mon.calibration_.known_acceptance == pytest.approx(np.mean(v[right] == ACCEPT))
    assert mon.calibration_.known_acceptance >= 0.9
    assert mon.calibration_.known_split["accept"] == mon.calibration_.known_acceptance


def synthetic_logits(pred, seed, n_classes=3):
    """Logits whose argmax is ``pred``, with margins spread from near-ties to sure."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(len(pred), n_classes))
    z[np.arange(len(pred)), pred] = z.max(axis=1) + rng.exponential(1.0, size=len(pred))
    return z


def test_confidence_floor_takes_its_share_and_accepts_the_target():
    """With logits, calibration splits the unaccepted budget: the score threshold rejects,
    a confidence floor gives *uncertainty* to ``confidence_share`` of it; the emitted
    verdicts still accept ``target_acceptance`` of the correct known inputs (issue 23)."""
    acts, y, pred = synthetic(12, n=600)
    logits = synthetic_logits(pred, 1)
    vacts, vy, vpred = synthetic(13, n=600)
    vlogits = synthetic_logits(vpred, 2)
    mon = BoxMonitor(target_acceptance=0.8, confidence_share=0.25, error_score="softmax").fit(
        acts, y, pred, logits=logits, validation=(vacts, vy, vpred, vlogits)
    )
    cal = mon.calibration_
    assert cal.confidence_floor is not None and 0 < cal.confidence_floor < 1
    assert cal.error_score == "softmax" and cal.share_choice["method"] == "set"
    with pytest.raises(ValueError, match="logits"):
        mon.predict(vacts, vpred)
    v = mon.predict(vacts, vpred, logits=vlogits).combined
    right = vy == vpred
    n = right.sum()
    assert cal.known_acceptance == pytest.approx(np.mean(v[right] == ACCEPT))
    assert 0.8 <= cal.known_acceptance <= 0.8 + 2 / n
    # The floor's share: a quarter of the 20% budget, the rest rejected by the score.
    assert 0.05 - 2 / n <= np.mean(v[right] == UNCERTAIN) <= 0.05 + 2 / n
    assert 0.15 - 2 / n <= np.mean(v[right] == REJECT) <= 0.15 + 2 / n
    conf = np.exp(vlogits - vlogits.max(1, keepdims=True))
    conf = 1 / conf.sum(1)
    score = mon.outlier_score(vacts, vpred, logits=vlogits)
    within = score <= cal.threshold
    np.testing.assert_array_equal(v == REJECT, ~within)
    np.testing.assert_array_equal(v == UNCERTAIN, within & (conf < cal.confidence_floor))
    # No floor without logits, or with confidence_share=0: the score alone accepts.
    for mon in (
        BoxMonitor(target_acceptance=0.8).fit(acts, y, pred, validation=(vacts, vy, vpred)),
        BoxMonitor(target_acceptance=0.8, confidence_share=0).fit(
            acts, y, pred, logits=logits, validation=(vacts, vy, vpred, vlogits)
        ),
    ):
        assert mon.calibration_.confidence_floor is None
        v = mon.predict(vacts, vpred, logits=vlogits).combined
        assert not np.any(v == UNCERTAIN) and np.mean(v[right] == ACCEPT) >= 0.8


def test_error_model_takes_its_share_round_trips_and_fails_closed():
    """With enough labelled mistakes, *uncertainty* cuts a learnt error model's probability:
    the verdicts are the threshold and the cut, the known acceptance is the target, the agent
    rebuilt from the members decides the same, and a NaN output is never accepted (issue 38)."""
    acts, y, pred = synthetic(12, n=600)
    logits = synthetic_logits(pred, 1)
    vacts, vy, vpred = synthetic(13, n=800)
    vlogits = synthetic_logits(vpred, 2)
    mon = BoxMonitor(
        target_acceptance=0.8, confidence_share=0.5, peak_factor=None, mahalanobis_term=False
    ).fit(acts, y, pred, logits=logits, validation=(vacts, vy, vpred, vlogits))
    cal, rt = mon.calibration_, mon.runtime_
    assert (vy != vpred).sum() >= 20
    assert cal.error_score == "error-model" and rt.uncertainty == "error-model"
    assert cal.error_cut is not None and cal.confidence_floor is None
    v = mon.predict(vacts, vpred, logits=vlogits).combined
    right = vy == vpred
    n = right.sum()
    assert cal.known_acceptance == pytest.approx(np.mean(v[right] == ACCEPT))
    assert 0.8 <= cal.known_acceptance <= 0.8 + 2 / n
    assert 0.1 - 2 / n <= np.mean(v[right] == UNCERTAIN) <= 0.1 + 2 / n
    within = mon.outlier_score(vacts, vpred, logits=vlogits) <= cal.threshold
    doubt = rt.error_score(vacts, vpred, vlogits)
    np.testing.assert_array_equal(v == REJECT, ~within)
    np.testing.assert_array_equal(v == UNCERTAIN, within & (doubt > cal.error_cut))
    members = mon.to_members()
    assert members[f"{BOXES_PREFIX}.json"]["version"] == 8
    assert rt.error_model is not None and rt.error_model.class_shift is not None
    assert rt.error_model.class_shift.shape == (rt.n_classes,)
    again = BoxRuntime.from_members(members, members)
    np.testing.assert_array_equal(again.verdicts(vacts, vpred, logits=vlogits)[0], v)
    bad = vlogits.copy()
    bad[:5, 1] = np.nan
    assert not np.any(again.verdicts(vacts, vpred, logits=bad)[0][:5] == ACCEPT)
    assert np.all(np.isnan(again.error_score(vacts, vpred, bad)[:5]))
    with pytest.raises(ConfigError, match="logits"):
        again.verdicts(vacts, vpred)


def test_error_model_class_term_is_the_indicator_fit_and_the_artifact_checks_it():
    """The term per predicted class is a logistic fit with one indicator column per class,
    folded into one number per class (the same probabilities); a monitor carrying it is
    version 8, and a class_shift of the wrong length, not finite or in an older version is
    refused (issue 38)."""
    from sklearn.linear_model import LogisticRegression

    from boxwatch.offline.monitors.estimator import fit_error_model

    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 5))
    y_pred = rng.integers(0, 4, 600)
    wrong = rng.random(600) < 0.1 + 0.15 * y_pred
    model = fit_error_model(x, wrong, y_pred, 5)
    design = np.hstack([x, np.eye(5)[y_pred]])
    mean, sd = design.mean(axis=0), design.std(axis=0)
    sd[sd == 0] = 1.0
    ref = LogisticRegression(max_iter=1000).fit((design - mean) / sd, wrong)
    # the same fit to the solver's tolerance (the agent's form: one number per class)
    np.testing.assert_allclose(
        model.probability(x, y_pred), ref.predict_proba((design - mean) / sd)[:, 1], atol=1e-3
    )
    assert model.class_shift is not None and model.class_shift[4] == 0.0  # never predicted
    assert model.class_shift[3] > model.class_shift[0]  # class 3's mistakes are commoner
    with pytest.raises(ConfigError, match="predicted class"):
        model.probability(x)
    with pytest.raises(ConfigError, match="outside the error model's 0..4"):
        model.probability(x, np.where(y_pred == 0, -1, y_pred))

    acts, y, pred = synthetic(12, n=600)
    vacts, vy, vpred = synthetic(13, n=800)
    mon = BoxMonitor(confidence_share=0.5, mahalanobis_term=False).fit(
        acts,
        y,
        pred,
        logits=synthetic_logits(pred, 1),
        validation=(vacts, vy, vpred, synthetic_logits(vpred, 2)),
    )
    members = mon.to_members()
    spec = members[f"{BOXES_PREFIX}.json"]
    assert spec["version"] == 8 and len(spec["error_model"]["class_shift"]) == 3
    for shift, version, match in (
        ([0.1, 0.2], 8, "3 finite values"),
        ([0.1, float("nan"), 0.2], 8, "3 finite values"),
        (spec["error_model"]["class_shift"], 7, "needs version 8"),
    ):
        bad = {
            **spec,
            "version": version,
            "error_model": {**spec["error_model"], "class_shift": shift},
        }
        with pytest.raises(ArtifactError, match=match):
            BoxRuntime.from_members({**members, f"{BOXES_PREFIX}.json": bad}, members)


def test_error_model_ranks_mistakes_at_least_as_well_as_softmax():
    """Where the mistakes also lie off the boxes, the learnt error model ranks them better
    than the model's softmax confidence alone (both read the same logits)."""
    acts, y, pred = synthetic(20, n=800)
    logits = synthetic_logits(pred, 5)
    vacts, vy, vpred = synthetic(21, n=1200)
    vlogits = synthetic_logits(vpred, 6)
    mon = BoxMonitor().fit(acts, y, pred, logits=logits, validation=(vacts, vy, vpred, vlogits))
    wrong = vy != vpred
    doubt = mon.runtime_.error_score(vacts, vpred, vlogits)
    conf = 1 / np.exp(vlogits - vlogits.max(1, keepdims=True)).sum(1)
    learnt, softmax = auroc(doubt[~wrong], doubt[wrong]), auroc(-conf[~wrong], -conf[wrong])
    assert learnt > softmax + 0.05


def _share_case(seed, sep):
    """Scores of 2,000 correct and 150 wrong calibration inputs: the box score blind to the
    mistakes, the error score and softmax confidence telling them apart by ``sep``."""
    rng = np.random.default_rng(seed)
    n, m = 2000, 150
    wrong = np.r_[np.zeros(n, bool), np.ones(m, bool)]
    score = rng.uniform(0, 1, n + m)
    doubt = np.r_[rng.uniform(0, 1, n), rng.uniform(sep, 1 + sep, m)]
    conf = np.r_[rng.uniform(0.5, 1, n), rng.uniform(0.5 - sep / 4, 1 - sep / 4, m)]
    return score, doubt, conf, np.flatnonzero(~wrong), wrong


@pytest.mark.parametrize(("seed", "sep", "clears"), [(2, 0.05, True), (0, 0.2, False)])
def test_share_choice_asks_for_a_margin_below_softmax(seed, sep, clears):
    """The automatic split passes over shares that only match softmax confidence within the
    validation set's noise: it takes the first share clear of softmax's share by
    ``SHARE_MARGIN`` standard errors, else the largest share (``SHARE_CAP``), since the
    mistakes cannot tell the shares apart; both cases here would have taken a smaller share
    without the margin."""
    from boxwatch.offline.monitors.estimator import SHARE_CAP, SHARE_MARGIN, _choose_share

    share, rec = _choose_share(*_share_case(seed, sep), 0.95)
    soft, shares, accepted = (
        rec["softmax_misclassified_accepted"],
        rec["shares"],
        rec["misclassified_accepted"],
    )
    assert rec["margin"] == pytest.approx(SHARE_MARGIN * np.sqrt(soft * (1 - soft) / 150))
    at = dict(zip(shares, accepted, strict=True))
    without_margin = next(s for s in shares if at[s] <= soft)
    assert without_margin < share
    if clears:
        assert at[share] <= soft - rec["margin"] and rec["reason"].startswith("the smallest")
        assert all(at[s] > soft - rec["margin"] for s in shares if s < share)
    else:
        assert all(a > soft - rec["margin"] for a in accepted)
        assert share == shares[-1] == max(s for s in shares if s <= SHARE_CAP)
        assert share > min(s for s in shares if at[s] == min(accepted))
        assert rec["reason"].startswith("no share")


def test_confidence_share_auto_takes_the_smallest_share_clear_of_softmax():
    """``confidence_share="auto"`` records the misclassified validation inputs accepted per
    share of the grid up to ``SHARE_CAP`` and takes the smallest share accepting fewer of
    them than softmax confidence alone by ``SHARE_MARGIN`` standard errors of softmax's share
    (else the largest share of the grid)."""
    from boxwatch.offline.monitors.estimator import SHARE_CAP, SHARE_GRID, SHARE_MARGIN

    acts, y, pred = synthetic(12, n=600)
    logits = synthetic_logits(pred, 1)
    vacts, vy, vpred = synthetic(13, n=800)
    vlogits = synthetic_logits(vpred, 2)
    mon = BoxMonitor(target_acceptance=0.8).fit(
        acts, y, pred, logits=logits, validation=(vacts, vy, vpred, vlogits)
    )
    choice = mon.calibration_.share_choice
    n_wrong = int((vy != vpred).sum())
    assert choice["method"] == "auto" and choice["n_misclassified"] == n_wrong
    shares, accepted = choice["shares"], choice["misclassified_accepted"]
    assert shares == [s for s in SHARE_GRID if s <= SHARE_CAP] and max(shares) < SHARE_GRID[-1]
    soft = choice["softmax_misclassified_accepted"]
    margin = SHARE_MARGIN * np.sqrt(soft * (1 - soft) / n_wrong)
    assert choice["margin"] == pytest.approx(margin) and margin > 0
    clear = [s for s, a in zip(shares, accepted, strict=True) if a <= soft - margin]
    expect = clear[0] if clear else shares[-1]
    assert mon.calibration_.confidence_share == expect
    # The recorded figure is what the emitted verdicts do on the mistakes.
    v = mon.predict(vacts, vpred, logits=vlogits).combined
    i = shares.index(expect)
    assert np.mean(v[vy != vpred] == ACCEPT) == pytest.approx(accepted[i])
    # Too few mistakes: softmax confidence and the default share, said so.
    few = BoxMonitor(target_acceptance=0.8).fit(
        acts, y, pred, logits=logits, validation=(vacts, vy, vy, vlogits)
    )
    assert few.calibration_.share_choice["method"] == "default"
    assert few.calibration_.error_score == "softmax"


def test_confidence_floor_fails_closed_and_reads_probabilities():
    """A NaN output never passes the floor; probability rows are read as they are."""
    acts, y, pred = synthetic(14, n=600)
    logits = synthetic_logits(pred, 3)
    mon = BoxMonitor().fit(acts, y, pred, logits=logits)
    rt = mon.runtime_
    assert rt.output == "logits" and rt.confidence_floor is not None
    bad = logits.copy()
    bad[:5, 0] = np.nan
    v, _per = rt.verdicts(acts, pred, logits=bad)
    assert not np.any(v[:5] == ACCEPT)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    pmon = BoxMonitor().fit(acts, y, pred, logits=probs)
    assert pmon.runtime_.output == "probabilities"
    # Same inputs, same ranking by confidence: the same floor in probability units.
    assert pmon.calibration_.confidence_floor == pytest.approx(mon.calibration_.confidence_floor)


def test_monitors_built_before_the_confidence_rule_keep_their_bad_box_verdicts():
    """A format-2 calibrated monitor (no ``uncertainty`` key) still emits uncertainty
    inside a bad box, as when it was built; format 3 records the confidence rule and
    format 4 the energy term."""
    acts, y, pred = synthetic(12, n=400)
    logits = synthetic_logits(pred, 4)
    mon = BoxMonitor(tau=1.0, max_clusters=1, peak_factor=None, mahalanobis_term=False).fit(
        acts, y, pred, logits=logits
    )
    members = mon.to_members()
    spec = members[f"{BOXES_PREFIX}.json"]
    assert spec["version"] == 4 and spec["uncertainty"] == "confidence"
    assert spec["energy_scale"] > 0
    old = {
        k: v
        for k, v in spec.items()
        if k not in ("uncertainty", "confidence_floor", "output", "energy_center", "energy_scale")
    }
    old["version"] = 2
    legacy = BoxRuntime.from_members({**members, f"{BOXES_PREFIX}.json": old}, members)
    assert legacy.uncertainty == "bad-box" and legacy.confidence_floor is None
    v, _per = legacy.verdicts(acts, pred)
    in_bad = np.logical_or.reduce(
        [
            legacy.bad[layer].contains(normalize_features(acts[layer], legacy.normalize), pred)
            for layer in legacy.layers
        ]
    )
    scores = legacy.scores(acts, pred)
    within = scores <= legacy.threshold
    assert np.any(within & in_bad)
    np.testing.assert_array_equal(v == UNCERTAIN, within & in_bad)
    # An unknown rule in a format-3 member is refused, not guessed.
    with pytest.raises(ArtifactError, match="uncertainty"):
        BoxRuntime.from_members(
            {**members, f"{BOXES_PREFIX}.json": {**spec, "uncertainty": "vibes"}}, members
        )


def test_energy_term_weighs_weak_logits_and_fails_closed():
    """With logits, the fused score gains the energy term ``max(0, E - centre) / scale``
    (``ENERGY_TERMS`` times in the quadratic mean, E = -logsumexp(logits)): the same
    activations score higher under weak logits; a NaN logit rejects; the term travels in
    box format 4 and a bad one is refused; without it the score is the format-3 one."""
    acts, y, pred = synthetic(12, n=600)
    logits = synthetic_logits(pred, 1)
    vacts, vy, vpred = synthetic(13, n=600)
    vlogits = synthetic_logits(vpred, 2)
    mon = BoxMonitor(
        target_acceptance=0.9, error_score="softmax", peak_factor=None, mahalanobis_term=False
    ).fit(acts, y, pred, logits=logits, validation=(vacts, vy, vpred, vlogits))
    rt = mon.runtime_
    assert rt.has_energy_term() and rt.energy_scale > 0
    right = vy == vpred
    energy = -np.log(np.exp(vlogits[right]).sum(axis=1))
    assert rt.energy_center == pytest.approx(np.median(energy))
    with pytest.raises(ValueError, match="logits"):
        mon.outlier_score(vacts, vpred)
    score = mon.outlier_score(vacts, vpred, logits=vlogits)
    dist = rt.layer_scores(vacts, vpred)
    con = rt.contrast_layer_scores(vacts, vpred)
    e_all = -np.log(np.exp(vlogits).sum(axis=1))
    terms = [dist[k] / rt.score_scales[k] for k in rt.score_layers]
    terms += [con[k] / rt.contrast_scales[k] for k in rt.contrast_layers]
    terms += [np.maximum(e_all - rt.energy_center, 0) / rt.energy_scale] * boxes_module.ENERGY_TERMS
    np.testing.assert_allclose(score, np.sqrt(np.mean(np.square(terms), axis=0)), atol=1e-12)
    # Same activations, weak logits (all equal and low): a higher score, never a lower one.
    weak = np.full_like(vlogits, vlogits.min() - 5)
    weak_score = mon.outlier_score(vacts, vpred, logits=weak)
    assert np.all(weak_score >= score) and np.mean(weak_score > score) > 0.9
    nan = vlogits.copy()
    nan[:5, 0] = np.nan
    assert np.all(np.isinf(mon.outlier_score(vacts, vpred, logits=nan)[:5]))
    assert np.all(mon.predict(vacts, vpred, logits=nan).combined[:5] == REJECT)
    # Format 4 round trip; a bad term is refused; a format-3 member has no term.
    members = mon.to_members()
    spec = members[f"{BOXES_PREFIX}.json"]
    assert spec["version"] == 4
    back = BoxRuntime.from_members(members, members)
    np.testing.assert_array_equal(back.scores(vacts, vpred, logits=vlogits), score)
    for bad in (0.0, -1.0, float("nan"), "1", None, True):
        with pytest.raises(ArtifactError, match="energy_scale"):
            BoxRuntime.from_members(
                {**members, spec_name(): {**spec, "energy_scale": bad}}, members
            )
    v3 = {k: v for k, v in spec.items() if k not in ("energy_center", "energy_scale")}
    legacy = BoxRuntime.from_members({**members, spec_name(): {**v3, "version": 3}}, members)
    assert not legacy.has_energy_term()
    off = BoxMonitor(
        target_acceptance=0.9,
        energy_term=False,
        error_score="softmax",
        peak_factor=None,
        mahalanobis_term=False,
    ).fit(acts, y, pred, logits=logits, validation=(vacts, vy, vpred, vlogits))
    assert not off.runtime_.has_energy_term()
    assert off.to_members()[f"{BOXES_PREFIX}.json"]["version"] == 3
    np.testing.assert_allclose(
        off.outlier_score(vacts, vpred), legacy.scores(vacts, vpred), rtol=1e-12
    )


def spec_name() -> str:
    return f"{BOXES_PREFIX}.json"


def test_coverage_selection_still_calibrates_on_validation():
    acts, y, pred = synthetic(14, n=300)
    vacts, vy, vpred = synthetic(15, n=200)
    mon = BoxMonitor(selection="coverage", max_clusters=4, eps_ival=0.05).fit(
        acts, y, pred, validation=(vacts, vy, vpred)
    )
    assert mon.selection_ is None and len(mon.calibration_rows_) == 0
    assert mon.calibration_.n_known == int(np.sum(vy == vpred))


def test_quadratic_score_mean_is_the_rms_of_the_scaled_terms():
    """Default ``score_mean="quadratic"``: the score is the root mean square of the scaled
    terms, or the largest distance term over ``peak_factor`` where that is larger; the
    artifact member carries both rules (format 7; format 3 without the peak), and the
    arithmetic mean is still read."""
    acts, y, pred = synthetic(21, n=500)
    vacts, vy, vpred = synthetic(22, n=300)
    mon = BoxMonitor(mahalanobis_term=False).fit(acts, y, pred, validation=(vacts, vy, vpred))
    rt = mon.runtime_
    assert rt.score_mean == "quadratic" and rt.score == "fused" and rt.peak_factor == 1.5
    dist = rt.layer_scores(vacts, vpred)
    con = rt.contrast_layer_scores(vacts, vpred)
    dist_terms = [dist[k] / rt.score_scales[k] for k in rt.score_layers]
    terms = dist_terms + [con[k] / rt.contrast_scales[k] for k in rt.contrast_layers]
    rms = np.sqrt(np.mean(np.square(terms), axis=0))
    want = np.maximum(rms, np.max(dist_terms, axis=0) / 1.5)
    want[~np.isfinite(want)] = np.inf
    assert np.any(want > rms)  # the peak decides some inputs here
    np.testing.assert_allclose(mon.outlier_score(vacts, vpred), want)
    members = mon.to_members()
    assert members[f"{BOXES_PREFIX}.json"]["version"] == 7
    back = BoxRuntime.from_members(members, members)
    assert back.score_mean == "quadratic" and back.peak_factor == 1.5
    np.testing.assert_array_equal(back.scores(vacts, vpred), rt.scores(vacts, vpred))
    plain = BoxMonitor(peak_factor=None, mahalanobis_term=False).fit(
        acts, y, pred, validation=(vacts, vy, vpred)
    )
    prt = plain.runtime_
    pd, pc = prt.layer_scores(vacts, vpred), prt.contrast_layer_scores(vacts, vpred)
    pterms = [pd[k] / prt.score_scales[k] for k in prt.score_layers]
    pterms += [pc[k] / prt.contrast_scales[k] for k in prt.contrast_layers]
    prms = np.sqrt(np.mean(np.square(pterms), axis=0))
    prms[~np.isfinite(prms)] = np.inf
    np.testing.assert_allclose(plain.outlier_score(vacts, vpred), prms)
    assert plain.to_members()[f"{BOXES_PREFIX}.json"]["version"] == 3
    arith = BoxMonitor(score_mean="arithmetic").fit(acts, y, pred, validation=(vacts, vy, vpred))
    assert not np.allclose(arith.outlier_score(vacts, vpred), want)


def test_one_far_layer_decides_the_score_and_says_so():
    """Inputs 1.6-2.2 thresholds outside one layer's boxes and familiar on five others: the
    mean of the terms averages most of them down to accept, the peak term rejects every one
    (``outside_boxes`` at that layer); a NaN distance still rejects; format 7 round-trips
    and a bad ``peak_factor`` is refused (issue 38: another data set's images, outside
    the input grid's boxes only)."""
    acts, y, pred = synthetic(31, n=900, d=4)
    vacts, vy, vpred = synthetic(32, n=900, d=4)
    for i in range(4):  # four more familiar layers
        acts[f"c{i}"], vacts[f"c{i}"] = acts["b"] + i, vacts["b"] + i
    kw = dict(target_acceptance=0.9, normalize="none", score="distance")
    peak = BoxMonitor(**kw).fit(acts, y, pred, validation=(vacts, vy, vpred))
    mean = BoxMonitor(**kw, peak_factor=None).fit(acts, y, pred, validation=(vacts, vy, vpred))
    rt, thr = peak.runtime_, peak.calibration_.threshold
    right = vy == vpred
    base = {k: v[right] for k, v in vacts.items()}
    yb = vpred[right]
    direction = np.random.default_rng(0).normal(size=base["a"].shape)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    keep = np.zeros(len(yb), dtype=bool)
    shifted = base["a"].copy()
    for t in np.linspace(0.05, 4.0, 80):  # each row at the first step that puts it in band
        moved = base["a"] + t * direction
        d = rt.layer_scores({**base, "a": moved}, yb)["a"] / rt.score_scales["a"]
        band = ~keep & (d > 1.6 * thr) & (d < 2.2 * thr)
        shifted[band], keep = moved[band], keep | band
    far = {k: v[keep] for k, v in {**base, "a": shifted}.items()}
    yf = yb[keep]
    assert len(yf) > 100
    d_a = rt.layer_scores(far, yf)["a"] / rt.score_scales["a"]
    accepted_mean = np.mean(mean.predict(far, yf).combined == ACCEPT)
    assert not np.any(peak.predict(far, yf).combined == ACCEPT) and accepted_mean > 0.5
    verdicts, _, scores, reasons = rt.explain(far, yf)
    out = scores == d_a / 1.5  # the peak made the score
    assert np.all(verdicts == REJECT) and out.mean() > 0.9
    assert set(reasons.names()[out]) == {"outside_boxes"}
    assert {reasons.layers()[i] for i in np.flatnonzero(out)} == {"a"}
    nan = {k: v.copy() for k, v in far.items()}
    nan["c0"][:5] = np.nan
    assert np.all(peak.predict(nan, yf).combined[:5] == REJECT)
    members = peak.to_members()
    spec = members[spec_name()]
    assert spec["version"] == 7 and spec["peak_factor"] == 1.5
    back = BoxRuntime.from_members(members, members)
    np.testing.assert_array_equal(back.scores(far, yf), peak.outlier_score(far, yf))
    for bad in (0, -1.0, float("nan"), float("inf"), "1.5", None, True):
        with pytest.raises(ArtifactError, match="peak_factor"):
            BoxRuntime.from_members({**members, spec_name(): {**spec, "peak_factor": bad}}, members)
    v6 = {k: v for k, v in spec.items() if k != "peak_factor"}
    legacy = BoxRuntime.from_members({**members, spec_name(): {**v6, "version": 6}}, members)
    assert legacy.peak_factor is None
    np.testing.assert_array_less(legacy.scores(far, yf) - 1e-12, back.scores(far, yf))
    for bad_param in (0, -1.0, "high"):
        with pytest.raises(ValueError, match="peak_factor"):
            BoxMonitor(peak_factor=bad_param).fit(acts, y, pred)
