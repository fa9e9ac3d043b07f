"""What the researcher may not do to git, and protected files around every training run.

The researcher edits files; the harness owns git. `snapshot` (before the researcher runs)
and `git_problem` (after) catch what `git status` alone cannot show: a moved HEAD or run
branch (reset, commit --amend, checkout), other refs created or moved, `.git/` files changed
(info/exclude, hooks, config), index flags that hide changes (assume-unchanged,
skip-worktree), files hidden by an ignore rule, nested repositories (submodules), renames.
`restore` puts git back as it was; the caller then resets the worktree.

Protected files are compared by sha256 with the committed version before every training run
(and restored if touched), and again after it: a job that rewrote one is `invalid`.
"""
from __future__ import annotations

import functools
import hashlib
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..ledger import events, trust
from ..gitgate import Worktree, run_git
from ..workload.runner import TrainResult

OTHER_RUNS = "refs/heads/autoresearch/"  # other runs' and A/B arms' branches move on their own
TRIED_REFS = "refs/autoresearch/"  # the harness's refs of evaluated candidates (other lanes add theirs)
WATCHED_FILES = ("config", "config.worktree", "info/exclude", "info/attributes", "info/sparse-checkout",
                 "info/grafts", "shallow", "commondir")


def _git(cwd: Path, *args: str, check: bool = True) -> str:
    out = run_git(args, cwd, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def _is_cache(path: str) -> bool:
    return "__pycache__/" in path or path.endswith(".pyc") or path == "__pycache__"


@dataclass
class Snapshot:
    common_dir: Path  # the main repository's .git
    own_dir: Path  # the worktree's private git dir (.git/worktrees/<name>)
    refs: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes | None] = field(default_factory=dict)  # .git files by path, None = absent
    head: str = ""  # the worktree's HEAD file: the run branch, or a sha for a lane's detached worktree
    flagged: frozenset[str] = frozenset()  # index flags before: the harness's sparse checkout (Worktree.leave_out)

    def attached(self, branch: str) -> bool:
        return self.head == f"ref: refs/heads/{branch}"


def _head(own: Path) -> str:
    head_file = own / "HEAD"
    return head_file.read_text().strip() if head_file.exists() else ""


def _git_dirs(wt: Worktree) -> tuple[Path, Path]:
    own = Path(wt.repo.git_dir)
    common = Path(wt.repo.common_dir) if getattr(wt.repo, "common_dir", None) else own
    return common.resolve(), own.resolve()


def _refs(cwd: Path, branch: str) -> dict[str, str]:
    out = _git(cwd, "for-each-ref", "--format=%(objectname) %(refname)")
    refs = {}
    for line in out.splitlines():
        sha, _, name = line.partition(" ")
        if (name.startswith(OTHER_RUNS) and name != f"refs/heads/{branch}") or name.startswith(TRIED_REFS):
            continue
        refs[name] = sha
    return refs


def _files(common: Path, own: Path) -> dict[str, bytes | None]:
    files: dict[str, bytes | None] = {}
    for base in (common, own):
        for name in WATCHED_FILES:
            p = base / name
            files[str(p)] = p.read_bytes() if p.is_file() else None
        hooks = base / "hooks"
        if hooks.is_dir():
            for p in sorted(hooks.iterdir()):
                files[str(p)] = p.read_bytes() if p.is_file() else b""
    return files


def _flagged(cwd: Path) -> list[str]:
    """Paths with an index flag that hides changes (assume-unchanged: lower case; skip-worktree: S)."""
    return [line[2:] for line in _git(cwd, "ls-files", "-v").splitlines()
            if line[:1].islower() or line[:1] == "S"]


def snapshot(wt: Worktree, branch: str) -> Snapshot:
    common, own = _git_dirs(wt)
    return Snapshot(common, own, _refs(wt.path, branch), _files(common, own), _head(own),
                    frozenset(_flagged(wt.path)))


