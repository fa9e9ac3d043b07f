"""The researcher's own sandbox: every CLI researcher (`codex`, `claude`, `gemini`, `cmd:`) runs
under bubblewrap (executors/sandbox.wrap), as the training jobs do.

What its process gets:
- its worktree, read-write, without `.git` (a /dev/null over the gitlink: no git in there) and
  without the protected data files (the validation bytes);
- its own home, a folder of the run's (`agent-home/`) that the harness makes, read-write, with
  the CLI's own config folder of the user's home (`~/.codex`, `~/.claude`, `~/.gemini`) linked
  into it and bound read-write (the login, the settings), and a private /tmp per call;
- read-only: what it needs to start: the executable's install folder (an npm prefix, a venv, a
  pyenv root), the interpreter its `#!` line names (and that one's), the absolute files of a
  `cmd:` template, the prompt file;
- the network (it must reach its API) unless `--agent-network off`;
- a PID namespace (`--unshare-pid`, `--die-with-parent`): when the call ends, the kernel kills
  everything it left, a `setsid env -i` grandchild included;
- no capability, even as root (`--unshare-user --cap-drop ALL`).
Out of view: the run folder (ledger, run.json, journals, logs), the research repo (its `.git`
objects, its data, other worktrees), the harness's own package and the data cache.

The `openai` and `mutate` researchers run no code: the harness applies their edits itself
(agents/edits.py, path-checked against the editable files), so there is nothing to sandbox.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..ledger import events
from ..errors import AgentError, ConfigError
from ..executors import sandbox, view
from ..gitgate import data_files

INTERPRETER_DEPTH = 3  # a script, its interpreter, that one's (a pyenv shim is a bash script)
OFF_WARNING = ("the researcher's own process runs unsandboxed: it can read the validation bytes (its "
               "worktree's data, git's objects), rewrite the run folder (run.json, the ledger) and "
               "leave processes that outlive its call")


_warned: set[tuple[Path, str]] = set()


@dataclass(frozen=True)
class Jail:
    """How the researchers of one run are confined; bwrap None = not at all (--agent-sandbox off)."""
    bwrap: str | None
    home: Path  # the researcher's own home, made by the harness
    hidden: tuple[Path, ...]  # out of view even where a bound folder holds them
    protected_data: tuple[str, ...]  # worktree-relative: the validation bytes
    network: bool = True
    warning: str | None = None  # why it runs unsandboxed, for the run's events (once per run)
    refusal: str | None = None  # why it may not run at all (--agent-sandbox bwrap where bwrap fails)

    @property
    def on(self) -> bool:
        return self.bwrap is not None


def resolve(setting: str) -> sandbox.Choice:
    """--agent-sandbox auto|bwrap|off, as --sandbox is resolved, with the researcher's warning."""
    try:
        choice = sandbox.resolve(setting)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--sandbox", "--agent-sandbox")) from None
    if choice.warning:
        return sandbox.Choice("off", setting, choice.warning.replace(sandbox.UNPROTECTED, OFF_WARNING)
                              .replace("--sandbox", "--agent-sandbox"))
    return choice


def manifest_entry(cfg, researcher) -> str:
    """run.json's agent_sandbox: bwrap or off for a researcher that runs a process, else none."""
    from .cli import CLIResearcher
    if not isinstance(researcher, CLIResearcher):
        return "none"  # openai, mutate: the harness applies their edits, no code of theirs runs
    return resolve(cfg.agent_sandbox).mode


def for_run(cfg, run_dir: Path | None = None) -> Jail:
    """The jail of cfg's researchers; its home lives in run_dir (default the run's folder)."""
    try:
        choice = resolve(cfg.agent_sandbox)
    except ConfigError as e:  # --agent-sandbox bwrap where it does not work: refused by the first call
        return Jail(None, Path(run_dir or cfg.run_dir) / "agent-home", (), (), refusal=str(e))
    where = Path(run_dir or cfg.run_dir)
    warning = choice.warning or (None if choice.on else f"--agent-sandbox off: {OFF_WARNING}")
    data = data_files(cfg.protected)
    hidden = (cfg.run_dir, where, Path(cfg.repo), view.HARNESS_PACKAGE, view.data_cache())
    return Jail(sandbox.bwrap_path() if choice.on else None, where / "agent-home",
                tuple(dict.fromkeys(Path(p).resolve() for p in hidden)), data, cfg.agent_network, warning)


