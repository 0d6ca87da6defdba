"""Sizes, the default memory bound, the guard that turns an OOM kill into MemoryError, and
the wall-clock deadline every route checks while it runs."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from bn_synthetic import naive_bayes, random_dag
from deadlines import Countdown

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn import compile as bn_compile
from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.limits import (
    MEMORY_SHARE,
    CompileTimeError,
    Deadline,
    default_max_memory,
    format_bytes,
    format_seconds,
    parse_size,
    total_memory,
)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4G", 4 << 30),
        ("512M", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("100000", 100_000),
        ("2k", 2048),
        (" 3 T ", 3 << 40),
        ("1gb", 1 << 30),
    ],
)
def test_sizes_parse_in_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "four", "4X", "-1G", "0", "1.2.3M"])
def test_bad_sizes_name_the_text(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_default_bound_is_a_share_of_the_machine():
    assert default_max_memory() == int(total_memory() * MEMORY_SHARE)
    assert 0 < default_max_memory() < total_memory()


def test_figures_read_as_people_write_them():
    assert format_bytes(4 << 30) == "4 GiB"
    assert format_bytes(1000) == "1000 B"
    assert format_seconds(3.21) == "3.2 s" and format_seconds(7200) == "2 h"
    assert format_seconds(86400 * 10).endswith("days")


@pytest.mark.slow
def test_guard_turns_an_oversized_allocation_into_memory_error():
    # in a child process: the cap applies to the whole process
    code = (
        "import numpy as np\n"
        "from boxwatch.offline.bn.limits import memory_guard\n"
        "with memory_guard(64 << 20):\n"
        "    try:\n"
        "        np.ones(1 << 28)\n"
        "        print('allocated')\n"
        "    except MemoryError:\n"
        "        print('refused')\n"
        "print(np.ones(1 << 26).sum() > 0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["refused", "True"]  # 2 GiB refused under the cap, 512 MiB fine after it


def _bn_config(tmp_path, max_memory: str) -> object:
    from bn_synthetic import random_dag

    from boxwatch.offline.bn.formats import write_bif
    from boxwatch.offline.release.config import load_config

    (tmp_path / "net.bif").write_text(write_bif(random_dag(6, seed=3, floor=0.01)))
    (tmp_path / "build.yaml").write_text(
        "version: 1\nbn: {file: net.bif, class: v2, positive: s0, threshold: 0.5, "
        f"max_memory: {max_memory}}}\n"
    )
    return load_config(tmp_path / "build.yaml")


def test_build_config_bounds_the_compilation(tmp_path):
    from boxwatch.agent.errors import ConfigError
    from boxwatch.offline.bn.plan import CompileLimitError
    from boxwatch.offline.release import bn_stage

    bn = bn_stage.prepare(_bn_config(tmp_path, "2K"))
    assert bn.max_memory == 2048
    with pytest.raises(CompileLimitError, match="memory limit 2 KiB"):
        bn_stage.run(bn)
    with pytest.raises(ConfigError, match="bn.max_memory: 'plenty' is not a size"):
        bn_stage.prepare(_bn_config(tmp_path, "plenty"))


def test_deadline_without_a_limit_never_expires():
    Deadline(None, "net.bif", start=time.perf_counter() - 1e6).check("anything")


def _expired(seconds: float = 0.5) -> Deadline:
    """A deadline whose limit passed long ago (no waiting, no timing in the test)."""
    return Deadline(seconds, "net.bif", start=time.perf_counter() - 3600)


def test_deadline_names_the_limit_route_and_how_far_it_got():
    deadline = _expired()
    deadline.route = "joint"
    with pytest.raises(CompileTimeError) as info:
        deadline.check("level 3 of 9")
    text = str(info.value)
    assert text.startswith("net.bif: time limit 0.5 s reached after 3.6e+03 s in the joint route")
    assert "(level 3 of 9)" in text and "--max-seconds" in text and "\n" not in text
    assert isinstance(info.value, ConfigError)  # exit code 2 in the CLI


def _hidden(seed: int):
    net = random_dag(10, seed=seed, floor=0.001)
    spec = ClassifierSpec(
        "v2", net.states["v2"][0], 0.4, features=[v for v in net.variables[-5:] if v != "v2"]
    )
    return net, resolve_spec(net, spec)


@pytest.mark.parametrize(
    ("route", "reached"),
    [
        ("joint", "the joint table was contracted"),
        ("separator", "the suffix message was contracted"),
        ("additive", "completion sums of level"),
        ("jointree", "step 1 of"),
    ],
)
def test_every_route_stops_at_its_wall_clock_limit(route, reached):
    if route == "additive":
        net = naive_bayes(6, seed=0)
        spec = resolve_spec(net, ClassifierSpec("C", net.states["C"][0], 0.5))
    else:
        net, spec = _hidden(1)
    limit = 1e12
    with pytest.raises(CompileTimeError, match=reached):
        if route == "joint":
            plan = bn_plan.plan_joint(net, spec, max_memory=limit)
            bn_compile._compile_joint(net, spec, plan.contraction, _expired())
        elif route == "separator":
            sep = bn_plan.plan_separator(net, spec, max_memory=limit)
            bn_compile._compile_separator(net, spec, sep, max_memory=limit, deadline=_expired())
        elif route == "additive":
            bn_compile._compile_additive(net, spec, _expired())
        else:
            tree = bn_plan.plan_jointree(net, spec, max_memory=limit)
            bn_compile._compile_jointree(net, spec, tree, max_memory=limit, deadline=_expired())


# ---------------------------------------------------------------------------- planning
def _one_state_features(n: int, **spec):
    """Naive Bayes whose ``n`` features have one state each: one input, so no estimate can
    rule a route out before it is planned, and planning is all the work there is."""
    net = naive_bayes(n, seed=0, card=1)
    return net, resolve_spec(net, ClassifierSpec("C", **spec))


@pytest.mark.parametrize("planner", ["jointree", "separator"])
def test_planning_stops_at_its_wall_clock_limit(planner):
    net, spec = _one_state_features(60, decision="argmax")
    with pytest.raises(CompileTimeError, match=r"in the planning route \(.*cut"):
        if planner == "jointree":
            bn_plan.plan_jointree(net, spec, max_memory=1e12, deadline=Countdown(10))
        else:
            bn_plan.plan_separator(net, spec, max_memory=1e12, deadline=Countdown(10))


def test_planning_past_the_limit_refuses_naming_the_route_it_was_planning():
    net, spec = _one_state_features(60, decision="argmax")
    with pytest.raises(bn_plan.CompileLimitError) as info:
        bn_compile.compile_classifier(net, spec, deadline=Countdown(3))
    text = str(info.value)
    assert "no route fits the limits" in text and "planning stopped at the time limit" in text
    assert "\n" not in text


@pytest.mark.parametrize("decision", ["threshold", "argmax"])
@pytest.mark.parametrize("n", [500, 2_500])
def test_thousands_of_features_are_sized_in_seconds(n, decision):
    """Routes that cannot fit are ruled out from cardinalities before any cut is planned
    (the old planners took minutes for 2,000 features: a max-flow per cut, each sorting
    the variables by a list scan)."""
    net = naive_bayes(n, seed=0)
    wanted = {"positive": "pos", "threshold": 0.5} if decision == "threshold" else {}
    spec = resolve_spec(net, ClassifierSpec("C", decision=decision, **wanted))
    start = time.perf_counter()
    with pytest.raises(bn_plan.CompileLimitError, match="no route fits"):
        bn_compile.compile_classifier(net, spec, max_memory=4 << 30)
    assert time.perf_counter() - start < 3.0


@pytest.mark.parametrize("n", [300, 1_200])
def test_planning_is_held_to_max_seconds(n):
    """Even where every route has to be planned, the limit binds the planning."""
    net, spec = _one_state_features(n, decision="argmax")
    start = time.perf_counter()
    try:
        bn_compile.compile_classifier(net, spec, max_seconds=0.5)
    except ConfigError as exc:
        assert "time limit" in str(exc)
    assert time.perf_counter() - start < 0.5 + 2.0