def git_problem(wt: Worktree, branch: str, parent: str, editable: tuple[str, ...], snap: Snapshot) -> str | None:
    """Why the researcher's session broke a git rule, or None (detection only; see restore)."""
    if _head(snap.own_dir) != snap.head:
        return ("the researcher switched HEAD away (git checkout/switch, or a commit or reset on a detached HEAD); "
                "only edit the files, the harness does all git work")
    refs = _refs(wt.path, branch)
    # A lane's detached worktree leaves the run branch to the scheduler, which moves it.
    if snap.attached(branch) and refs.get(f"refs/heads/{branch}") != parent:
        return ("the researcher moved the run branch (git commit, commit --amend, reset, rebase or "
                "merge); only edit the files, the harness commits and resets")
    moved = sorted(n for n in set(refs) | set(snap.refs)
                   if n != f"refs/heads/{branch}" and refs.get(n) != snap.refs.get(n))
    if moved:
        return "the researcher changed git refs: " + ", ".join(moved[:5]) + "; only edit the files"
    files = _files(snap.common_dir, snap.own_dir)
    changed = sorted(p for p in set(files) | set(snap.files) if files.get(p) != snap.files.get(p))
    if changed:
        names = [str(Path(p).relative_to(snap.common_dir.parent)) if snap.common_dir.parent in Path(p).parents
                 else p for p in changed]
        return "the researcher changed git's own files: " + ", ".join(names[:5]) + "; leave .git alone"
    flagged = [p for p in _flagged(wt.path) if p not in snap.flagged]
    if flagged:
        return ("the researcher hid changes from git (assume-unchanged/skip-worktree): "
                + ", ".join(flagged[:5]))
    status = _git(wt.path, "status", "--porcelain", "--untracked-files=all", "--ignored")
    hidden = [line[3:].strip('"') for line in status.splitlines() if line.startswith("!! ")]
    hidden = [p for p in hidden if not _is_cache(p)]
    if hidden:
        return ("new file(s) hidden from git by an ignore rule: " + ", ".join(hidden[:5])
                + "; only the editable files may change, and no file may be hidden")
    untracked = [line[3:].strip('"') for line in status.splitlines() if line.startswith("?? ")]
    nested = [p for p in untracked if (wt.path / p / ".git").exists() or p.endswith("/.git")
              or p == ".gitmodules"]
    if nested:
        return "a nested git repository or submodule was added: " + ", ".join(nested[:5])
    renames = [line[3:] for line in status.splitlines() if line[:2].strip().startswith("R")]
    if renames:
        return "renamed files (" + ", ".join(renames[:5]) + "); edit the editable files in place"
    missing = [p for p in editable if not (wt.path / p).exists() and not (wt.path / p).is_symlink()]
    new = [p for p in untracked if not _is_cache(p)]
    if missing and new:
        return (f"{', '.join(missing)} was deleted or renamed (new: {', '.join(new[:5])}); "
                f"edit the editable files in place")
    return None


