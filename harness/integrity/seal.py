"""Sealed results: the metric comes from the workload's protected code, not from what train.py prints.

For every training job the harness draws a fresh random key and hands it to the job through
a pipe (`HARNESS_SEAL_FD`): the key never appears in an environment variable (so not in
`/proc/self/environ` either), and a pipe can be read once: `prepare.py` reads it at import,
before train.py's own code after the import line runs. `prepare.report()` signs its JSON
(HMAC-SHA256 over the canonical JSON of the figures) into `HARNESS_RESULT_FILE`.

For a sealed workload the harness takes the figures only from a result file whose seal
verifies; the `---` block on stdout must agree with it. Workloads without a sealing
prepare.py (`sealed = false`, or auto-detected) fall back to the stdout block, and their rows
are marked unsealed in the ledger. In both cases `training_seconds` more than 5% over the
budget makes the run `invalid`.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import os
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

from ..workload.runner import TrainResult

BUDGET_TOLERANCE = 0.05  # training_seconds may exceed the budget by this fraction (the last step)
MARKER = b"HARNESS_SEAL"  # a protected file that mentions it speaks the seal protocol
HARNESS_ONLY_ENV = ("HARNESS_SEAL_KEY", "HARNESS_SEAL_FD", "HARNESS_FAULT")  # never inherited by a job


def enabled(setting: bool | None, worktree: Path, protected: tuple[str, ...]) -> bool:
    """`sealed = true|false` in the settings, or (unset) whether a protected .py file can seal."""
    if setting is not None:
        return setting
    for path in protected:
        if path.endswith(".py"):
            try:
                if MARKER in (Path(worktree) / path).read_bytes():
                    return True
            except OSError:
                continue
    return False


@dataclass
class Channel:
    key: str | None  # None: an unsealed workload
    env: dict[str, str] = field(default_factory=dict)
    fds: tuple[int, ...] = ()


@contextlib.contextmanager
def channel(sealed: bool) -> Iterator[Channel]:
    """A fresh key in a pipe whose read end the job inherits; closed here afterwards."""
    if not sealed:
        yield Channel(None)
        return
    key = secrets.token_hex(32)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, key.encode())
    finally:
        os.close(write_end)  # the job reads the key, then end of file
    try:
        yield Channel(key, {"HARNESS_SEAL_FD": str(read_end)}, (read_end,))
    finally:
        os.close(read_end)


def job_env(env: dict[str, str], ch: Channel) -> dict[str, str]:
    """The job's environment: the harness's own control variables removed, the channel's added."""
    out = {k: v for k, v in env.items() if k not in HARNESS_ONLY_ENV}
    out.update(ch.env)
    return out


def signature(key: str, figures: dict) -> str:
    canonical = json.dumps(figures, sort_keys=True, separators=(",", ":"))
    return hmac.new(key.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def judge(result: TrainResult, result_file: Path, key: str | None, metric: str,
          time_budget_s: float) -> TrainResult:
    """The run's final status and figures: the sealed result checked, then the budget."""
    if result.status == "timeout":
        return result
    data = _read(result_file)
    if data is not None and "refused" in data:
        return replace(result, status="invalid", sealed=key is not None,
                       reason=f"prepare.py refused to report: {str(data['refused'])[:400]}")
    if key is None:
        result = replace(result, sealed=False)
    elif result.returncode not in (0, None):
        return replace(result, sealed=True)  # a crash stays a crash
    else:
        result = _sealed(result, result_file, data, key, metric)
        if result.status != "ok":
            return result
    seconds = result.metrics.get("training_seconds")
    limit = time_budget_s * (1 + BUDGET_TOLERANCE)
    if result.status == "ok" and isinstance(seconds, float) and seconds > limit:
        return replace(result, status="invalid",
                       reason=f"training_seconds {seconds:.1f} is over the {time_budget_s:g}s budget by more "
                              f"than {BUDGET_TOLERANCE:.0%}: stop training when the budget is spent")
    return result


def _sealed(result: TrainResult, result_file: Path, data: dict | None, key: str, metric: str) -> TrainResult:
    def invalid(reason: str) -> TrainResult:
        return replace(result, status="invalid", sealed=True, reason=reason)

    if data is None:
        return invalid(f"no sealed result: prepare.report() did not write {result_file.name}; the "
                       f"{metric} must come from prepare.py's evaluate_bpb and report(), not from print()")
    figures = dict(data)
    seal = figures.pop("seal", None)
    if not isinstance(seal, str) or not hmac.compare_digest(seal, signature(key, figures)):
        return invalid(f"the result file's seal does not verify: {result_file.name} was written or edited "
                       f"outside prepare.report()")
    metrics = {k: float(v) for k, v in figures.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    value = metrics.get(metric)
    if value is None or math.isnan(value) or math.isinf(value):
        return replace(result, status="crash", sealed=True, reason=f"the sealed result has no finite {metric}")
    printed = result.metrics.get(metric)
    if isinstance(printed, float) and abs(printed - value) > 1e-6 * max(1.0, abs(value)):
        return invalid(f"the printed {metric} ({printed:g}) differs from the sealed result ({value:g}); "
                       f"results are reported by prepare.report() only")
    return replace(result, status="ok", metrics=metrics, sealed=True, reason="")


def cell(result: TrainResult | None) -> str:
    """The ledger's `sealed` column: yes, no, or empty when nothing was trained."""
    if result is None or result.sealed is None:
        return ""
    return "yes" if result.sealed else "no"
