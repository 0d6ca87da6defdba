"""The fit at scale (issue 40): per-class work through joblib gives the serial fit's bytes
(processes, a local Dask cluster), inputs read in place (memory-mapped), and what is
subsampled past a size changes nothing below it; the shortcuts that replace quadratic work
give the same results as that work."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import joblib
import numpy as np
import pytest

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent.arrays import dumps_npz
from boxwatch.agent.artifact import canonical_json
from boxwatch.agent.boxes import BoxRuntime, BoxSet, ModelOutputs
from boxwatch.agent.errors import ArtifactError
from boxwatch.offline.monitors import coverage, estimator, perclass
from boxwatch.offline.monitors.estimator import BoxMonitor, MonitorValueError, output_kind
from boxwatch.offline.monitors.taukmeans import TauKMeansPath, cluster_boxes, n_distinct_rows


@pytest.fixture
def clouds():
    """``clouds(n_classes, d, n, seed=0)``: one Gaussian cloud per class after a ReLU,
    logits from a linear read-out plus noise (some predictions wrong): ``(acts, y, pred,
    logits)`` with one layer ``"f"``."""

    def make(n_classes: int, d: int, n: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        centres = rng.normal(size=(n_classes, d)).astype(np.float32)
        y = rng.permutation(np.arange(n) % n_classes)
        x = np.maximum(centres[y] + rng.normal(size=(n, d)).astype(np.float32), 0)
        logits = x @ centres.T / np.sqrt(d) + rng.normal(scale=0.8, size=(n, n_classes))
        return {"f": x}, y, logits.argmax(axis=1), logits.astype(np.float32)

    return make


def member_bytes(monitor: BoxMonitor) -> tuple[bytes, bytes]:
    """The box members as the artifact stores them (canonical JSON, the .npz bytes)."""
    json_member, npz_member = monitor.to_members().values()
    return canonical_json(json_member), dumps_npz(npz_member)


def test_n_jobs_follows_joblibs_convention():
    with pytest.raises(MonitorValueError, match="n_jobs=0 should be"):
        BoxMonitor(n_jobs=0).fit({"f": np.zeros((4, 2))}, np.zeros(4, int), np.zeros(4, int))
    assert estimator.validate_params(BoxMonitor._parameter_constraints, {"n_jobs": -1}) == {}


@pytest.mark.slow
def test_fit_on_two_processes_gives_the_serial_bytes(clouds):
    acts, y, pred, logits = clouds(12, 16, 1500)
    serial = BoxMonitor().fit(acts, y, pred, logits=logits)
    parallel = BoxMonitor(n_jobs=2).fit(acts, y, pred, logits=logits)
    assert member_bytes(parallel) == member_bytes(serial)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None,
    reason="dask.distributed is not installed (pip install 'boxwatch[cluster]')",
)
def test_fit_on_a_local_dask_cluster_gives_the_serial_bytes(clouds):
    from dask.distributed import Client, LocalCluster

    acts, y, pred, logits = clouds(12, 16, 1500)
    serial = BoxMonitor().fit(acts, y, pred, logits=logits)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        Client(cluster),
        joblib.parallel_config(backend="dask"),
    ):
        on_cluster = BoxMonitor().fit(acts, y, pred, logits=logits)
    assert member_bytes(on_cluster) == member_bytes(serial)


def test_memory_mapped_activations_give_the_same_bytes(clouds, tmp_path):
    acts, y, pred, logits = clouds(6, 8, 600)
    np.save(tmp_path / "f.npy", acts["f"])
    mapped = {"f": np.load(tmp_path / "f.npy", mmap_mode="r")}
    in_memory = BoxMonitor().fit(acts, y, pred, logits=logits)
    from_disk = BoxMonitor().fit(mapped, y, pred, logits=logits)
    assert member_bytes(from_disk) == member_bytes(in_memory)


def test_kmeans_subsamples_only_past_max_samples():
    x = np.random.default_rng(0).normal(size=(200, 4))
    full = TauKMeansPath(x, random_state=3)
    at_size = TauKMeansPath(x, random_state=3, max_samples=200)
    assert not at_size.sampled
    for k in (1, 2, 5):
        np.testing.assert_array_equal(at_size.fit_k(k).labels, full.fit_k(k).labels)


def test_a_subsampled_path_labels_every_row_and_is_deterministic():
    x = np.random.default_rng(0).normal(size=(500, 3))
    path = TauKMeansPath(x, random_state=7, max_samples=60)
    again = TauKMeansPath(x, random_state=7, max_samples=60)
    assert path.sampled and len(path.x_fit) == 60
    clustering = path.cluster(0.05)
    assert len(clustering.labels) == 500 and clustering.k > 1
    np.testing.assert_array_equal(clustering.labels, again.cluster(0.05).labels)
    lo, hi = cluster_boxes(x, clustering.labels)
    inside = ((x[:, None, :] >= lo) & (x[:, None, :] <= hi)).all(axis=2).any(axis=1)
    assert inside.all()  # the boxes hold every row, not only the fitted ones


def test_a_subsampled_fit_keeps_every_training_row_in_a_box(clouds, monkeypatch):
    monkeypatch.setattr(estimator, "KMEANS_MAX_SAMPLES", 40)
    acts, y, pred, logits = clouds(3, 6, 900)
    mon = BoxMonitor(tau=0.05, combine="any").fit(acts, y, pred)
    good = y == pred
    assert mon.runtime_.good["f"].counts().min() > 1
    verdicts = mon.predict({"f": acts["f"][good]}, pred[good])
    assert (verdicts.per_layer["f"] != 2).all()


def test_the_coverage_search_on_a_sample_of_classes(clouds, monkeypatch):
    acts, y, pred, logits = clouds(8, 6, 1200)
    full = BoxMonitor(combine="any").fit(acts, y, pred).tau_["f"]
    monkeypatch.setattr(estimator, "COVERAGE_MAX_CLASSES", 3)
    sampled = BoxMonitor(combine="any").fit(acts, y, pred).tau_["f"]
    searched = sampled == full
    assert searched.sum() >= 3  # the searched classes keep their own tau
    rest = np.unique(sampled[~searched])
    assert len(rest) <= 1 and np.isin(rest, np.round(np.median(full[searched]), 6)).all()


def test_held_out_class_selection_measures_every_class_below_the_cap(clouds):
    acts, y, pred, _ = clouds(5, 6, 400)
    boxes = BoxMonitor(tau=0.1, combine="any").fit(acts, y, pred).runtime_.good["f"]
    table = estimator._held_out_classes(boxes, acts["f"], y, pred)
    assert (table == np.arange(5)).all()


def test_held_out_class_selection_past_the_cap_keeps_label_and_prediction(clouds, monkeypatch):
    monkeypatch.setattr(estimator, "HELD_OUT_CANDIDATES", 2)
    acts, y, pred, _ = clouds(7, 6, 700)
    boxes = BoxMonitor(tau=0.1, combine="any").fit(acts, y, pred).runtime_.good["f"]
    table = estimator._held_out_classes(boxes, acts["f"], y, pred)
    assert table.shape == (700, 4)
    for want in (y, pred):
        assert (table == want[:, None]).any(axis=1).all()
    rows = np.sort(table, axis=1)
    assert not ((rows[:, 1:] == rows[:, :-1]) & (rows[:, 1:] >= 0)).any()  # no class twice


def reference_complement(boxes: BoxSet, n_neighbours: int) -> list[np.ndarray]:
    """Every other box's gap to the class, all pairs (the quadratic definition)."""
    off = boxes.offsets
    centre = (boxes.lo.astype(np.float64) + boxes.hi) / 2
    owner = np.repeat(np.arange(boxes.n_classes), boxes.counts())
    out = []
    for c in range(boxes.n_classes):
        others = np.r_[0 : off[c], off[c + 1] : off[-1]].astype(np.int64)
        own = centre[off[c] : off[c + 1]]
        if len(own) and len(others):
            gap = ((centre[others][:, None, :] - own[None]) ** 2).sum(axis=2).min(axis=1)
            others = others[np.argsort(gap, kind="stable")]
            if n_neighbours > 0:
                cls = owner[others]
                near = cls[np.sort(np.unique(cls, return_index=True)[1])][:n_neighbours]
                others = others[np.isin(cls, near)]
        out.append(others)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_complement_rows_match_every_pair(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, size=9)
    lo = rng.integers(0, 3, size=(counts.sum(), 3)).astype(np.float32)  # ties on a grid
    boxes = BoxSet(lo, lo + 1, np.r_[0, np.cumsum(counts)])
    for n in (0, 1, 2):
        want = reference_complement(boxes, n)
        for candidates in (0, 8, 20):
            got = boxes_module._complement_rows(boxes, n, candidates)
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_contrast_candidates_change_nothing_up_to_that_many_classes(clouds):
    acts, y, pred, logits = clouds(6, 8, 900)
    mon = BoxMonitor(peak_factor=None).fit(acts, y, pred, logits=logits)
    json_member, _ = mon.to_members().values()
    assert json_member["version"] not in (6, 7) and "contrast_candidates" not in json_member
    rt = mon.runtime_
    every = replace(rt, contrast_candidates=0)
    some = replace(rt, contrast_candidates=5)
    verdicts, _, scores, reasons = every.explain(acts, pred, logits=logits)
    verdicts_5, _, scores_5, reasons_5 = some.explain(acts, pred, logits=logits)
    np.testing.assert_array_equal(verdicts_5, verdicts)
    np.testing.assert_array_equal(scores_5, scores)
    np.testing.assert_array_equal(reasons_5.nearest, reasons.nearest)


