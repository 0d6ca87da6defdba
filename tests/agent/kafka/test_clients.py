"""The table of Kafka client libraries (``agent/kafka/clients.py``): each row's adapter is
imported only when chosen, and a chosen library that is not installed is one clear error."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest
from locations import ROOT

from boxwatch.agent.errors import MissingDependencyError
from boxwatch.agent.kafka import clients, make_consumer, make_producer
from boxwatch.agent.kafka.base import ClientAdapter

OPTIONAL = {name: lib for name, lib in clients.LIBRARIES.items() if lib.extra is not None}


def test_there_is_an_optional_library_to_check():
    assert "confluent-kafka" in OPTIONAL


def test_importing_the_agent_imports_no_client_library():
    """The adapters (and so the libraries) are imported when chosen, not before."""
    libraries = sorted(lib.requires for lib in clients.LIBRARIES.values())
    code = (
        "import sys\n"
        "import boxwatch.agent.config, boxwatch.agent.kafka, boxwatch.agent.service\n"
        f"print([m for m in {libraries!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("name", list(clients.LIBRARIES))
def test_each_row_names_its_adapter_module(name):
    lib = clients.LIBRARIES[name]
    if importlib.util.find_spec(lib.requires) is None:
        pytest.skip(f"{name} not installed ({lib.install})")
    module, _, attribute = lib.adapter.partition(":")
    found = clients.adapter({"kafka.library": name})
    assert isinstance(found, ClientAdapter)
    assert found is getattr(importlib.import_module(module), attribute)
    assert found.consumer.__module__ == found.producer.__module__ == module


@pytest.mark.parametrize("name", list(OPTIONAL))
def test_a_chosen_library_not_installed_names_its_extra(monkeypatch, name):
    lib = OPTIONAL[name]
    monkeypatch.setitem(sys.modules, lib.requires, None)  # import now fails: not installed
    expected = (
        f"kafka.library is {name} but it is not installed (pip install 'boxwatch[{lib.extra}]')"
    )
    for make in (make_producer, lambda cfg: make_consumer(cfg, ["t"])):
        with pytest.raises(MissingDependencyError) as err:
            make({"kafka.library": name})
        assert str(err.value) == expected


def test_the_help_text_names_every_library_and_how_to_install_it():
    text = clients.libraries_text()
    for name, lib in clients.LIBRARIES.items():
        assert f"`{name}` ({lib.about}" in text and lib.install in text


def test_the_docs_compare_every_library():
    doc = (ROOT / "docs" / "agent-config.md").read_text()
    header = next(line for line in doc.splitlines() if line.startswith("| | `kafka-python`"))
    assert all(f"`{name}`" in header for name in clients.LIBRARIES), header
