"""The type checker's gate: its settings in pyproject, and every ``# type: ignore`` explained."""

from __future__ import annotations

import re
import tomllib

from locations import ROOT

PRODUCT = ("agent", "offline", "boxwatch", "examples")


def test_mypy_settings_are_strict_enough():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mypy = pyproject["tool"]["mypy"]
    assert mypy["check_untyped_defs"] and mypy["warn_unused_ignores"]
    assert mypy["no_implicit_optional"]
    assert not mypy.get("ignore_missing_imports") and not mypy.get("ignore_errors")
    for override in mypy.get("overrides", []):
        modules = override["module"]
        modules = [modules] if isinstance(modules, str) else modules
        assert not any(m.split(".")[0] in ("boxwatch", "agent", "offline") for m in modules)
        assert set(override) <= {"module", "ignore_missing_imports"}, override
        assert all(m != "*" for m in modules)
    assert any("mypy" in dep for dep in pyproject["project"]["optional-dependencies"]["dev"])
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test:", "lint:"):
        recipe = makefile.split(f"\n{target}", 1)[1].split("\n\n", 1)[0]
        assert "ruff check" in recipe and "tools/typecheck.py" in recipe, target
        assert recipe.index("ruff") < recipe.index("tools/typecheck.py"), target


def test_every_type_ignore_names_its_code_and_reason():
    pattern = re.compile(r"#\s*type:\s*ignore(?P<code>\[[a-z-, ]+\])?(?P<rest>.*)$")
    bare = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                m = pattern.search(line)
                if m and (not m["code"] or not re.match(r"\s*#\s*\S", m["rest"])):
                    bare.append(f"{path.relative_to(ROOT)}:{n}")
    assert bare == []