def test_a_monitor_restricting_its_contrast_writes_format_6(clouds):
    acts, y, pred, logits = clouds(40, 8, 4000)
    # softmax for uncertainty: a learnt error model's term per class would need format 8
    mon = BoxMonitor(peak_factor=None, error_score="softmax", mahalanobis_term=False).fit(
        acts, y, pred, logits=logits
    )
    members = mon.to_members()
    json_member = next(iter(members.values()))
    assert json_member["version"] == 6
    assert json_member["contrast_candidates"] == estimator.CONTRAST_CANDIDATES
    loaded = BoxRuntime.from_members(members, members)
    assert loaded.contrast_candidates == estimator.CONTRAST_CANDIDATES
    name = next(iter(members))
    for bad in (-1, "32", True):
        with pytest.raises(ArtifactError, match="contrast_candidates"):
            BoxRuntime.from_members(
                {**members, name: {**json_member, "contrast_candidates": bad}}, members
            )
    np.testing.assert_array_equal(
        loaded.scores(acts, pred, logits=logits), mon.outlier_score(acts, pred, logits=logits)
    )


def test_tau_zero_coverage_needs_no_pairs(monkeypatch):
    x = np.random.default_rng(0).integers(0, 5, size=(60, 3)).astype(np.float64)
    path = TauKMeansPath(x)
    fast = coverage.coverage_at(path, 0.0)
    monkeypatch.setattr(coverage, "_distinct_points", lambda lo, hi: False)
    assert coverage.coverage_at(path, 0.0) == fast


