"""Resume trust (harness/trust.py): the best comes from the branch checked against the ledger."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness import driver, events, ledger, ledgerguard, trust
from harness.config import resolve
from harness.errors import RepoError

from conftest import ScriptedResearcher, git

BASE, KEPT, BAD, CAND = "a" * 40, "b" * 40, "c" * 40, "d" * 40


def rows(*pairs):
    return [{"commit": c[:12], "status": s} for c, s in pairs]


def test_keep_rows_matching_the_branch_are_trusted():
    ledger = rows((BASE, "keep"), (CAND, "discard"), (KEPT, "keep"), (KEPT, "repeat"))
    assert trust.problems(ledger, [BASE, KEPT]) == []
    # the candidate in flight on the tip, or judged but not yet reset, is set aside
    assert trust.problems(ledger, [BASE, KEPT, CAND]) == []
    assert trust.problems(rows((BASE, "keep")), [BASE, CAND]) == []


def test_a_forged_keep_row_or_a_moved_branch_is_a_mismatch():
    forged = rows((BASE, "keep"), (BAD, "invalid"), (BAD, "keep"))
    found = trust.problems(forged, [BASE])
    assert found == [f"the ledger has a keep row for {BAD[:12]}, which is not on the run branch"]
    moved = trust.problems(rows((BASE, "keep"), (KEPT, "keep")), [BASE, BAD, KEPT])
    assert moved == [f"commit {BAD[:12]} is on the run branch, but the ledger has no keep row for it"]
    # a branch moved to a commit whose only row says invalid, with a forged keep row for it:
    assert trust.problems(forged, [BASE, BAD]) == []  # consistent: both say BAD was kept ...
    assert trust.problems(rows((BASE, "keep"), (BAD, "invalid")), [BASE, BAD]) == []  # ... or neither
    assert trust.problems(rows((BASE, "keep"), ("", "keep")), [BASE]) != []  # a keep row without a commit


def forge_keep_row(ledger_path: Path, commit: str) -> None:
    """What a daemon with access to the run folder did: ledger, shadow and record rewritten together."""
    data = ledger_path.read_bytes()
    header = data.split(b"\n", 1)[0].decode().split("\t")
    row = {"commit": commit[:12], "val_bpb": "0.010000", "status": "keep", "description": "forged"}
    data += ("\t".join(row.get(col, "") for col in header) + "\n").encode()
    for path in (ledger_path, ledgerguard.shadow_path(ledger_path)):
        path.write_bytes(data)
    ledgerguard.state_path(ledger_path).write_text(json.dumps(
        {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}))


def test_resume_refuses_a_forged_keep_row_until_the_user_decides(repo: Path):
    cfg = resolve(repo, "t", {"baseline_runs": 1, "iterations": 1, "sandbox": "off"})
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 1.5}]))  # a discard: the branch stays at the baseline
    discarded = ledger.read_rows(cfg.ledger_path)[1]["commit"]
    forge_keep_row(cfg.ledger_path, discarded)
    state = json.loads(ledgerguard.state_path(cfg.ledger_path).read_text())
    assert set(state) >= {"size", "sha256"}  # the record format the forgery imitates
    branch_before = git(repo, "rev-parse", cfg.branch)
    resumed = resolve(repo, "t", {"baseline_runs": 1, "iterations": 2, "sandbox": "off"})
    with pytest.raises(RepoError, match="refusing to resume") as caught:
        driver.run(resumed, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.5}]))
    assert f"keep row for {discarded[:12]}, which is not on the run branch" in str(caught.value)
    assert "git branch -f" in str(caught.value) and "--from" in str(caught.value)
    assert git(repo, "rev-parse", cfg.branch) == branch_before  # the branch did not move
    assert any(e["kind"] == "trust_mismatch" for e in events.read(cfg.run_dir)[0])
