"""``boxwatch build-artifact`` shows each long phase by name on stderr (issue 39, point 6):
off a terminal as plain lines (no carriage-return bars), never on stdout."""

from __future__ import annotations

import yaml
from click.testing import CliRunner

from boxwatch.agent.keys import generate_keypair
from boxwatch.cli import cli
from boxwatch.commands.console import EXIT_OK
from boxwatch.commands.demo import write_build_config
from boxwatch.offline.progress import INTERVAL_ENV, LINE

PHASES = (
    "layer choice",
    "extracting activations",
    "fitting boxes (tau sweep)",
    "calibrating the score",
    "evaluating (curves, coverage)",
    "compiling the BN classifier",
    "verifying rules and queries",
    "running the agent's runtime on the held-out sets",
    "writing the report",
)


def test_a_build_off_a_terminal_names_every_phase_in_plain_lines(tmp_path):
    key, pub = tmp_path / "k.key", tmp_path / "k.pub"
    generate_keypair(key, pub)
    config = write_build_config(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["monitor"]["tau"] = [1.0, 0.2, 0.05]  # a faster sweep
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    res = CliRunner().invoke(
        cli,
        ["build-artifact", str(config), "--key", str(key), "--out", str(tmp_path / "a.bwa")]
        + ["--report", str(tmp_path / "report")],
        env={INTERVAL_ENV: "0"},  # every count and every phase's end, not one line per 10 s
        catch_exceptions=False,
    )
    assert res.exit_code == EXIT_OK, res.output
    lines = res.stderr.splitlines()
    for phase in PHASES:
        assert f"{phase}: done in " in res.stderr, (phase, lines[-20:])
    assert any(line.startswith("layer choice: ") and "ETA" in line for line in lines)
    assert "\r" not in res.stderr
    assert not any(LINE.match(line) for line in res.stdout.splitlines())
