"""``boxwatch inspect``'s text view (agent/describe.py): the build's verdict split is a table
(issue 39, point 7c), and an unsigned manifest's odd shapes stay readable and escaped."""

from __future__ import annotations

from boxwatch.agent.describe import render_description

SPLIT = {
    "correct_known": {"accept": 0.9527, "n": 275, "reject": 0.0473, "uncertainty": 0.0},
    "unknown:unknown_noise": {"accept": 0.0, "n": 100, "reject": 1.0, "uncertainty": 0.0},
}


def _info(split: object) -> dict:
    return {"artifact_id": "a", "contents": {"verdict_split": split}, "members": {}}


def test_the_verdict_split_is_one_row_per_set_with_aligned_columns():
    lines = render_description(_info(SPLIT)).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("verdict_split"))
    header, known, noise = lines[head + 1 : head + 4]
    assert header.split() == ["set", "n", "accept", "uncertainty", "reject"]
    assert known.split() == ["correct_known", "275", "0.953", "0.000", "0.047"]
    assert noise.split() == ["unknown:unknown_noise", "100", "0.000", "0.000", "1.000"]
    for column, value in (("n", "275"), ("accept", "0.953"), ("reject", "0.047")):
        end = header.index(f" {column}") + 1 + len(column)  # values end under their column
        assert known[:end].endswith(value), (column, known)
    assert "correct_known=" not in "\n".join(lines)


def test_an_odd_split_from_an_unsigned_manifest_is_shown_escaped():
    text = render_description(_info({"bad\x1b[2Jset": "x", "ok": {"n": "many"}}))
    assert "\x1b" not in text and "bad\\x1b[2Jset" in text
    assert "many" in text