def restore(wt: Worktree, branch: str, parent: str, snap: Snapshot) -> list[str]:
    """Put git back as the snapshot had it (refs, HEAD, .git files, index flags); return what changed."""
    fixed = []
    lock = snap.own_dir / "index.lock"
    if lock.exists():  # a git command of the researcher's, killed half-way
        lock.unlink()
        fixed.append("removed a stale index.lock")
    files = _files(snap.common_dir, snap.own_dir)
    for p in set(files) | set(snap.files):
        if files.get(p) != snap.files.get(p):
            before = snap.files.get(p)
            if before is None:
                Path(p).unlink(missing_ok=True)
            else:
                Path(p).write_bytes(before)
            fixed.append(f"restored {p}")
    if not snap.attached(branch):
        if _head(snap.own_dir) != snap.head:
            _git(wt.path, "update-ref", "--no-deref", "HEAD", parent)
            fixed.append(f"put the detached HEAD back at {parent[:12]}")
    elif _head(snap.own_dir) != snap.head:
        _git(wt.path, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
        fixed.append("re-attached HEAD to the run branch")
    refs = _refs(wt.path, branch)
    if snap.attached(branch) and refs.get(f"refs/heads/{branch}") != parent:
        _git(wt.path, "update-ref", f"refs/heads/{branch}", parent)
        fixed.append(f"moved {branch} back to {parent[:12]}")
    for name in set(refs) | set(snap.refs):
        if name == f"refs/heads/{branch}" or refs.get(name) == snap.refs.get(name):
            continue
        if name in snap.refs:
            _git(wt.path, "update-ref", name, snap.refs[name])
        else:
            _git(wt.path, "update-ref", "-d", name)
        fixed.append(f"restored {name}")
    flagged = [p for p in _flagged(wt.path) if p not in snap.flagged]
    if flagged:
        _git(wt.path, "update-index", "--no-assume-unchanged", "--no-skip-worktree", "--", *flagged)
        fixed.append("cleared index flags")
    return fixed


# ---------------------------------------------------------------------------
# Protected files around a training run


def _committed(worktree: Path | str, path: str, rev: str = "HEAD") -> bytes | None:
    """path's bytes as committed at rev, None where it has none."""
    out = run_git(["cat-file", "blob", f"{rev}:{path}"], worktree, check=False, text=False)
    return out.stdout if out.returncode == 0 else None


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def committed_protected(worktree: Path, protected: tuple[str, ...]) -> dict[str, bytes | None]:
    """Each protected file's bytes as committed at the worktree's HEAD (None: no such file)."""
    return {path: _committed(Path(worktree), path) for path in protected}


def protected_changes(worktree: Path, committed: dict[str, bytes | None]) -> list[str]:
    """Protected files whose sha256 differs from their committed bytes (committed_protected),
    restored. Kept commits can never change a protected file (the scope check refuses it), so the
    committed version at HEAD is the baseline commit's."""
    changed = []
    for path, want in committed.items():
        target = Path(worktree) / path
        try:
            have = None if target.is_symlink() else target.read_bytes()
        except OSError:
            have = None
        if _sha(have) == _sha(want):
            continue
        changed.append(path)
        if want is not None:
            if target.is_symlink() or target.is_dir():
                target.unlink() if target.is_symlink() else shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(want)
    return changed


def before_training(run_dir: Path, worktree: Path, protected: tuple[str, ...],
                    result_file: Path) -> dict[str, bytes | None]:
    """Protected files as committed, no stale result file, no bytecode the job did not compile.
    Returns the committed bytes, for after_training: read from git once, before the job starts."""
    committed = committed_protected(worktree, protected)
    restored = protected_changes(worktree, committed)
    if restored:
        events.record(run_dir, "protected_restored", f"protected file(s) {', '.join(restored)} differed from "
                      f"the committed version before training; restored")
    Path(result_file).unlink(missing_ok=True)
    Path(f"{result_file}.tmp").unlink(missing_ok=True)
    for cache in Path(worktree).rglob("__pycache__"):  # a planted .pyc would replace prepare.py's code
        if ".git" not in cache.parts:
            shutil.rmtree(cache, ignore_errors=True)
    return committed


def after_training(run_dir: Path, worktree: Path, result: TrainResult,
                   committed: dict[str, bytes | None]) -> TrainResult:
    """A job that rewrote a protected file is invalid, whatever it reported; the file is restored.
    committed: what before_training read (the bytes as committed before the job ran, so nothing
    the job did to the checkout's git state moves them)."""
    changed = protected_changes(worktree, committed)
    if not changed:
        return result
    events.record(run_dir, "protected_restored", f"the training job changed {', '.join(changed)}; restored")
    return replace(result, status="invalid",
                   reason=f"the training job changed protected file(s) {', '.join(changed)}")


def clear_stale_lock(wt: Worktree) -> bool:
    """A researcher's git command killed half-way leaves index.lock; nothing else runs git here now."""
    lock = Path(wt.repo.git_dir) / "index.lock"
    if lock.exists():
        lock.unlink(missing_ok=True)
        return True
    return False


SHA1 = re.compile(r"[0-9a-f]{40}")


@functools.lru_cache(maxsize=64)
def _committed_at_sha(git_dir: str, commit: str, path: str) -> bytes | None:
    """_committed at a full sha, whose files never change: each (commit, path) read from git once
    per process (the policy reads its parent's file for every candidate)."""
    return _committed(git_dir, path, commit)


def policy_problem(wt: Worktree, parent: str, editable: tuple[str, ...], metric: str,
                   protected: tuple[str, ...], sealed: bool) -> str | None:
    """The static policy (policy.py) over what the proposal adds to each editable .py file."""
    from . import policy
    modules = [Path(p).stem for p in protected if p.endswith(".py")] or ["prepare"]
    found: list[str] = []
    for path in editable:
        target = wt.path / path
        if not path.endswith(".py") or not target.is_file():
            continue
        # a ref moves: read now; b"" for a file new in this proposal
        data = (_committed_at_sha(str(wt.repo.common_dir), parent, path) if SHA1.fullmatch(parent)
                else _committed(wt.path, path, parent))
        old = (data or b"").decode(errors="replace")
        new = target.read_text(errors="replace")
        for module in modules:
            found += [f for f in policy.problems(path, old, new, metric, module, sealed) if f not in found]
    return policy.explain(found) if found else None


def baseline_commit(protected: tuple[str, ...], worktree: Path, baseline: str,
                    protected_sha256: dict[str, str]) -> str | TrainResult:
    """The commit whose protected files evaluate a job: the run's baseline as the supervisor holds
    it (never a file the job or the researcher could write), checked (ledger/trust.py) to be an
    ancestor of the job's commit with the protected files recorded at the start; a mismatch is an
    `invalid` result. A throwaway run (`harness check`, baseline "") is its own baseline."""
    with Worktree(worktree) as wt:
        head = wt.head()
        if not baseline:
            return head
        problem = trust.baseline_problem(wt.repo, baseline, head, protected_sha256, protected)
    if problem:
        return TrainResult("invalid", reason=f"{problem}: refused by the trusted baseline check, the evaluator "
                                             f"runs only from the run's own baseline")
    return baseline
