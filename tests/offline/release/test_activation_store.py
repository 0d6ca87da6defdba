"""The build's activation store (issue 40): activations and logits go through memory-mapped
``.npy`` files that the build removes, and the artifact is the in-memory build's, byte for byte."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from example_build import build_example

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.keys import load_private_key
from boxwatch.agent.taps import open_tap
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.memory import Resources
from boxwatch.offline.release.pipeline import build, extract, prepare
from boxwatch.offline.release.store import ActivationStore, memory_filesystem

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return build_example(tmp_path_factory.mktemp("store"), without="bn")


def outcome(example, resources: Resources):
    prepared = prepare(load_config(example.config), resources=resources)
    return build(prepared, load_private_key(example.private_key), created_at=1_700_000_000)


def test_the_store_build_gives_the_in_memory_build_byte_for_byte(example, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    on_disk = outcome(example, Resources(work_dir=work))
    in_memory = outcome(example, Resources(in_memory=True))
    assert on_disk.artifact == in_memory.artifact
    a, b = on_disk.summary.to_dict(), in_memory.summary.to_dict()
    for summary in (a, b):  # the seconds each part took
        del summary["timings"], summary["monitor"]["layer_choice"]["seconds"]
    assert a == b
    assert list(work.iterdir()) == []  # the store's folder is gone


def test_extraction_writes_memory_mapped_files_that_hold_the_activations(example, tmp_path):
    prepared = prepare(load_config(example.config))
    mi = prepared.model
    assert mi is not None
    layers = ["input", "act2"]
    mi = dataclasses.replace(mi, layers=layers, tap=open_tap(mi.path, layers))
    x = mi.data["train"][0]
    with ActivationStore(tmp_path) as store:
        logits, acts = extract(mi, [x, x[:7]], store=store)
        assert store.folder is not None
        files = sorted(store.folder.glob("*.npy"))
        assert len(files) == 1 + len(mi.layers)
        assert isinstance(logits.base, np.memmap)
        on_disk = np.load(files[0], mmap_mode="r")
        np.testing.assert_array_equal(on_disk, logits)
        plain_logits, plain_acts = extract(mi, x)
        np.testing.assert_array_equal(logits[: len(x)], plain_logits)
        np.testing.assert_array_equal(logits[len(x) :], plain_logits[:7])
        for layer in mi.layers:
            np.testing.assert_array_equal(acts[layer][: len(x)], plain_acts[layer])
        assert store.nbytes == sum(a.nbytes for a in (logits, *acts.values()))
        folder = store.folder
    assert not folder.exists()


def test_a_store_that_cannot_be_created_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot create the activation store"):
        ActivationStore(blocker).__enter__()


def test_memory_filesystems_are_recognised(tmp_path):
    assert memory_filesystem(tmp_path) is None or Path(tmp_path).is_relative_to("/tmp")
    shm = Path("/dev/shm")
    if not shm.is_dir() or memory_filesystem(shm) is None:
        pytest.skip("no tmpfs at /dev/shm here")
    assert memory_filesystem(shm) == "tmpfs"
