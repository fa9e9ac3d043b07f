"""harness/ledger/atomic.py: the one durable write. Every file a resume or a later supervisor trusts goes
through it (a write cut short leaves the old bytes or the new); tried.txt's appends are fsynced."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.commands import ab
from harness.ledger import atomic, guard as ledgerguard
from harness.driver import step
from harness.lifecycle import stops, supervise
from harness.agents.gemini import GeminiResearcher
from harness.config import RunConfig
from harness.executors import scoring
from harness.executors.ray_executor import RayExecutor


def test_a_write_cut_short_leaves_the_old_bytes_and_no_temporary_file(tmp_path: Path, monkeypatch):
    path = tmp_path / "state.json"
    atomic.atomic_write(path, "old")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    atomic.atomic_write(path, b"new")
    assert path.read_text() == "new" and len(synced) == 2  # the file, then its folder

    def killed(*_):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError):
        atomic.atomic_write(path, "newer")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_an_append_is_fsynced_and_so_is_the_folder_that_gained_the_file(tmp_path: Path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    atomic.append_line(tmp_path / "tried.txt", "abc")
    assert len(synced) == 2
    atomic.append_line(tmp_path / "tried.txt", "def\n")
    assert len(synced) == 3 and (tmp_path / "tried.txt").read_text() == "abc\ndef\n"


@pytest.fixture
def written(monkeypatch) -> list[str]:
    """The names of the files written through atomic_write (and appended through append_line)."""
    names: list[str] = []
    real_write, real_append = atomic.atomic_write, atomic.append_line

    def write(path, data):
        names.append(Path(path).name)
        real_write(path, data)

    def append(path, line):
        names.append("append:" + Path(path).name)
        real_append(path, line)
    monkeypatch.setattr(atomic, "atomic_write", write)
    monkeypatch.setattr(ledgerguard, "atomic_write", write)  # ledgerguard's own name for it
    monkeypatch.setattr(atomic, "append_line", append)
    return names


def test_every_trusted_file_is_written_through_the_one_helper(tmp_path: Path, monkeypatch, written):
    cfg = RunConfig(repo=tmp_path, tag="t", run_root=tmp_path)
    step.write_journal(cfg, {"iteration": 1}, "inflight-0a.json")  # the in-flight journal
    step.record_tried(cfg, "d" * 64)  # tried.txt, read on resume
    supervise._write_json(tmp_path / "proc.json", {"pid": 1})  # a child's record
    scoring.calibrate_eval(tmp_path, "base", 3.0)  # evaluation.json
    RayExecutor._write_record(SimpleNamespace(tasks_dir=tmp_path / "ray-tasks"), {"token": "tok"})
    clock = stops.RunClock(tmp_path)
    clock.save()  # clock.json
    real = tmp_path / "user-home" / ".gemini"
    real.mkdir(parents=True)
    (real / "settings.json").write_text("{}")
    monkeypatch.setenv("GEMINI_CLI_HOME", str(tmp_path / "user-home"))
    GeminiResearcher.write_home(SimpleNamespace(home_for=lambda task: tmp_path / "gemini-home"), None)
    arm = SimpleNamespace(cfg=SimpleNamespace(repo=tmp_path, arm="a", seed=1, agent="mutate", model=None,
                                              branch="autoresearch/t-a", ledger_path=tmp_path / "a/results.tsv",
                                              gpu=None, hours=None, iterations=1),
                          researcher=None, spec=None, repeat=0)
    ab.write_setup(tmp_path, "t", "0" * 40, "interleave", [], {"a": arm})  # ab.json, read on resume
    ledgerguard.write_trusted(tmp_path / "run.json", b"{}")  # and the ledger guard's own files
    ledgerguard.append(tmp_path / "results.tsv", b"a\tb\n", b"")  # the ledger's state record
    assert {"inflight-0a.json", "append:tried.txt", "proc.json", scoring.EVAL_FILE, "tok.json", stops.CLOCK_NAME,
            "settings.json", "ab.json", "run.json", ledgerguard.RECORD,
            ledgerguard.state_path(tmp_path / "results.tsv").name} <= set(written), written
    assert json.loads((tmp_path / "gemini-home/.gemini/settings.json").read_text())["security"]["auth"]
    assert not list(tmp_path.rglob("*.tmp"))
