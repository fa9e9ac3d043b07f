"""Reaching a Ray cluster, and what a job sends it (the Ray executor's plumbing).

`ray` is an optional extra: it is imported here only, when `--executor ray` is asked for.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from ..errors import ClusterError, ConfigError
from ..gitrun import run_git

CONNECT_TIMEOUT_S = 10.0  # s to reach the cluster's address before ray.init is tried
GIT_TIMEOUT_S = 60


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
    try:
        ray.init(address=address, log_to_driver=False, logging_level="warning", configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(f"the Ray cluster at {address!r} cannot be reached: {e}. Start it (`ray start --head`) "
                           f"or pass the right --ray-address / RAY_ADDRESS") from None
    return address


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
