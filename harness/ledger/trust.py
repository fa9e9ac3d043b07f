"""What the supervisor trusts: the run's baseline, and on --resume the best from the branch.

The baseline (its commit, the sha256 of its protected files, the start-up allowance measured on
it) is decided once by the supervisor and held in memory (`Baseline`, on the run's Context);
every training job gets it in its Job, so no executor reads it from a file a job or a researcher
could reach. Before an evaluation runs, `baseline_problem` checks that the commit is the run's
(an ancestor of the job's commit) and that its protected files are those recorded at the start.

On --resume, the best comes from the run branch checked against the ledger, never a row alone.

The run branch only ever advances to a commit the harness kept, so its first-parent history
from the baseline is the list of kept commits. The ledger's `keep` rows must name exactly
those commits, in that order. A `keep` row for a commit that is not on the branch (a forged
row: a job or a daemon that wrote the ledger, its shadow and its record together), or a
commit on the branch without a `keep` row (the branch moved behind the harness's back), is a
mismatch: the run stops until the user decides which one is right.

Set aside: commits at the tip of the branch after the last one with a keep row (the candidate
an interruption left in flight, committed before its journal named it, or one judged and not
yet reset): reconcile resets the branch to the best, so they are never trusted either.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import events, guard as ledgerguard
from .. import gitgate
from ..errors import RepoError
from ..gitgate import Repo
from ..workload.runner import TrainResult


@dataclass
class Baseline:
    """The run's trusted baseline, held by the supervisor; jobs get it in their Job."""
    commit: str
    protected_sha256: dict[str, str]  # every file under the protected paths at commit
    default_allowance_s: float  # s, for a job judged before a baseline run measured one (integrity/budget.py)
    allowance_s: float | None = None  # s, the start-up allowance once a baseline run measured it
    baseline_cpu_s: float | None = None  # CPU s per wall s of the baseline's runs (integrity/budget.py), once measured
    baseline_gpu_s: float | None = None  # GPU s of the baseline's runs (NVML; budget.py), once measured
    files: dict[Path, bytes] = field(default_factory=dict, repr=False)  # run.json, startup.json as written
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # lanes check at once: one restores

    def hold(self, path: Path) -> None:
        """Remember a trusted file's bytes (checked against its record): what it must still hold."""
        data = ledgerguard.read_trusted(path)
        if data is not None:
            with self.lock:
                self.files[Path(path)] = data

    def restore_changed(self) -> list[str]:
        """The trusted files changed or deleted behind the supervisor's back, each restored from
        its memory (an event each): a researcher's edit of them never lasts."""
        changed = []
        with self.lock:  # two lanes building jobs at once: the first restores, the second finds it so
            for path, data in self.files.items():
                try:
                    same = path.read_bytes() == data and ledgerguard.recorded(path, data)
                except OSError:
                    same = False
                if not same:  # the file, or the record of it
                    ledgerguard.write_trusted(path, data)
                    events.record(path.parent, "trusted_state_restored", f"{path.name} was changed or deleted "
                                  f"behind the harness's back; restored from the supervisor's memory")
                    changed.append(path.name)
        return changed

    def refused(self, log_path: Path) -> TrainResult | None:
        """The `invalid` result of a job about to be built after a trusted file was changed (now
        restored), its reason also in its log; None when nothing changed."""
        changed = self.restore_changed()
        if not changed:
            return None
        reason = (f"the run's trusted state ({', '.join(changed)}) was changed behind the harness's back before "
                  f"this job; refused by the trusted run state check, and restored from the supervisor's memory")
        log_path.write_text(reason + "\n")
        return TrainResult("invalid", reason=reason)

    def job_fields(self, commit: str) -> dict[str, Any]:
        """What a job of commit is handed: the baseline's own runs are not judged (allowance None)."""
        own = _same(commit, self.commit)
        allowance = None if own else (self.allowance_s if self.allowance_s is not None else self.default_allowance_s)
        return {"baseline": self.commit, "protected_sha256": dict(self.protected_sha256), "allowance_s": allowance,
                "baseline_cpu_s": None if own else self.baseline_cpu_s,
                "baseline_gpu_s": None if own else self.baseline_gpu_s}


def protected_sha256(repo: Repo, commit: str, protected: tuple[str, ...]) -> dict[str, str]:
    """sha256 of every file under the protected paths as committed at commit (git's objects)."""
    return gitgate.blob_sha256(repo, commit, protected)


def baseline_problem(repo: Repo, baseline: str, head: str, recorded: dict[str, str],
                     protected: tuple[str, ...], what: str = "") -> str | None:
    """Why baseline cannot be the evaluation's (None: it can): it must be an ancestor of head (the
    job's commit, or what names it), and its protected files must hash to those recorded at the
    run's start."""
    what = what or f"the job's commit {head[:12]}"
    try:
        if not repo.is_ancestor(baseline, head):
            return f"the baseline commit {baseline[:12]} is not an ancestor of {what}"
        have = protected_sha256(repo, baseline, protected)
    except (gitgate.GitCommandError, ValueError) as e:
        return f"the baseline commit {baseline[:12]} cannot be read ({str(e).strip()[:200]})"
    changed = sorted(p for p in {*have, *recorded} if have.get(p) != recorded.get(p))
    if changed:
        return (f"the protected files of the baseline commit {baseline[:12]} are not those recorded at the "
                f"run's start ({', '.join(changed[:5])})")
    return None


def _same(a: str, b: str) -> bool:
    """The ledger keeps short hashes; git gives full ones."""
    return bool(a) and bool(b) and (a.startswith(b) or b.startswith(a))


def problems(rows: list[dict[str, Any]], history: list[str]) -> list[str]:
    """What disagrees between the ledger's keep rows and the branch's kept commits (pure).

    history: the run branch's first-parent commits, the baseline first, the tip last."""
    keeps = [str(r.get("commit") or "") for r in rows if r.get("status") == "keep"]
    kept = list(history)
    while len(kept) > 1 and not any(_same(kept[-1], k) for k in keeps):
        kept.pop()  # after the best: in flight or judged, reset to the best by reconcile
    found = [f"the ledger has a keep row for {c[:12] or 'no commit'}, which is not on the run branch"
             for c in keeps if not any(_same(c, h) for h in kept)]
    found += [f"commit {h[:12]} is on the run branch, but the ledger has no keep row for it" for h in kept
              if not any(_same(h, k) for k in keeps)]
    if not found and keeps and kept and not _same(keeps[-1], kept[-1]):
        found.append(f"the ledger's best ({keeps[-1][:12]}) is not the tip of the run branch ({kept[-1][:12]})")
    return found


def verify(run_dir: Path, branch: str, rows: list[dict[str, Any]], history: list[str]) -> None:
    """Raise RepoError (and record an event) when the ledger and the run branch disagree."""
    found = problems(rows, history)
    if not found:
        return
    message = "; ".join(found[:5]) + (f" (and {len(found) - 5} more)" if len(found) > 5 else "")
    events.record(run_dir, "trust_mismatch", message)
    raise RepoError(
        f"refusing to resume: the ledger and the run branch {branch} disagree: {message}. A keep row is only "
        f"believed when its commit is on the branch. Look at `git log --first-parent {branch}` and "
        f"{Path(run_dir) / 'results.tsv'}, then decide: if the branch is right, start a new run from it "
        f"(harness run --tag NEW --from {branch}); if the ledger is right, move the branch to its best "
        f"commit (git branch -f {branch} COMMIT) and resume again.")
