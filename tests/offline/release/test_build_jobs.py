"""The build's per-class work on more cores and on a cluster (issue 40): ``monitor.n_jobs``
and ``--jobs`` (which takes precedence) run it through joblib, and the whole signed artifact
(and the report's coverage curves) is the serial build's, byte for byte, on the cores of
this machine and on a local Dask cluster."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import joblib
import pytest
import yaml

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.commands.demo import write_build_config
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.memory import Resources
from boxwatch.offline.release.pipeline import build, prepare
from boxwatch.offline.release.records import MonitorSection, MonitorSummary

CREATED_AT = 1_700_000_000


@pytest.fixture
def jobs_example(tmp_path: Path) -> Callable[..., tuple[bytes, Any]]:
    """``jobs_example(n_jobs=None)``: the signed bytes of the bundled example (model and BN
    halves, the test tau list) and its report's coverage curves, built from one config whose
    ``monitor.n_jobs`` is -1, with ``n_jobs`` in place of it (``--jobs``) when given."""
    private, public = tmp_path / "keys" / "test.key", tmp_path / "keys" / "test.pub"
    generate_keypair(private, public, force=True)
    config = write_build_config(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["monitor"].update(tau=[1.0, 0.2, 0.05], n_jobs=-1)
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    key = load_private_key(private)

    def make(n_jobs: int | None = None) -> tuple[bytes, Any]:
        prepared = prepare(load_config(config), resources=Resources(n_jobs=n_jobs))
        outcome = build(prepared, key, created_at=CREATED_AT)
        monitor = outcome.summary.monitor
        assert isinstance(monitor, MonitorSummary)
        return outcome.artifact, monitor.coverage

    return make


def test_n_jobs_takes_joblibs_values_but_zero(tmp_path):
    path = tmp_path / "c.yaml"
    for good in (-1, -2, 1, 4):
        path.write_text(f"version: 1\nmodel: {{path: m.onnx}}\nmonitor: {{n_jobs: {good}}}\n")
        assert load_config(path).spec.monitor.n_jobs == good
    path.write_text("version: 1\nmodel: {path: m.onnx}\nmonitor: {n_jobs: 0}\n")
    with pytest.raises(ConfigError, match="monitor.n_jobs"):
        load_config(path)


def test_jobs_take_precedence_over_the_config():
    section = MonitorSection.from_raw({"n_jobs": -1})
    assert section.estimator(None).n_jobs == -1
    assert section.with_jobs(None).estimator(None).n_jobs == -1
    assert section.with_jobs(1).estimator(None).n_jobs == 1
    assert MonitorSection().estimator(None).n_jobs is None  # joblib's default: 1 job


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None,
    reason="dask.distributed is not installed (pip install 'boxwatch[cluster]')",
)
def test_a_build_on_every_core_and_on_a_local_dask_cluster_gives_the_serial_bytes(
    jobs_example,
):
    from dask.distributed import Client, LocalCluster, get_task_stream

    serial = jobs_example(n_jobs=1)
    assert serial[1]  # the coverage curves, which run through joblib too
    assert jobs_example() == serial  # monitor.n_jobs: -1, this machine's cores (loky)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
        joblib.parallel_config(backend="dask"),
        get_task_stream(client) as tasks,
    ):
        on_cluster = jobs_example()
    assert tasks.data  # the per-class work ran on the cluster's workers
    assert on_cluster == serial
