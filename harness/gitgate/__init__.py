"""All git work goes through this package, the only code of the harness that runs git: GitGate
and Worktree, a handful of verbs on a Repo with explicit results, here; the one raw call,
`run_git`, with the deadline and the settings every git of the harness runs under, in `plain.py`.

The harness owns the run's worktree and branch; the user's checkout is never modified.
Only commits the harness made are ever reset.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import git
from git import GitCommandError  # noqa: F401 - the error of a failed git command, for the modules that ask gitgate

from ..errors import RepoError
from .plain import GitFailed, GitTimeout, harness_env, kill_git, run_git, settings, timeout_s  # noqa: F401 - re-exported

HARNESS_NAME = "autoresearch-harness"
HARNESS_EMAIL = "harness@localhost"
EXCLUDES = ("/runs/", "/results.tsv")  # written into .git/info/exclude, never into .gitignore
PACK_REFS_EVERY = 50  # iterations between packing the tried refs and writing the commit-graph (Worktree.maintain)


@dataclass(frozen=True)
class Change:
    status: str  # porcelain XY code, "??" = untracked
    path: str


def data_files(protected: tuple[str, ...]) -> tuple[str, ...]:
    """The protected entries that are data, not code: the validation bytes the researcher never sees."""
    return tuple(p for p in protected if not p.endswith(".py"))


def sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def content_hash(root: Path, paths: tuple[str, ...]) -> str:
    """One hash over the named files' contents: identical code hashes identically."""
    h = hashlib.sha256()
    for rel in sorted(paths):
        h.update(rel.encode() + b"\0" + (sha256_file(root / rel) or "missing").encode() + b"\0")
    return h.hexdigest()


# Settings of the user's that must not run on the harness's own commits (plain.settings: commit.gpgsign,
# tag.gpgsign off, core.hooksPath an empty folder of the harness's), put over the user's config through
# the environment of every Repo's git; the rest of the user's config holds. Every command has a deadline.


class _TimedGit(git.Git):
    """GitPython's command wrapper with the harness's own deadline on every command: git runs in
    a process group of its own, and a hung one is killed with its group and raises GitTimeout,
    not a GitCommandError. Not GitPython's kill_after_timeout: that is a non-daemon timer thread
    its call cancels only when git returns, so an interrupt (Ctrl-C) raised inside the call left
    git running and the timer holding Python's exit for the whole deadline. Here an interrupt
    kills git before it propagates, and nothing is left behind."""

    def execute(self, command, **kw):  # type: ignore[override]
        if kw.get("as_process") or kw.get("output_stream") is not None:
            return super().execute(command, **kw)  # a stream the caller reads (none of the harness's verbs)
        limit = kw.pop("kill_after_timeout", None) or timeout_s()
        extended = kw.pop("with_extended_output", False)
        check = kw.pop("with_exceptions", True)
        as_string = kw.pop("stdout_as_string", True)
        strip = kw.pop("strip_newline_in_stdout", True)
        handle = super().execute(command, as_process=True, start_new_session=True, **kw)
        proc = handle.proc  # the handle kept: dropped, it would terminate git at once
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_git(proc)
            raise GitTimeout(command, limit, self._working_dir) from None
        except BaseException:  # a Ctrl-C while git runs: git does not outlive the call
            kill_git(proc)
            raise
        newline = "\n" if isinstance(out, str) else b"\n"
        out, err = out if out is not None else newline[:0], err if err is not None else newline[:0]
        if strip and out.endswith(newline):
            out = out[:-1]
        if err.endswith(newline):
            err = err[:-1]
        if check and proc.returncode != 0:
            raise git.GitCommandError(command, proc.returncode, err, out)
        if as_string and isinstance(out, bytes):
            out = out.decode(errors="replace")
        del handle  # git has exited: the handle's finalizer only reaps
        if extended:
            return proc.returncode, out, err.decode(errors="replace") if isinstance(err, bytes) else err
        return out


class _Repo(git.Repo):
    GitCommandWrapperType = _TimedGit


Repo = git.Repo  # the type open_repo returns, for the modules' annotations


def open_repo(path: Path, **kw) -> git.Repo:
    """A GitPython Repo whose git commands run with the harness's settings over the user's
    (plain.harness_env) and under a deadline (_TimedGit). The harness reads objects through git
    commands (ls-tree, cat-file), never GitPython's persistent cat-file processes, which have none."""
    repo = _Repo(path, **kw)
    repo.git.update_environment(**harness_env())
    return repo


