"""Reaching a Ray cluster, and what a job sends it (the Ray executor's plumbing).

`ray` is an optional extra: it is imported here only, when `--executor ray` is asked for.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from ..errors import ClusterError, ConfigError
from ..gitgate import run_git

CONNECT_TIMEOUT_S = 10.0  # s to reach the cluster's address before ray.init is tried
GIT_TIMEOUT_S = 60
# The supervisor's own signal handlers (driver.interrupts): ray.init replaces SIGTERM's with one that
# exits the process (and Ray's core installs handlers of its own); they are put back after it.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_VAR = "HARNESS_RAY_GRACE_S"  # s the cluster's head may not answer before the run stops (default 30)
GRACE_S = 30.0
# Ray's driver exits by itself (no clean-up, exit 1) once the head has not answered for
# gcs_rpc_server_reconnect_timeout_s (60 s); the harness stops the run itself after the grace,
# so Ray is given this much longer for the clean stop (unless the user set it).
RECONNECT_VAR = "RAY_gcs_rpc_server_reconnect_timeout_s"
RECONNECT_EXTRA_S = 600


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise ConfigError("--executor ray needs the ray package: pip install 'autoresearch-harness[ray]'") from e
    return ray


def resolve_address(address: str | None) -> str:
    return address or os.environ.get("RAY_ADDRESS") or "auto"


def _reachable(address: str) -> None:
    """A host:port address answers a TCP connect (ray.init would wait a long while otherwise)."""
    if address == "auto" or address.startswith("local"):
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ClusterError(f"the Ray cluster at {address} cannot be reached ({e}); start it (`ray start --head`) "
                           f"or pass the right --ray-address / RAY_ADDRESS") from None


def connect(address: str | None) -> str:
    """Connect this process to the cluster (once); the address it used."""
    ray = import_ray()
    address = resolve_address(address)
    if ray.is_initialized():
        return address
    _reachable(address)
    os.environ.setdefault(RECONNECT_VAR, str(int(grace_s() + RECONNECT_EXTRA_S)))
    saved = _handlers()
    try:
        ray.init(address=address, log_to_driver=False, logging_level="warning", configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(f"the Ray cluster at {address!r} cannot be reached: {e}. Start it (`ray start --head`) "
                           f"or pass the right --ray-address / RAY_ADDRESS") from None
    finally:
        _restore(saved)
    return address


def grace_s() -> float:
    try:
        return max(1.0, float(os.environ.get(GRACE_VAR) or GRACE_S))
    except ValueError:
        return GRACE_S


def _handlers() -> dict[int, object] | None:
    """This process's handlers of SIGINT/SIGTERM/SIGHUP (None off the main thread: they cannot be set there)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {s: signal.getsignal(s) for s in SIGNALS}


def _restore(saved: dict[int, object] | None) -> None:
    """Put the handlers back (signal.signal installs them at the C level again too, over Ray's own),
    and check that they are in force: a SIGTERM must reach the harness's clean stop, not Ray's exit."""
    if saved is None:
        return
    for s, handler in saved.items():
        if handler is not None:  # None: set outside Python; nothing to put back
            signal.signal(s, handler)
    wrong = [signal.Signals(s).name for s, handler in saved.items()
             if handler is not None and signal.getsignal(s) != handler]
    if wrong:
        raise ClusterError(f"after connecting to Ray, the handlers of {', '.join(wrong)} are not the harness's: "
                           f"a signal would not stop the run cleanly; refusing to run")


def ray_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray's task options for a job's resources: GPU and CPU by their own keywords."""
    rest = {k: v for k, v in resources.items() if k not in ("GPU", "CPU")}
    opts: dict[str, Any] = {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0)}
    if rest:
        opts["resources"] = rest
    return opts


def fits(total: dict[str, float], resources: dict[str, float]) -> int:
    """How many jobs of `resources` fit in `total`."""
    return min(int(total.get(k, 0) // v) for k, v in resources.items())


def archive(repo: Path, commit: str, paths: tuple[str, ...]) -> bytes:
    """A tar of the commit's files among paths (the editable and protected ones)."""
    listed = run_git(["ls-tree", "-r", "-z", "--name-only", commit, "--", *paths], repo, timeout=GIT_TIMEOUT_S).stdout.split("\0")
    listed = [p for p in listed if p]
    if not listed:
        raise ClusterError(f"commit {commit[:12]} has none of the files {', '.join(paths)}: nothing to train")
    return run_git(["archive", "--format=tar", commit, "--", *listed], repo, timeout=GIT_TIMEOUT_S, text=False).stdout
