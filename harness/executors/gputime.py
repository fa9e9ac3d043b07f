"""A GPU job's GPU time, by the driver's own accounting (NVML, through nvidia-ml-py's `pynvml`).

Sampled while the job runs, every GPU_EVERY_S, on the devices the job may use (its
CUDA_VISIBLE_DEVICES, by index or UUID; unset: every device): how busy each device was
(`nvmlDeviceGetUtilizationRates`, the share of the last sample period a kernel ran) and which
processes ran its kernels (`nvmlDeviceGetProcessUtilization`, SM use per pid). The busy time is
split between the job's own processes (its cgroup, which holds its whole tree) and everyone
else's by their SM use: `gpu_s` is the job's GPU time, `others_s` what other work held the same
devices meanwhile. integrity/budget.py judges a GPU job past its wall limit by them, as it judges a CPU
job by its CPU time: slowed by another's kernels, not by its own extra work.

Where NVML cannot say (no driver, no pynvml, a device that does not report per-process use)
both figures are None and the reason is kept: such a job is judged by the wall clock alone.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable

GPU_EVERY_S = 1.0  # s between samples


def _nvml() -> Any:
    import pynvml  # nvidia-ml-py: a core dependency, pure Python; the driver's library is loaded by nvmlInit
    return pynvml


class GpuTime:
    """The job's GPU seconds and other processes' on its devices; sample() from the job's poll loop."""

    def __init__(self, visible: str | None, pids: Callable[[], set[int]]):
        self.pids, self.gpu_s, self.others_s, self.why = pids, None, None, ""
        self.handles: list[Any] = []
        self.last_us: dict[int, int] = {}
        self.next_s, self.prev_s = 0.0, time.monotonic()  # the job starts now
        try:
            nv = self.nv = _nvml()
            nv.nvmlInit()
        except Exception as e:  # no pynvml, no driver: not measured
            self.why = f"NVML is not available ({type(e).__name__}: {e})"
            return
        try:
            names = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else \
                [str(i) for i in range(nv.nvmlDeviceGetCount())]
            for name in names:
                self.handles.append(nv.nvmlDeviceGetHandleByIndex(int(name)) if name.isdigit()
                                    else nv.nvmlDeviceGetHandleByUUID(name))
        except Exception as e:
            self.why, self.handles = f"NVML could not open the job's devices {visible!r} ({e})", []
        if self.handles:
            self.gpu_s, self.others_s = 0.0, 0.0

    def sample(self, now: float, last: bool = False) -> None:
        """One sample every GPU_EVERY_S (last: the one at the job's exit), covering the time since
        the one before."""
        if not self.handles or (now < self.next_s and not last):
            return
        self.next_s = now + GPU_EVERY_S
        dt, self.prev_s = now - self.prev_s, now
        mine = self.pids()
        nv = self.nv
        for i, handle in enumerate(self.handles):
            try:
                busy = nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
                try:
                    samples = nv.nvmlDeviceGetProcessUtilization(handle, self.last_us.get(i, 0))
                except nv.NVMLError_NotFound:  # no kernel ran since the last sample
                    samples = []
            except Exception as e:  # a device that does not report per-process use: not measured
                self.why, self.handles, self.gpu_s, self.others_s = f"NVML could not sample the GPU ({e})", [], None, None
                return
            own = sum(s.smUtil for s in samples if s.pid in mine)
            total = sum(s.smUtil for s in samples)
            if samples:
                self.last_us[i] = max(s.timeStamp for s in samples)
            share = own / total if total else (1.0 if busy and not samples else 0.0)
            self.gpu_s += busy * dt * share
            self.others_s += busy * dt * (1.0 - share)

    def close(self) -> None:
        """The last sample (up to the job's exit), then NVML let go."""
        self.sample(time.monotonic(), last=True)
        if hasattr(self, "nv") and not self.why.startswith("NVML is not available"):
            with contextlib.suppress(Exception):
                self.nv.nvmlShutdown()


def cgroup_pids(procs_files: list[str], fallback: int) -> Callable[[], set[int]]:
    """The job's processes: its cgroup's (its whole tree, host pids), else the job's leader."""
    def pids() -> set[int]:
        out: set[int] = set()
        for path in procs_files:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in Path(path).read_text().split())
        return out or {fallback}
    return pids
