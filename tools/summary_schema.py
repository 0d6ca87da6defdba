"""Write ``docs/summary.schema.json``, the JSON schema of ``build-artifact``'s ``summary.json``.

The schema is generated from the summary's records (``offline/release/records.py``); run this
after changing them (``tests/offline/release/test_summary_records.py`` checks the file is current).
"""

from __future__ import annotations

from pathlib import Path

from boxwatch.offline.release.records import summary_schema_text

TARGET = Path(__file__).resolve().parents[1] / "docs" / "summary.schema.json"


def main() -> int:
    TARGET.write_text(summary_schema_text(), encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
