"""The build's memory estimate and its bound (issue 40, offline/release/memory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.memory import (
    MemoryEstimate,
    MemoryGuard,
    Resources,
    estimate,
)
from boxwatch.offline.release.pipeline import EXTRACT_BATCH, prepare, prepare_model

pytestmark = pytest.mark.slow


def listed_config(example, tmp_path: Path, layers: list[str]) -> Path:
    """The example's config with ``layers`` listed (the input is added to them)."""
    raw = yaml.safe_load(example.config.read_text())
    for spec in raw["data"].values():
        spec["path"] = str(example.config.parent / spec["path"])
    raw["model"]["path"] = str((example.config.parent / raw["model"]["path"]).resolve())
    raw["layers"] = layers
    path = tmp_path / "listed.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_store_estimate_is_the_store_the_build_writes(model_example, tmp_path):
    mi = prepare_model(load_config(listed_config(model_example, tmp_path, ["act2"])))
    est = estimate(mi, Resources(), batch=EXTRACT_BATCH)
    widths = {"input": 64, "act2": 32}
    rows = sum(len(x) for x, _ in mi.data.values())
    assert mi.layers == ["input", "act2"]
    assert est.store == rows * (sum(widths.values()) + len(mi.classes)) * 4
    assert (
        not est.store_counted
        and est.process > 0
        and set(est.phases)
        == {
            "extraction",
            "fit",
            "evaluation",
        }
    )


def test_layers_auto_adds_the_layer_choice_phase(model_example):
    est = prepare(load_config(model_example.config)).memory
    assert est is not None and "layer choice" in est.phases
    assert est.peak == est.process + max(est.phases.values())
    assert est.problems() == []


def test_a_store_in_ram_counts_and_is_named(model_example):
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    mi = prepare_model(load_config(model_example.config))
    est = estimate(mi, Resources(work_dir=shm), batch=EXTRACT_BATCH)
    assert est.store_counted and "tmpfs in RAM" in est.store_where
    assert est.peak == est.process + est.store + max(est.phases.values())


def test_a_build_over_its_bound_says_what_to_do():
    est = MemoryEstimate(
        process=100 << 20,
        store=10 << 30,
        store_counted=False,
        phases={"extraction": 1 << 20, "fit": 3 << 30, "evaluation": 1 << 30},
        bound=2 << 30,
        bound_name="--max-memory",
        store_where="/scratch",
        disk_free=5 << 30,
    )
    memory, disk = est.problems()
    assert memory.startswith("the build needs about 3.1 GiB of memory (largest phase: fit)")
    assert "--max-memory is 2 GiB: raise --max-memory, lower data.train.limit" in memory
    assert disk == (
        "the activation store needs 10 GiB on disk, /scratch has 5 GiB free: give --work-dir "
        "a folder with more space (or lower data.train.limit)"
    )


def test_the_guard_stops_past_its_bound_only():
    MemoryGuard(1 << 50, "--max-memory").check("extracting activations")
    with pytest.raises(ConfigError, match=r"passed --max-memory \(1 MiB\) while extracting"):
        MemoryGuard(1 << 20, "--max-memory").check("extracting activations")


def test_jobs_on_this_machine_count_their_worker_processes(model_example):
    """--jobs N starts N worker processes of its own (each its Python, numpy and
    scikit-learn, and a job's rows): the estimate counts them, names them, and a bound that
    one job fits but the workers do not says to lower --jobs; a cluster's workers (here the
    threading backend, whose jobs run in this process) add nothing."""
    import joblib

    from boxwatch.offline.release.memory import WORKER_BASE

    cfg = load_config(model_example.config)
    one = prepare(cfg, resources=Resources(n_jobs=1)).memory
    three = prepare(cfg, resources=Resources(n_jobs=3)).memory
    assert one is not None and three is not None
    assert one.workers == 0 and three.workers == 3 and three.worker_bytes > WORKER_BASE
    assert three.peak - three.workers * three.worker_bytes == pytest.approx(one.peak, rel=0.05)
    assert "3 worker processes" in three.text() and "worker" not in one.text()
    between = (one.peak + three.peak) // 2
    with pytest.raises(ConfigError, match=r"3 worker processes of --jobs .*lower --jobs"):
        prepare(cfg, resources=Resources(n_jobs=3, max_memory=between))
    assert prepare(cfg, resources=Resources(n_jobs=1, max_memory=between)).memory is not None
    with joblib.parallel_config(backend="threading"):
        threads = prepare(cfg, resources=Resources(n_jobs=3)).memory
    assert threads is not None and threads.workers == 0
