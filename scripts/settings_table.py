"""Rewrite docs/configuration.md's settings table from the schema (harness/config/); --check: exit 1
if the table differs from what the schema produces (tests/test_config_schema.py checks the same)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import settings_table  # noqa: E402

DOC = ROOT / "docs" / "configuration.md"
BEGIN = "<!-- settings table: generated from harness/config/ by scripts/settings_table.py; do not edit -->\n"
END = "<!-- end of the settings table -->\n"


def with_table(text: str, table: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + table + END + tail


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = with_table(text, settings_table())
    if "--check" in argv:
        if new != text:
            print(f"{DOC} is out of date: python scripts/settings_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
