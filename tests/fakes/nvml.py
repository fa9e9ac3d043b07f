"""A stand-in for nvidia-ml-py's `pynvml` (this machine has no GPU and no driver): the calls
executors/gputime.py makes, with the real names, structures and errors. The test sets what the
"GPU" is doing: how busy each device is, and the SM use of the job's processes (every process
below this one, found as the driver would see them) and of one other process (another user's).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

OTHER_PID = 4_000_000  # another user's job on the same GPU (no such process here)


class NVMLError(Exception):
    pass


class NVMLError_NotFound(NVMLError):
    pass


@dataclass
class Utilization:  # c_nvmlUtilization_t
    gpu: int
    memory: int = 0


@dataclass
class ProcessSample:  # c_nvmlProcessUtilizationSample_t
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0


class FakeNvml:
    """Install with monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(...)); change `own_sm` and
    `others_sm` (0-100) while a job runs. The device is busy by their sum (at most 100)."""
    NVMLError, NVMLError_NotFound = NVMLError, NVMLError_NotFound

    def __init__(self, devices: int = 1, own_sm: int = 100, others_sm: int = 0):
        self.devices, self.own_sm, self.others_sm = devices, own_sm, others_sm
        self.opened: list[int] = []
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.devices:
            raise NVMLError(f"Invalid Argument: no device {index}")
        self.opened.append(index)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        raise NVMLError(f"Not Found: {uuid}")

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Utilization:
        return Utilization(min(100, self.own_sm + self.others_sm))

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen_us: int) -> list[ProcessSample]:
        stamp = int(time.time() * 1e6)
        mine = [p.pid for p in psutil.Process(os.getpid()).children(recursive=True)]
        samples = [ProcessSample(pid, stamp, self.own_sm // max(1, len(mine))) for pid in mine if self.own_sm]
        if self.others_sm:
            samples.append(ProcessSample(OTHER_PID, stamp, self.others_sm))
        if not samples:
            raise NVMLError_NotFound("Not Found")
        return samples
