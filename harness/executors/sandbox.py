"""The sandbox around a training job, an evaluation or a researcher: bubblewrap (`bwrap`) argv.

What a sandboxed process gets (docs/robustness.md says what it does and does not stop):

- no privilege, whoever starts it: its own user namespace with every capability dropped
  (`--unshare-user --cap-drop ALL`, CapEff and CapBnd 0, as root too) and no further user
  namespaces (`--disable-userns`), so a mount, an umount or a remount fails and every read-only
  or hidden path stays so (`capabilities` checks it from inside);
- its own PID namespace (`--unshare-pid`), with bwrap's init as PID 1: when the job's own
  process exits, or the harness kills bwrap, every process left in the namespace is killed
  by the kernel, a `setsid` double-forked daemon included (`--die-with-parent` covers the
  harness dying; `--new-session` keeps it off the harness's terminal);
- an allow-list view (view.py): the system runtime read-only, the interpreter it runs, the
  worktree, a private /tmp, the output folder and the paths its caller names; nothing else of the
  disk exists for it. Hidden paths inside what is shown (the protected corpus in a worktree, the
  harness's package inside site-packages) are covered by an empty tmpfs or /dev/null;
- no network (`--unshare-net`: only a loopback of its own) unless allowed;
- the GPUs: /dev/nvidia* and /dev/dri passed through when present.

`wrap` builds argv (it asks a Python interpreter once where it lives: view.interpreter);
`probe` says whether bwrap works here and drops every capability; `resolve` turns
`--sandbox auto|bwrap|off` into what is used, with the warning to show when it is not.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..errors import ConfigError
from . import view

MODES = ("auto", "bwrap", "off")
PROBE_TIMEOUT_S = 20.0  # s for `bwrap ... true`; it takes milliseconds where it works
USERNS_SYSCTL = "/proc/sys/kernel/unprivileged_userns_clone"  # Debian's switch (0 = off)
APPARMOR_SYSCTL = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"  # Ubuntu 24.04's (1 = off)
GPU_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri")
NO_PRIVILEGE = ["--unshare-user", "--cap-drop", "ALL"]  # every capability dropped, root or not
NO_USERNS = ["--disable-userns"]  # bwrap >= 0.8: no nested user namespace to regain capabilities in
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"  # the probe's `cat`, whatever the caller's PATH
CAP_FIELDS = ("CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs", "Uid")


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def isolation() -> list[str]:
    """The flags that take every privilege away (without --disable-userns where bwrap is too old)."""
    return NO_PRIVILEGE + (NO_USERNS if probe(bwrap_path()).disable_userns else [])


def wrap(argv: list[str], *, worktree: Path, tmp_dir: Path, output_dir: Path | None = None,
         readonly: Iterable[Path] = (), hidden: Iterable[Path] = (), writable: Iterable[Path] = (),
         network: bool = False, gpu: bool = True, bwrap: str = "bwrap", new_session: bool = True) -> list[str]:
    """argv run under bubblewrap, cwd = worktree (which stays writable), seeing only its allow-list.

    new_session False: the process stays in its caller's session (a researcher, whose supervisor
    already gave it a session without a terminal, so that a stop's SIGTERM reaches it).

    Order matters: later mounts cover earlier ones. The runtime and /tmp (tmp_dir) first, then the
    interpreter and the read-only paths, then the worktree, the output folder and the writable
    paths, and last the hidden paths that lie inside any of those (the protected corpus in the
    worktree, the harness's package inside site-packages). A hidden path outside them is simply
    not there. The program is named by its absolute path (view.interpreter; ViewError when it
    cannot be shown).
    """
    hidden = [Path(p) for p in hidden]
    run = view.interpreter(list(argv), hidden=tuple(os.path.realpath(h) for h in hidden))
    out = [bwrap, *isolation(), *view.runtime_mounts(), "--dev", "/dev", "--proc", "/proc",
           "--bind", str(tmp_dir), "/tmp",
           "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", *(["--new-session"] if new_session else [])]
    if not network:
        out.append("--unshare-net")
    if gpu:
        for pattern in GPU_DEVICE_GLOBS:
            for dev in sorted(glob.glob(pattern)):
                out += ["--dev-bind", dev, dev]
    shown = [Path(p) for p in (*run.roots, *view.library_paths())]
    for path in shown:
        out += ["--ro-bind", str(path), str(path)]
    bound = [Path(p) for p in (worktree, *([output_dir] if output_dir else []), *writable)]
    for path in bound:
        out += ["--bind", str(path), str(path)]
    extra = [Path(p) for p in readonly if Path(p).exists()]
    for path in extra:
        out += ["--ro-bind", str(path), str(path)]
    visible = [*shown, *bound, *extra]
    hidden += [Path(p) for p in (*view.private_runtime_files(), *view.bundled_copies(run.roots))]
    # what is bound explicitly wins over a hidden folder that is, or holds, it (the worktree inside
    # the hidden run folder); a hidden path strictly inside something shown is covered
    covered = [h for h in hidden if view.in_runtime(str(h)) or any(h != v and h.is_relative_to(v) for v in visible)]
    out += _cover(list(dict.fromkeys(covered)))
    out += ["--remount-ro", "/"]  # bwrap's own root (the folders it made for the mounts) read-only too
    if run.bindir:  # `python` inside the job is the interpreter the job was started with
        out += ["--setenv", "PATH", f"{run.bindir}:{os.environ.get('PATH', '')}"]
    return out + ["--chdir", str(worktree), "--", *run.argv]


def _cover(paths: list[Path]) -> list[str]:
    """An empty tmpfs over each hidden folder, /dev/null over each hidden file (bound without
    device access, so opening it fails: EACCES)."""
    out: list[str] = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            out += ["--tmpfs", str(path)]
        elif path.exists():
            out += ["--ro-bind", "/dev/null", str(path)]
    return out


# ---------------------------------------------------------------------------
# Does it work here?


@dataclass(frozen=True)
class Probe:
    works: bool
    detail: str  # why not, when it does not
    disable_userns: bool = False  # this bwrap can forbid nested user namespaces
    caps: tuple[tuple[str, str], ...] = ()  # CAP_FIELDS as read from inside the sandbox

    @property
    def capabilities(self) -> dict[str, str]:
        return dict(self.caps)


def _run_inside(bwrap: str, flags: list[str]) -> subprocess.CompletedProcess:
    argv = [bwrap, *flags, *view.runtime_mounts(), "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
            "--unshare-net", "--die-with-parent", "--new-session", "--setenv", "PATH", SYSTEM_PATH,
            "--", "cat", "/proc/self/status"]
    return subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S)


def read_caps(status: str) -> dict[str, str]:
    """CAP_FIELDS from the text of /proc/<pid>/status (pure)."""
    out = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in CAP_FIELDS:
            out[key] = " ".join(value.split())
    return out


def unprivileged(caps: dict[str, str]) -> bool:
    """No effective, permitted, bounding or ambient capability left."""
    return all(int(caps.get(k, "f"), 16) == 0 for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb"))


@functools.lru_cache(maxsize=None)
def probe(bwrap: str | None) -> Probe:
    """Start the sandbox once per bwrap binary (None: none on PATH) and read its capabilities from
    inside (/proc/self/status); it works only if none is left. Cached for the process."""
    if bwrap is None:
        return Probe(False, "bwrap is not installed")
    try:
        done = _run_inside(bwrap, NO_PRIVILEGE + NO_USERNS)
        disable_userns = done.returncode == 0
        if not disable_userns:  # bwrap < 0.8 has no --disable-userns
            done = _run_inside(bwrap, NO_PRIVILEGE)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Probe(False, f"bwrap did not run: {e}")
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        return Probe(False, f"bwrap failed: {err[-1] if err else f'exit code {done.returncode}'}")
    caps = read_caps(done.stdout.decode(errors="replace"))
    if not unprivileged(caps):
        shown = ", ".join(f"{k} {v}" for k, v in caps.items())
        return Probe(False, f"bwrap ran but its processes kept capabilities ({shown})", caps=tuple(caps.items()))
    return Probe(True, "", disable_userns, tuple(caps.items()))


def capabilities(setting: str) -> dict[str, str]:
    """What a sandboxed job holds (CapEff ... Uid, read inside it), or {} when jobs run unsandboxed:
    for run.json, `harness check` and the report."""
    if setting == "off" or not resolve(setting).on:
        return {}
    return probe(bwrap_path()).capabilities


def caps_line(caps: dict[str, str]) -> str:
    """'CapEff 0, CapBnd 0, uid 0' for a person to read."""
    if not caps:
        return "unsandboxed: the job has every privilege of the harness"
    def short(v: str) -> str:
        return "0" if v and int(v, 16) == 0 else v
    parts = [f"{k} {short(caps[k])}" for k in ("CapEff", "CapBnd") if k in caps]
    if "Uid" in caps:
        parts.append(f"uid {caps['Uid'].split()[0]}")
    return ", ".join(parts)


def how_to_enable(detail: str) -> str:
    """What to do about a failed probe, for the warning and for `harness check`."""
    if "not installed" in detail:
        return "install it: apt install bubblewrap (Debian/Ubuntu; dnf install bubblewrap on Fedora)"
    if "kept capabilities" in detail:
        return (f"use the distribution's bubblewrap ({shutil.which('bwrap')} is not one that drops them: "
                f"`bwrap --version` should say 0.4 or newer, and no wrapper script may stand in for it)")
    hints = ["bwrap needs user namespaces when it is not run as root"]
    for path, off, fix in ((USERNS_SYSCTL, "0", "sysctl -w kernel.unprivileged_userns_clone=1"),
                           (APPARMOR_SYSCTL, "1", "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 "
                                                  "(or an AppArmor profile for bwrap)")):
        try:
            if Path(path).read_text().strip() == off:
                hints.append(f"enable them: {fix}")
        except OSError:
            continue
    if len(hints) == 1:
        hints.append("check `sysctl user.max_user_namespaces` (must be > 0) and, in a container, "
                     "that it may create namespaces (docker: --security-opt seccomp=unconfined, or run "
                     "the harness outside the container)")
    return "; ".join(hints)


UNPROTECTED = ("the researcher's training code runs unsandboxed: it can write outside its worktree, read and "
               "rewrite the run folder (ledger, shadow, journals), reach the network and leave processes "
               "that outlive the job")


@dataclass(frozen=True)
class Choice:
    mode: str  # "bwrap" or "off": what is used
    setting: str  # what was asked for: auto, bwrap or off
    warning: str | None = None  # to show, loudly, when auto found no working bwrap

    @property
    def on(self) -> bool:
        return self.mode == "bwrap"


def resolve(setting: str) -> Choice:
    """`auto`: bwrap when it works here, else off with a warning; `bwrap`: required; `off`: none."""
    if setting not in MODES:
        raise ConfigError(f"sandbox must be one of {', '.join(MODES)}, got {setting!r}")
    if setting == "off":
        return Choice("off", setting)
    found = probe(bwrap_path())
    if found.works:
        return Choice("bwrap", setting)
    if setting == "bwrap":
        raise ConfigError(f"--sandbox bwrap was asked for, but {found.detail}. To fix: "
                          f"{how_to_enable(found.detail)}; or run with --sandbox auto/off (unprotected).")
    return Choice("off", setting, f"NO SANDBOX ({found.detail}): {UNPROTECTED}. To get it: "
                                  f"{how_to_enable(found.detail)}.")


_warned: set[str] = set()


def warn_once(choice: Choice) -> str | None:
    """The choice's warning the first time this process sees it, else None."""
    if choice.warning is None or choice.warning in _warned:
        return None
    _warned.add(choice.warning)
    return choice.warning


def reset_cache() -> None:
    """Forget the probe and the warnings (tests that change PATH)."""
    probe.cache_clear()
    _warned.clear()
