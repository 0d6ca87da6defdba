"""``build-artifact --max-memory``, ``--work-dir`` and ``--jobs`` (issue 40): the build's
peak memory is estimated before any activation is extracted, a build that will not fit stops
at once with one line and exit 2, the activation store lives in ``--work-dir`` only while it
runs, and ``--jobs`` changes how fast the artifact is built, never its bytes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from boxwatch.cli import cli
from boxwatch.commands.console import EXIT_OK, EXIT_USAGE

pytestmark = pytest.mark.slow


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], env={}, catch_exceptions=False)


def build(example, out, *extra: object):
    return run("build-artifact", example.config, "--key", example.private_key, "--out", out, *extra)


def test_a_tiny_max_memory_stops_before_the_build_with_one_line(model_example, tmp_path):
    out = tmp_path / "a.bwa"
    result = build(model_example, out, "--max-memory", "1M")
    assert result.exit_code == EXIT_USAGE
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "the build needs about" in errors[0] and "--max-memory is 1 MiB" in errors[0]
    assert "raise --max-memory" in errors[0]
    assert "Traceback" not in result.stderr and not out.exists()


def test_a_generous_max_memory_builds_and_prints_the_estimate(model_example, tmp_path):
    out = tmp_path / "a.bwa"
    result = build(model_example, out, "--max-memory", "16G")
    assert result.exit_code == EXIT_OK, result.stderr
    assert out.is_file()
    line = next(x for x in result.stderr.splitlines() if x.startswith("memory: about"))
    assert "of 16 GiB (--max-memory)" in line and "activation store" in line


def test_dry_run_prints_the_estimate_against_this_machine(model_example):
    result = run("build-artifact", model_example.config, "--dry-run")
    assert result.exit_code == EXIT_OK, result.stderr
    assert "(this machine's memory)" in result.stderr and "fit " in result.stderr
    quiet = run("build-artifact", model_example.config, "--dry-run", "--quiet")
    assert "memory: about" in quiet.stderr  # the dry run's answer, not progress


def test_a_bad_size_is_a_usage_error(model_example):
    result = run("build-artifact", model_example.config, "--dry-run", "--max-memory", "8Q")
    assert result.exit_code == EXIT_USAGE and "is not a size" in result.stderr


def test_the_store_lives_in_work_dir_and_is_removed(model_example, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    result = build(model_example, tmp_path / "a.bwa", "--work-dir", work, "--quiet")
    assert result.exit_code == EXIT_OK, result.stderr
    assert list(work.iterdir()) == []
    missing = build(model_example, tmp_path / "b.bwa", "--work-dir", tmp_path / "none")
    assert missing.exit_code == EXIT_USAGE and "--work-dir" in missing.stderr


def test_jobs_give_the_same_artifact(model_example, tmp_path):
    one, two = tmp_path / "one.bwa", tmp_path / "two.bwa"
    for out, jobs in ((one, "1"), (two, "2")):
        result = build(model_example, out, "--created-at", 1_700_000_000, "--jobs", jobs, "-q")
        assert result.exit_code == EXIT_OK, result.stderr
    assert two.read_bytes() == one.read_bytes()


def test_zero_jobs_is_a_usage_error(model_example):
    result = run("build-artifact", model_example.config, "--dry-run", "--jobs", "0")
    assert result.exit_code == EXIT_USAGE and "--jobs" in result.stderr
    assert "-1 (every core)" in result.stderr