def test_distinct_rows_count_as_numpy_unique_counts():
    rng = np.random.default_rng(0)
    for trial in range(200):
        x = rng.integers(-1, 2, size=(rng.integers(0, 20), 3)).astype(np.float64)
        x[rng.random(x.shape) < 0.3] *= -0.0  # -0.0 equals 0.0
        if trial % 5 == 0 and len(x):
            x[0, 0] = np.nan
        assert n_distinct_rows(x) == (len(np.unique(x, axis=0)) if len(x) else 0)


def test_output_kind_reads_in_blocks(monkeypatch):
    monkeypatch.setattr(estimator, "OUTPUT_BLOCK_VALUES", 6)
    probs = np.full((10, 3), 1 / 3)
    assert output_kind(probs) == "probabilities"
    probs[-1] = [2.0, -0.5, -0.5]  # the last block only is not a probability vector
    assert output_kind(probs) == "logits"


def test_model_outputs_read_once_give_the_functions_values(monkeypatch):
    z = np.random.default_rng(0).normal(scale=4, size=(50, 7))
    z[3, 2] = np.nan
    whole = ModelOutputs(z)
    np.testing.assert_array_equal(whole.top_two_gap[4], np.diff(np.sort(z[4])[-2:])[0])
    monkeypatch.setattr(boxes_module, "_OUTPUT_BLOCK", 20)  # blocks of 2 rows
    read = ModelOutputs(z)
    for name in ("confidence", "energy", "top_two_gap"):
        np.testing.assert_array_equal(getattr(read, name), getattr(whole, name))
    np.testing.assert_array_equal(read.confidence, boxes_module.model_confidence(z))
    np.testing.assert_array_equal(read.energy, boxes_module.model_energy(z))
    scores = np.linspace(0, 3, 50)
    np.testing.assert_array_equal(
        boxes_module.error_features(read, "logits", scores),
        boxes_module.error_features(z, "logits", scores),
    )