@dataclass
class Confined:
    argv: list[str]
    env: dict[str, str] | None
    scratch: Path | None = None  # the call's private /tmp, removed when it ends

    def close(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def confine(jail: Jail | None, argv: list[str], worktree: Path, env: dict[str, str] | None,
            readonly: list[Path] = (), config: tuple[str, ...] = (), config_vars: tuple[str, ...] = ()) -> Confined:
    """argv and its environment under the jail (unchanged when it is off or there is none).

    config: the names in the user's home of the CLI's own settings (".codex", ".claude.json");
    config_vars: the variables that may point the CLI at its settings elsewhere (CODEX_HOME).
    """
    if jail is not None and jail.refusal:
        raise AgentError(jail.refusal)
    if jail is not None and jail.warning:
        _warn(jail)
    if jail is None or not jail.on:
        return Confined(list(argv), env)
    worktree = Path(worktree)
    jail.home.mkdir(parents=True, exist_ok=True)
    base = dict(os.environ if env is None else env)
    named = []
    for var in (v for v in config_vars if base.get(v)):
        folder = Path(base[var])
        folder.mkdir(parents=True, exist_ok=True)  # what the CLI would make itself: in view, it must exist
        base[var] = str(folder.resolve())  # bwrap binds no path through a symlinked folder
        named.append(folder.resolve())
    writable = [jail.home, *_link_config(jail.home, config), *named]
    seen = [*runtime_paths(argv[0]), *readonly, *resolver_paths()]
    (jail.home.parent / "agent-tmp").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="call-", dir=jail.home.parent / "agent-tmp"))
    hidden = [*jail.hidden, worktree / ".git", *(worktree / p for p in jail.protected_data)]
    argv = [real_folder(argv[0]), *argv[1:]]
    # The CLI stays in the process group the supervisor made (a session of its own, with no
    # terminal, so `--new-session`'s guard against TIOCSTI has nothing to guard): a stop's SIGTERM
    # reaches it, not only bwrap, so it ends cleanly (gemini killed by bwrap's SIGKILL left
    # state that slowed its next call past 8 s); what it setsid'd goes with the PID namespace.
    try:
        wrapped = sandbox.wrap(argv, worktree=worktree, tmp_dir=scratch, readonly=seen,
                               hidden=[h for h in hidden if h.exists()], writable=writable,
                               network=jail.network, gpu=False, bwrap=jail.bwrap, new_session=False)
    except view.ViewError as e:
        raise AgentError(f"the researcher cannot be started in its sandbox: {e}") from None
    base.update(HOME=str(jail.home), TMPDIR="/tmp")
    return Confined(wrapped, base, scratch)


def _warn(jail: Jail) -> None:
    """The unsandboxed researcher in the run's events.log, once per run (its folder holds the home)."""
    where = jail.home.parent
    if where.exists() and (where, jail.warning) not in _warned:
        _warned.add((where, jail.warning))
        events.record(where, "agent_sandbox_off", jail.warning)


def _link_config(home: Path, names: tuple[str, ...]) -> list[Path]:
    """Link each of the user's config entries into the researcher's home; the real ones, to bind."""
    real_home = Path(os.environ.get("HOME") or Path.home())
    if real_home.resolve() == home.resolve():
        return []
    bound = []
    for name in names:
        real, link = real_home / name, home / name
        if not real.exists():
            continue  # the CLI makes its own, in the researcher's home
        if link.is_symlink() or not link.exists():  # the CLI may have replaced it by a file of its own
            link.unlink(missing_ok=True)
            link.symlink_to(real.resolve())  # bwrap binds no path through a symlinked folder
        bound.append(real.resolve())
    return bound


def resolver_paths() -> list[Path]:
    """Where /etc/resolv.conf really is (systemd-resolved keeps it under /run): DNS for the API."""
    conf = Path("/etc/resolv.conf").resolve()
    return [] if conf.is_relative_to("/etc") else [conf.parent]


# ---------------------------------------------------------------------------
# What an executable needs to start


def runtime_paths(executable: str) -> list[Path]:
    """Folders an executable needs: its install root, then its `#!` interpreter's, recursively."""
    out: list[Path] = []
    name = executable
    for _ in range(INTERPRETER_DEPTH):
        found = shutil.which(name)
        if found is None:
            break
        for path in (Path(os.path.abspath(found)), Path(found).resolve()):
            root = install_root(path).resolve()  # bwrap binds no path through a symlinked folder
            if root not in out:
                out.append(root)
        name = interpreter(Path(found).resolve())
        if name is None:
            break
    return out


def real_folder(executable: str) -> str:
    """The executable as found on PATH, through its folder's real path (a symlinked `.cache/npm` is
    not in the view; the file's own link stays, so a venv's python still finds its venv)."""
    found = shutil.which(executable)
    return str(Path(found).parent.resolve() / Path(found).name) if found else executable


def install_root(path: Path) -> Path:
    """The folder an installed file comes with: the prefix holding node_modules, a pyenv-style root
    (`shims/`), a prefix (`PREFIX/bin/`: a venv, /usr/local), else its own folder; never / or the home."""
    parts = path.parts
    if "node_modules" in parts:
        root = Path(*parts[:parts.index("node_modules")])
        root = root.parent if root.name == "lib" else root  # PREFIX/lib/node_modules (npm -g)
    elif path.parent.name == "shims" or (path.parent.name == "bin" and _is_prefix(path.parent.parent)):
        root = path.parent.parent
    else:
        root = path.parent
    home = Path.home().resolve()
    if root == Path("/") or root.resolve() == home or home.is_relative_to(root.resolve()):
        return path.parent
    return root


def _is_prefix(folder: Path) -> bool:
    """An installation prefix (a venv, /usr, /usr/local), not any folder that has a bin/."""
    return (folder / "lib").is_dir() or (folder / "pyvenv.cfg").is_file()


interpreter = view.shebang  # the program a script's `#!` line runs


def template_files(argv: list[str], worktree: Path) -> list[Path]:
    """The absolute paths a `cmd:` template names that exist (its script, its config), but the
    worktree's own (`{workdir}`: it stays writable)."""
    named = [Path(a) for a in argv[1:] if os.path.isabs(a) and os.path.exists(a)]
    return [p for p in named if not p.resolve().is_relative_to(Path(worktree).resolve())]
