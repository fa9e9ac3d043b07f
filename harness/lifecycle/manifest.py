"""The run's manifest, runs/<tag>/run.json: written once at the start (settings, baseline commit,
protected files' hashes, the training interpreter, the device, the sandboxes) through the ledger
guard's trusted record, read back on --resume only as the harness wrote it; the trusted baseline the
supervisor holds, decided at the start or rebuilt from the verified manifest."""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from typing import Any

from .. import __version__, ledger
from ..ledger import guard as ledgerguard, trust
from ..workload import trainenv
from ..agents import pricing
from ..agents import Researcher
from ..config import RunConfig
from ..errors import RepoError
from ..agents import sandboxed
from ..executors import sandbox, uvenv
from ..integrity import budget
from ..gitgate import Worktree
from ..driver.step import now_iso


def device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return f"cpu ({platform.machine()})"


def write_manifest(cfg: RunConfig, researcher: Researcher, base: str, program: str,
                   protected_sha256: dict[str, str]) -> None:
    uv_env = uvenv.venv_path(cfg.run_dir, cfg.worktree) if uvenv.is_uv(cfg.train_command) else None
    training = trainenv.versions(cfg.train_command, cfg.worktree, uv_env)  # the job's interpreter, not ours
    manifest = {
        "harness_version": __version__, "tag": cfg.tag, "branch": cfg.branch,
        "baseline_commit": base, "created_at": now_iso(), "config": cfg.to_json(),
        "python": sys.version.split()[0], "torch": training.get("torch"),
        "training_env": training, "device": device_name(),
        "agent": researcher.name, "model": pricing.resolve_model(cfg.model),
        "researcher": researcher.describe(),
        "program_sha256": hashlib.sha256(program.encode()).hexdigest(),
        "sandbox": sandbox.resolve(cfg.sandbox).mode,  # issue 13: what runs the jobs (bwrap | off)
        "sandbox_caps": sandbox.capabilities(cfg.sandbox),  # read inside the sandbox: CapEff 0 ... ({} = off)
        "protected_sha256": protected_sha256,  # the baseline's protected files: every evaluation checks them
        "agent_sandbox": sandboxed.manifest_entry(cfg, researcher),  # issue 22: what runs the researcher
    }
    ledgerguard.write_trusted(cfg.run_dir / "run.json", (json.dumps(manifest, indent=2) + "\n").encode())


def read_manifest(cfg: RunConfig) -> dict[str, Any]:
    """The run's manifest on --resume, as the harness wrote it (ledgerguard's record), or RepoError."""
    path = cfg.run_dir / "run.json"
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RepoError(f"{path} is missing. It is the run's manifest (its baseline commit and measured "
                        f"settings): restore it from a backup, or start a new run from the run's branch "
                        f"(harness run --tag NEW --from {cfg.branch}).") from None
    except (OSError, ValueError) as e:
        raise RepoError(f"{path} is unreadable ({e}). It is the run's manifest: restore it from a backup, "
                        f"or start a new run from the run's branch (harness run --tag NEW --from {cfg.branch})."
                        ) from None
    if not isinstance(data, dict):
        raise RepoError(f"{path} is not a JSON object; restore the run's manifest or move it aside.")
    ledgerguard.read_trusted(path)  # changed, or never written by the harness: refused
    return data


def trusted_baseline(cfg: RunConfig, wt: Worktree, base: str, manifest: dict[str, Any] | None) -> trust.Baseline:
    """The baseline the supervisor holds for the run: decided now (manifest None, a new run), or on
    --resume from the verified manifest and startup.json, checked against git (RepoError)."""
    if manifest is None:
        return trust.Baseline(base, trust.protected_sha256(wt.repo, base, cfg.protected), budget.DEFAULT_ALLOWANCE_S)
    hashes = manifest.get("protected_sha256")
    if not isinstance(hashes, dict) or not base:
        raise RepoError(f"{cfg.run_dir / 'run.json'} names no baseline commit or protected files' hashes (a run "
                        f"from an older harness); start a new run from it: harness run --tag NEW --from {cfg.branch}")
    problem = trust.baseline_problem(wt.repo, base, cfg.branch, hashes, cfg.protected,
                                     what=f"the run branch {cfg.branch}")
    if problem:
        raise RepoError(f"refusing to resume: {problem}. The run's trusted state does not match its branch "
                        f"{cfg.branch}; start a new run from it: harness run --tag NEW --from {cfg.branch}")
    state = trust.Baseline(base, hashes, budget.DEFAULT_ALLOWANCE_S, budget.allowance(cfg.run_dir, base),
                           budget.baseline_cpu_s(cfg.run_dir, base), budget.baseline_cpu_s(cfg.run_dir, base, "gpu_s"))
    measured = any(r.get("iteration") == 0 and r.get("status") == "keep" for r in ledger.read_rows(cfg.ledger_path))
    if measured and state.allowance_s is None:
        raise RepoError(f"{cfg.run_dir / budget.FILE} (the start-up allowance measured on the baseline) is missing "
                        f"though the baseline was measured; restore it, or start a new run from the run's branch: "
                        f"harness run --tag NEW --from {cfg.branch}")
    return state
