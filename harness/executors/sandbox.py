"""The sandbox around a training job or an evaluation: bubblewrap (`bwrap`) argv, built here.

What a sandboxed process gets (see docs/robustness.md for what it does and does not stop):

- its own PID namespace (`--unshare-pid`), with bwrap's init as PID 1: when the job's own
  process exits, or the harness kills bwrap, every process left in the namespace is killed
  by the kernel, a `setsid` double-forked daemon included (`--die-with-parent` covers the
  harness dying; `--new-session` keeps it off the harness's terminal);
- the whole filesystem read-only, except the worktree, a private /tmp and the output folder;
- the run folder (ledger, shadow, journals, logs), the repo's git objects and the harness's own
  package hidden under empty tmpfs mounts (a hidden file is covered by /dev/null, unreadable);
- no network (`--unshare-net`: only a loopback of its own) unless allowed;
- the GPUs: /dev/nvidia* and /dev/dri passed through when present.

`wrap` only builds argv (pure but for the existence checks of the paths it mounts); `probe`
says whether bwrap works on this machine; `resolve` turns `--sandbox auto|bwrap|off` into
what is used, with the warning to show when it is not.
"""
from __future__ import annotations

import functools
import glob
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..errors import ConfigError

MODES = ("auto", "bwrap", "off")
PROBE_TIMEOUT_S = 20.0  # s for `bwrap ... true`; it takes milliseconds where it works
USERNS_SYSCTL = "/proc/sys/kernel/unprivileged_userns_clone"  # Debian's switch (0 = off)
APPARMOR_SYSCTL = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"  # Ubuntu 24.04's (1 = off)
GPU_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri")


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def wrap(argv: list[str], *, worktree: Path, tmp_dir: Path, output_dir: Path | None = None,
         readonly: Iterable[Path] = (), hidden: Iterable[Path] = (), writable: Iterable[Path] = (),
         network: bool = False, gpu: bool = True, bwrap: str = "bwrap") -> list[str]:
    """argv run under bubblewrap, cwd = worktree (which stays writable).

    Order matters: later mounts cover earlier ones. The root is bound read-only, then /tmp is
    replaced by tmp_dir, then the hidden paths are covered, and only then are the worktree,
    the output folder and the read-only paths bound back in, so they stay visible even when
    they lie inside a hidden folder (the worktree lives inside the run folder); last, hidden
    paths inside those (the protected corpus in the worktree) are covered again.
    """
    out = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
           "--bind", str(tmp_dir), "/tmp",
           "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session"]
    if not network:
        out.append("--unshare-net")
    if gpu:
        for pattern in GPU_DEVICE_GLOBS:
            for dev in sorted(glob.glob(pattern)):
                out += ["--dev-bind", dev, dev]
    bound = [Path(p) for p in (worktree, *([output_dir] if output_dir else []), *writable)]
    hidden = [Path(p) for p in hidden]
    out += _cover(hidden)
    for path in bound:
        out += ["--bind", str(path), str(path)]
    for path in readonly:
        if Path(path).exists():
            out += ["--ro-bind", str(path), str(path)]
    # a hidden path inside a folder bound back in (the corpus in the worktree) is covered again
    out += _cover([h for h in hidden if any(h != b and h.is_relative_to(b) for b in bound)])
    return out + ["--chdir", str(worktree), "--", *argv]


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


@functools.lru_cache(maxsize=None)
def probe(bwrap: str | None) -> Probe:
    """Run `true` in the sandbox once per bwrap binary (None: none on PATH); cached for the process."""
    if bwrap is None:
        return Probe(False, "bwrap is not installed")
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
            "--unshare-net", "--die-with-parent", "--new-session", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Probe(False, f"bwrap did not run: {e}")
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        return Probe(False, f"bwrap failed: {err[-1] if err else f'exit code {done.returncode}'}")
    return Probe(True, "")


def how_to_enable(detail: str) -> str:
    """What to do about a failed probe, for the warning and for `harness check`."""
    if "not installed" in detail:
        return "install it: apt install bubblewrap (Debian/Ubuntu; dnf install bubblewrap on Fedora)"
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
