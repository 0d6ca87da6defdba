"""Package faces that import their modules on first use (PEP 562).

A package's ``__init__`` names its public API in a table, ``{submodule: names}``, and sets
``__getattr__ = lazy_exports(__name__, table)``; the same names are imported under
``TYPE_CHECKING`` for type checkers. Importing one light module of the package (its errors,
its vocabularies) then runs no other: the agent loop, Kafka and prometheus load when a name
that needs them is first read.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, table: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``table``'s names on first use.

    ``table`` maps a submodule (relative to ``package``) to the public names it defines. A
    name read once is stored on the package, so later reads do not come back here.
    """
    where = {name: module for module, names in table.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
