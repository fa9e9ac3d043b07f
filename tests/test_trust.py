"""Resume trust (harness/ledger/trust.py): the best comes from the branch checked against the ledger."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.driver import loop as driver
from harness.ledger import events, guard as ledgerguard, trust
from harness import ledger
from harness.config.load import resolve
from harness.errors import RepoError
from harness.executors import train_once
from harness.integrity import budget
from harness.gitgate import GitGate

from conftest import ScriptedResearcher, git, set_globals

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


# ---------------------------------------------------------------------------
# The run's trusted state (issue 22): the baseline held in memory, its files checked on every read


def test_a_trusted_file_is_checked_against_its_record(tmp_path: Path):
    path = tmp_path / "run.json"
    assert ledgerguard.read_trusted(path) is None  # never written
    ledgerguard.write_trusted(path, b'{"baseline_commit": "a"}\n')
    assert ledgerguard.read_trusted(path) == b'{"baseline_commit": "a"}\n'
    path.write_text('{"baseline_commit": "b"}\n')
    with pytest.raises(RepoError, match="was changed after the harness wrote it.*--tag NEW --from"):
        ledgerguard.read_trusted(path)
    path.unlink()
    with pytest.raises(RepoError, match="is missing"):
        ledgerguard.read_trusted(path)
    (tmp_path / ledgerguard.RECORD).unlink()
    path.write_text("{}")
    with pytest.raises(RepoError, match="has no record"):
        ledgerguard.read_trusted(path)
    assert [e["kind"] for e in events.read(tmp_path)[0]] == ["trusted_state_refused"] * 3


def test_a_kill_while_a_trusted_file_is_replaced_leaves_one_the_record_accepts(tmp_path: Path):
    path = tmp_path / "startup.json"
    ledgerguard.write_trusted(path, b"old")
    ledgerguard._save_record(tmp_path, path.name, [hashlib.sha256(b"old").hexdigest(),
                                                   hashlib.sha256(b"new").hexdigest()])  # killed here
    assert ledgerguard.read_trusted(path) == b"old"
    path.write_bytes(b"new")  # ... or here
    assert ledgerguard.read_trusted(path) == b"new"


def forged_commit(repo: Path) -> str:
    """A commit whose prepare.py is the attacker's, made from plumbing, named by no ref."""
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input="EVAL_BYTES = 1\n", text=True,
                          capture_output=True, check=True, timeout=30).stdout.strip()
    env = {**os.environ, "GIT_INDEX_FILE": str(repo.parent / "forged.index")}
    for args in (["read-tree", "HEAD"], ["update-index", "--cacheinfo", f"100644,{blob},prepare.py"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, timeout=30)
    tree = subprocess.run(["git", "write-tree"], cwd=repo, env=env, capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()
    return git(repo, "commit-tree", tree, "-p", "HEAD", "-m", "forged")


def test_the_evaluation_runs_only_from_the_runs_own_baseline(repo: Path, tmp_path: Path):
    """train_once with the Job's trusted fields: a forged baseline or changed protected files is an
    `invalid` result naming the check, before anything runs; the real baseline trains."""
    cfg = resolve(repo, "b", {"sandbox": "off"})
    base = git(repo, "rev-parse", "HEAD")
    with GitGate(repo).worktree(repo) as wt:
        hashes = trust.protected_sha256(wt.repo, base, cfg.protected)
    assert hashes == {"prepare.py": hashlib.sha256((repo / "prepare.py").read_bytes()).hexdigest()}
    forged = forged_commit(repo)
    cases = {"forged": (forged, hashes, "is not an ancestor of the job's commit"),
             "changed": (base, {"prepare.py": "0" * 64}, "are not those recorded at the run's start"),
             "honest": (base, hashes, None)}
    for name, (baseline, recorded, reason) in cases.items():
        trusted = {"baseline": baseline, "protected_sha256": recorded, "allowance_s": 30.0}
        result = train_once(cfg, repo, tmp_path / f"{name}.log", 1, trusted=trusted)
        if reason is None:
            assert result.status == "ok", result
        else:
            assert result.status == "invalid" and reason in result.reason, result
            assert "refused by the trusted baseline check" in result.reason
            assert not (tmp_path / f"{name}.log").exists()  # nothing ran


def test_a_job_is_judged_by_the_allowance_it_carries_not_by_startup_json(repo: Path, tmp_path: Path):
    cfg = resolve(repo, "b", {"sandbox": "off", "time_budget": 1})
    git(repo, "checkout", "-q", "-b", "slow")
    source = set_globals((repo / "train.py").read_text(), SLEEP_S=4.0)  # and says it trained 0.5 s
    (repo / "train.py").write_text(source.replace('{SLEEP_S:.1f}', '0.5'))
    git(repo, "commit", "-qam", "slow")
    base = git(repo, "rev-parse", "main")
    with GitGate(repo).worktree(repo) as wt:
        hashes = trust.protected_sha256(wt.repo, base, cfg.protected)
    cfg.run_dir.mkdir(parents=True)
    budget.calibrate(cfg.run_dir, base, wall_s=1e6, reported_train_s=0.0, time_budget_s=1)  # a huge allowance on disk
    result = train_once(cfg, repo, tmp_path / "slow.log", 1,
                        trusted={"baseline": base, "protected_sha256": hashes, "allowance_s": 0.5})
    assert result.status == "invalid" and "does not stop when HARNESS_TIME_BUDGET is spent" in result.reason
    assert "0.5s start-up allowance" in result.reason
    unjudged = train_once(cfg, repo, tmp_path / "base.log", 1,  # a baseline run (allowance None) is not judged
                          trusted={"baseline": base, "protected_sha256": hashes, "allowance_s": None})
    assert unjudged.status == "ok"


def test_the_supervisor_restores_a_trusted_file_or_its_record_changed_behind_its_back(tmp_path: Path):
    held = trust.Baseline("a" * 40, {}, budget.DEFAULT_ALLOWANCE_S)
    for name in ("run.json", "startup.json"):
        ledgerguard.write_trusted(tmp_path / name, f"{name} as written\n".encode())
        held.hold(tmp_path / name)
    assert held.restore_changed() == [] and held.refused(tmp_path / "job.log") is None
    (tmp_path / "run.json").write_text('{"baseline_commit": "forged"}')
    refused = held.refused(tmp_path / "job.log")
    assert refused.status == "invalid" and "(run.json) was changed" in refused.reason
    assert "refused by the trusted run state check" in (tmp_path / "job.log").read_text()
    (tmp_path / ledgerguard.RECORD).write_text("not json")  # the record alone: every file it held restored
    assert held.restore_changed() == ["run.json", "startup.json"]
    for name in ("run.json", "startup.json"):
        assert ledgerguard.read_trusted(tmp_path / name) == f"{name} as written\n".encode()
    kinds = [e["kind"] for e in events.read(tmp_path)[0]]
    assert kinds.count("trusted_state_restored") == 3
