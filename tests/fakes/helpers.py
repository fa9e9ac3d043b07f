"""Helpers for the researcher tests: the CLI runner, stand-in executables, ledger rows."""
from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from harness import ledger
from harness.cli import main

BIN = Path(__file__).parent / "bin"
TEST_KEY = "sk-test-0123456789abcdef"


def install_stand_ins(dest: Path) -> Path:
    """Copy the stand-in `codex` and `claude` into dest, run by this interpreter; return dest."""
    dest.mkdir(parents=True, exist_ok=True)
    for script in BIN.iterdir():
        text = script.read_text().split("\n", 1)[1]
        target = dest / script.name
        target.write_text(f"#!{sys.executable}\n{text}")
        target.chmod(0o755)
    return dest


def harness(args: list[str], env: dict[str, str] | None = None):
    """Run the `harness` CLI in-process; exceptions propagate (catch_exceptions=False)."""
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


def rows(repo: Path, tag: str) -> list[dict]:
    """The run's ledger rows, without the extra training runs of the noise gate."""
    return [r for r in ledger.read_rows(repo / "runs" / tag / "results.tsv") if r["status"] != "repeat"]