def test_contrast_candidates_look_among_the_nearest_class_means_only():
    # Class 1 has a box next to class 0's, but its mean box centre lies far away (its other
    # box): among the 2 classes of nearest mean (2 and 3) class 0's neighbour is class 2.
    lo = np.array([[0.0], [0.5], [100.0], [2.0], [3.0]], np.float32)
    boxes = BoxSet(lo, lo + 0.1, np.array([0, 1, 3, 4, 5]))
    owner = np.array([0, 1, 1, 2, 3])
    assert owner[boxes_module._complement_rows(boxes, 1, 0)[0]].tolist() == [1, 1]
    assert owner[boxes_module._complement_rows(boxes, 1, 2)[0]].tolist() == [2]


def mapped_rss_mb(path) -> float:
    """This process's resident MB of the file ``path`` (Linux's /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total / 1024


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc/self/smaps")
def test_read_pages_of_a_mapped_file_are_given_back(tmp_path):
    data = np.arange(4_000_000, dtype=np.float64).reshape(-1, 100)
    np.save(tmp_path / "x.npy", data)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    rows = mapped[10:]  # a view, as the fit gets its training rows
    assert float(rows.sum()) == float(data[10:].sum())
    assert mapped_rss_mb(tmp_path / "x.npy") > 20
    perclass.release_pages(rows)
    assert mapped_rss_mb(tmp_path / "x.npy") < 1
    np.testing.assert_array_equal(rows[-1], data[-1])  # read again from the file


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc/self/smaps")
def test_a_gather_of_spread_rows_holds_one_range_of_the_map_at_a_time(tmp_path, monkeypatch):
    """A fifth of the rows, spread over a 32 MB file: x[idx] maps nearly all of it (the
    kernel faults in each touched page's neighbours); gather_rows, the calibration's gather,
    holds about one GATHER_BYTES range at a time and gives the same rows in idx's order."""
    data = np.arange(4_000_000, dtype=np.float64).reshape(-1, 1000)  # one 8 KB row
    np.save(tmp_path / "x.npy", data)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    idx = np.random.default_rng(0).permutation(len(data))[: len(data) // 5]  # not sorted
    plain = np.asarray(mapped[np.sort(idx)])
    assert mapped_rss_mb(tmp_path / "x.npy") > 16  # the plain gather mapped half or more
    perclass.release_pages(mapped)
    monkeypatch.setattr(perclass, "GATHER_BYTES", 1 << 20)
    seen: list[float] = []
    release = perclass.release_pages

    def measured(array):
        seen.append(mapped_rss_mb(tmp_path / "x.npy"))
        release(array)

    monkeypatch.setattr(perclass, "release_pages", measured)
    got = perclass.gather_rows(mapped, idx)
    np.testing.assert_array_equal(got, data[idx])
    np.testing.assert_array_equal(got[np.argsort(idx)], plain)
    assert len(seen) > 10 and max(seen) < 8  # 1 MB ranges, plus the kernel's fault-around
    np.testing.assert_array_equal(perclass.gather_rows(data, idx[:7]), data[idx[:7]])
    assert perclass.gather_rows(mapped, np.zeros(0, np.int64)).shape == (0, 1000)


def test_copy_on_write_maps_keep_their_changes(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1000, 10)))
    mapped = np.load(tmp_path / "x.npy", mmap_mode="c")
    mapped[5] = 7.0
    perclass.release_pages(mapped)
    assert (mapped[5] == 7.0).all()