def tree_blobs(repo: git.Repo, commit: str, paths: tuple[str, ...]) -> list[tuple[str, str]]:
    """(path, blob sha) of every file under paths (files or folders) as committed at commit; a
    symlink's entry is its blob, a submodule none. Raises GitCommandError for a commit git lacks."""
    if not paths:
        return []
    out = repo.git.ls_tree("-r", "-z", "--full-tree", commit, "--", *paths)
    blobs = []
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, _, name = entry.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == "blob":
            blobs.append((name, parts[2]))
    return blobs


def blob_bytes(repo: git.Repo, sha: str) -> bytes:
    return repo.git.cat_file("blob", sha, stdout_as_string=False, strip_newline_in_stdout=False)


def blob_sha256(repo: git.Repo, commit: str, paths: tuple[str, ...]) -> dict[str, str]:
    """sha256 of every file under paths as committed at commit (git's objects, not a worktree)."""
    return {name: hashlib.sha256(blob_bytes(repo, sha)).hexdigest() for name, sha in tree_blobs(repo, commit, paths)}


class GitGate:
    def __init__(self, repo: Path):
        try:
            self.repo = open_repo(repo, search_parent_directories=False)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise RepoError(f"{repo} is not a git repository. Run `git init && git add -A && "
                            f"git commit -m init` there first, or pass --repo DIR.") from None
        if self.repo.bare:
            raise RepoError(f"{repo} is a bare repository; point --repo at a checkout.")
        self.root = Path(self.repo.working_tree_dir).resolve()

    # --- checks on the user's checkout -------------------------------------------------

    def require_commit(self, rev: str) -> str:
        try:
            return self.repo.git.rev_parse("--verify", f"{rev}^{{commit}}")
        except git.GitCommandError:
            raise RepoError(f"'{rev}' is not a commit in {self.root}. Commit your files first "
                            f"(git add -A && git commit) or pass --from REV.") from None

    def dirty_files(self, paths: tuple[str, ...]) -> list[str]:
        """Which of paths have uncommitted changes (staged, unstaged or untracked)?"""
        out = self.repo.git.status("--porcelain", "--untracked-files=all", "--", *paths)
        return [line[3:] for line in out.splitlines() if line.strip()]

    def tracked_at(self, rev: str, path: str) -> bool:
        try:
            self.repo.git.cat_file("-e", f"{rev}:{path}")
            return True
        except git.GitCommandError:
            return False

    def show(self, rev: str, path: str) -> str:
        """The text of path as committed at rev."""
        return self.repo.git.show(f"{rev}:{path}")

    def status(self, path: Path) -> list[str]:
        """`git status --porcelain` of the checkout at path (a throwaway worktree's), one line per entry."""
        return run_git(["status", "--porcelain"], cwd=path).stdout.splitlines()

    def branch_exists(self, branch: str) -> bool:
        return any(h.name == branch for h in self.repo.heads)

    def ensure_excluded(self) -> None:
        """Keep the harness's run folders out of `git status` without touching .gitignore."""
        exclude = Path(self.repo.git_dir) / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        text = exclude.read_text() if exclude.exists() else ""
        missing = [e for e in EXCLUDES if e not in text.split("\n")]
        if missing:
            exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n")
                               + "\n".join(missing) + "\n")

    # --- the run's worktree -------------------------------------------------------------

    def create_worktree(self, path: Path, branch: str, from_rev: str, leave_out: tuple[str, ...] = ()) -> str:
        """The run's worktree on a new branch at from_rev, without the leave_out paths (Worktree.leave_out)."""
        base = self.require_commit(from_rev)
        self.prune()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.repo.git.worktree("add", "-b", branch, str(path), base)
        Worktree.leave_out_of(path, leave_out)
        return base

    def attach_worktree(self, path: Path, branch: str, leave_out: tuple[str, ...] = ()) -> None:
        """For --resume: make sure the worktree exists, is on the run branch and leaves out leave_out."""
        self.prune()
        if not (path / ".git").exists():
            self.repo.git.worktree("add", "--force", str(path), branch)
        Worktree.leave_out_of(path, leave_out)

    def add_detached(self, path: Path, rev: str) -> None:
        """A plain detached worktree at rev (a throwaway one: `harness check`'s)."""
        self.repo.git.worktree("add", "--detach", str(path), rev)

    def reset_clean(self, path: Path, rev: str) -> None:
        """The checkout at path back to rev: tracked files reset, untracked ones removed (not ignored ones)."""
        run_git(["reset", "-q", "--hard", rev], cwd=path)
        run_git(["clean", "-q", "-fd"], cwd=path)

    def prune(self) -> None:
        self.repo.git.worktree("prune")

    def remove_worktree(self, path: Path) -> None:
        """Remove a harness-owned worktree (a slot's, a scratch one) and prune git's record of it."""
        try:
            self.repo.git.worktree("remove", "--force", str(path))
        except git.GitCommandError:
            shutil.rmtree(path, ignore_errors=True)
        self.prune()

    def diff(self, parent: str, commit: str, paths: tuple[str, ...]) -> str | None:
        """The unified diff (read-only: safe beside a running loop) parent..commit of paths, or None where either commit is gone."""
        try:
            return self.repo.git.diff(parent, commit, "--", *paths)
        except git.GitCommandError:
            return None

    def worktree(self, path: Path) -> "Worktree":
        return Worktree(path)

    def detached_worktree(self, path: Path, rev: str, leave_out: tuple[str, ...] = ()) -> "Worktree":
        """A harness-owned detached worktree at rev (a lane's, a slot's): created, or re-attached on
        resume; without the leave_out paths (a researcher's lane: Worktree.leave_out)."""
        sha = self.require_commit(rev)
        self.prune()
        if not (path / ".git").exists():
            if path.exists():  # left over from a pruned worktree: harness-owned, nothing to keep
                shutil.rmtree(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.repo.git.worktree("add", "--detach", str(path), sha)
        Worktree.leave_out_of(path, leave_out)
        wt = Worktree(path)
        wt.reset_hard(sha)
        return wt


class Worktree:
    """Verbs on the run's worktree: what changed, commit, reset."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.repo = open_repo(self.path)
        self._clear_stale_lock()

    def close(self) -> None:
        """Stop GitPython's persistent `git cat-file` processes now, not whenever the object is collected."""
        self.repo.close()

    def __enter__(self) -> "Worktree":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _clear_stale_lock(self) -> None:
        lock = Path(self.repo.git_dir) / "index.lock"
        if lock.exists():
            lock.unlink()  # only the harness runs git here, and it is not running now

    @staticmethod
    def leave_out_of(path: Path, paths: tuple[str, ...]) -> None:
        """Make the worktree at path a sparse checkout without paths (idempotent; none: unchanged).

        The researcher's worktrees (the run's, the lanes') leave out the protected data, so the
        validation bytes are not on its disk; the training jobs' slot worktrees are full checkouts.
        git keeps the patterns in the worktree's own git dir (info/sparse-checkout, config.worktree,
        with extensions.worktreeConfig in the repo's config): the user's checkout stays whole.
        """
        if not paths:
            return
        patterns = ["/*", *("!/" + re.sub(r"([*?\[\]!#\\])", r"\\\1", p.strip("/")) for p in paths)]
        repo = open_repo(path)
        try:
            repo.git.sparse_checkout("set", "--no-cone", *patterns)
        finally:
            repo.close()

    def left_out(self) -> set[str]:
        """The tracked paths this worktree does not check out (skip-worktree: its sparse checkout)."""
        out = self.repo.git.ls_files("-v")
        return {line[2:] for line in out.splitlines() if line[:1] == "S"}

    def committed_sha256(self, commit: str, path: str) -> str | None:
        """sha256 of the file path as committed at commit (from git's objects, not the worktree, which
        may leave it out); None where it is no file there (absent, or a folder: as sha256_file says)."""
        data = self.file_at(commit, path)
        return None if data is None else hashlib.sha256(data).hexdigest()

    def head(self) -> str:
        return self.repo.git.rev_parse("--verify", "HEAD")

    def resolve(self, rev: str) -> str:
        return self.repo.git.rev_parse("--verify", f"{rev}^{{commit}}")

    def changes(self) -> list[Change]:
        out = self.repo.git.status("--porcelain", "--untracked-files=all", "--ignored=no")
        changes = []
        for line in out.splitlines():
            if not line.strip():
                continue
            code, rest = line[:2], line[3:]
            if " -> " in rest:  # rename: both sides changed
                old, new = rest.split(" -> ", 1)
                changes += [Change(code, old.strip('"')), Change(code, new.strip('"'))]
            else:
                changes.append(Change(code, rest.strip('"')))
        return changes

    def reset_hard(self, commit: str) -> None:
        """Back to commit exactly: tracked files reset, untracked and ignored files (and nested
        repositories) removed, so nothing a candidate left behind reaches the next one."""
        self.repo.git.reset("--hard", commit)
        self.repo.git.clean("-ffdx", "-q")

    def commit(self, paths: tuple[str, ...], message: str) -> str:
        self.repo.git.add("--", *paths)
        args = ["-c", f"user.name={self._identity('name', HARNESS_NAME)}",
                "-c", f"user.email={self._identity('email', HARNESS_EMAIL)}"]
        self.repo.git.execute(["git", *args, "commit", "-q", "--no-verify", "-m", message])
        return self.head()

    def keep_reachable(self, tag: str, iteration: int, commit: str) -> str:
        """A ref for an evaluated candidate, refs/autoresearch/<tag>/tried/<iteration>: outside
        the branch namespace (the run branch keeps only kept commits), so a discarded, crashed or
        invalid candidate that is reset away survives `git gc`. Returns the ref's name."""
        name = f"refs/autoresearch/{tag}/tried/{iteration:04d}"
        self.repo.git.update_ref(name, commit)
        if iteration % PACK_REFS_EVERY == 0:
            self.maintain()
        return name

    def maintain(self) -> None:
        """Move loose refs into packed-refs (what `git gc` does), so that listing them (the git guard,
        twice an iteration) reads one file instead of one file per tried candidate. Only a speed-up:
        a concurrent ref update that holds a lock makes it a no-op this time. Then the commit-graph
        (what `git gc` and `git maintenance` write): every job's baseline check walks from its commit
        back to the baseline (`merge-base --is-ancestor`, trust.baseline_problem), through every kept
        commit, and the graph spares it parsing each commit object (a branch of 440 keeps: 6.3 ms
        a walk without it, 1.8 ms with it)."""
        for args in (("pack-refs", "--all"), ("commit-graph", "write", "--reachable")):
            try:
                self.repo.git.execute(["git", *args])
            except git.GitCommandError:
                pass

    def _identity(self, key: str, default: str) -> str:
        """The user's user.name / user.email (read once per worktree: two git calls less per commit)."""
        known = self.__dict__.setdefault("_identities", {})
        if key not in known:
            try:
                known[key] = self.repo.git.config(f"user.{key}") or default
            except git.GitCommandError:
                known[key] = default
        return known[key]

    def log(self, base: str) -> list[str]:
        """Commits on the branch after base, oldest first."""
        out = self.repo.git.rev_list("--reverse", f"{base}..HEAD")
        return out.split()

    def first_parent(self, base: str, ref: str) -> list[str]:
        """base, then the commits of ref after it along first parents, oldest first."""
        out = self.repo.git.rev_list("--first-parent", "--reverse", f"{base}..{ref}")
        return [self.resolve(base), *out.split()]

    def file_at(self, commit: str, path: str) -> bytes | None:
        """The exact bytes of the file path at commit, or None where it is no file there."""
        found = [sha for name, sha in tree_blobs(self.repo, commit, (path,)) if name == path.strip("/")]
        return blob_bytes(self.repo, found[0]) if found else None

    def export(self, commit: str, paths: tuple[str, ...], dest: Path) -> list[str]:
        """Write paths (files or folders) as committed at commit under dest; the files written."""
        written = []
        for name, sha in tree_blobs(self.repo, commit, paths):
            target = Path(dest) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blob_bytes(self.repo, sha))
            written.append(name)
        return written

    def merge_file(self, ours: Path, base: Path, theirs: Path) -> int:
        """git merge-file: merge base->theirs into ours in place; the number of conflicts (<0: error)."""
        status, _, _ = self.repo.git.execute(["git", "merge-file", "-q", str(ours), str(base), str(theirs)],
                                             with_extended_output=True, with_exceptions=False)
        return status
