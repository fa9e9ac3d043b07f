"""The ledger under faults: a full disk, a torn last line, a copy edited behind the harness's back."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from harness import ledger
from harness.ledger import guard as ledgerguard
from harness.driver import loop as driver
from harness.config.load import resolve
from harness.errors import LedgerError
from harness.ledger import Row

from conftest import ScriptedResearcher

from .conftest import assert_recovered


def test_a_full_disk_stops_the_run_with_a_clear_message_and_loses_nothing(repo: Path, monkeypatch):
    cfg = resolve(repo, "full", {"baseline_runs": 1, "iterations": 4})
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}]), steps=1)
    before = cfg.ledger_path.read_bytes()
    real_write = os.write

    def full_disk(fd, data):  # the ledger's file system is full: every write there fails
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(cfg.run_dir)) and "results" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(LedgerError, match="No space left on device.*Nothing recorded before was lost.*--resume"):
        driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.8}]))
    assert cfg.ledger_path.read_bytes() == before  # no half row, nothing lost
    assert ledgerguard.shadow_path(cfg.ledger_path).read_bytes() == before
    monkeypatch.setattr(os, "write", real_write)  # space freed
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.7}, {"VALUE": 0.6}]))
    rows = assert_recovered(repo, "full", 4)
    # committed, never recorded: trained again on resume and recorded once
    assert rows[2]["status"] == "keep" and rows[2]["metric"] == pytest.approx(0.8)
    assert "interrupted" not in rows[2]["description"]
    assert [r["status"] for r in rows[3:]] == ["keep", "keep"]


def _row(i: int) -> Row:
    return Row(commit=f"c{i:011d}", metric=1.0 - i / 10, status="keep", description=f"row {i}", iteration=i)


def test_a_torn_last_line_is_repaired_on_the_next_append_without_a_shadow(tmp_path: Path):
    path = tmp_path / "results.tsv"
    for i in range(2):
        ledger.append(path, "val_bpb", _row(i))
    for p in (ledgerguard.shadow_path(path), ledgerguard.state_path(path)):
        p.unlink()  # a ledger from before the shadow existed
    with open(path, "a") as f:
        f.write("c00000000002\t0.8")  # a crash mid-write
    ledger.append(path, "val_bpb", _row(3))
    text = path.read_text()
    assert text.endswith("\n") and "c00000000002" not in text
    assert [r["iteration"] for r in ledger.read_rows(path)] == [0, 1, 3]
    assert "c00000000002" in (tmp_path / "results.tsv.torn").read_text()


def test_an_edit_of_both_copies_is_refused_rather_than_guessed(tmp_path: Path):
    path = tmp_path / "results.tsv"
    ledger.append(path, "val_bpb", _row(0))
    for p in (path, ledgerguard.shadow_path(path)):
        p.write_text(p.read_text().replace("keep", "discard"))
    with pytest.raises(LedgerError, match="no longer matches its record"):
        ledger.append(path, "val_bpb", _row(1))
