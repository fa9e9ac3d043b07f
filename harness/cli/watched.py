"""What the screen knows of one run (or one A/B arm): its ledger's figures, its ETA and what each
of its lanes does now, read from the run folder."""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import ledger
from ..reporting import figures


@dataclass
class Watched:
    """One run (or one A/B arm) on screen."""
    name: str  # arm name, "" for a single run
    label: str  # model (agent), the agent shortened (agent_label)
    run_dir: Path
    hours: float | None = None
    iterations: int | None = None
    lanes: int = 1
    iteration: int = 0  # the last finished iteration
    head: figures.Headline | None = None
    walls: list[float] = field(default_factory=list)  # wall_s of the experiments on the ledger
    wall_total_s: float = 0.0
    train_total_s: float = 0.0
    now: dict[Any, dict[int, str]] = field(default_factory=dict)  # lane -> iteration -> phase
    stopped: str = ""
    gpus: bool = False  # the run trains on GPUs (run.json: --gpus, an arm's GPU, or a GPU device)
    baseline_t0: float | None = None  # monotonic time the baseline started training
    baseline_runs: int = 1  # how many times it trains (--baseline-runs)
    researcher: str = ""  # the label unshortened (a cmd: template's whole command line)

    def reload(self) -> None:
        path = self.run_dir / "results.tsv"
        rows = ledger.read_rows(path)
        run = _read_json(self.run_dir / "run.json")
        manifest = run.get("config", {})
        self.gpus = bool(manifest.get("gpus") or manifest.get("gpu")) or has_gpu_device(run.get("device"))
        self.head = figures.headline(rows, ledger.metric_name(path) or "metric",
                                     manifest.get("direction", "minimize"))
        exp = figures.experiments(rows)
        self.walls = [r["wall_s"] for r in exp if r.get("wall_s")]
        if not self.walls:  # before the first experiment: the baseline's time is the best guess
            base = figures.baseline_index(rows)
            self.walls = [rows[base]["wall_s"]] if base is not None and rows[base].get("wall_s") else []
        timed = [r for r in rows if r.get("status") != "repeat"]
        self.wall_total_s = sum(r.get("wall_s") or 0.0 for r in timed)
        self.train_total_s = sum(r.get("train_s") or 0.0 for r in rows)
        done = [r.get("iteration") or 0 for r in rows if r.get("status") != "repeat"]
        self.iteration = max([self.iteration, *done])

    def mean_iteration_s(self) -> float | None:
        return statistics.fmean(self.walls[-20:]) / max(1, self.lanes) if self.walls else None

    def eta_s(self, elapsed_s: float, ab: bool) -> float | None:
        return self.eta(elapsed_s, ab)[0]

    def eta(self, elapsed_s: float, ab: bool) -> tuple[float | None, bool]:
        """(seconds left, True when only a lower bound): --hours (per arm, counted from the ledger
        in `harness ab`) or --iterations times the measured mean iteration time; the smaller when
        both are set. While the baseline trains nothing is measured yet: an iteration trains once,
        at least about as long as each of the baseline's runs has so far, so --iterations gives
        a lower bound."""
        if self.stopped:
            return 0.0, False
        options = []
        if self.hours is not None:
            spent = self.wall_total_s if ab else elapsed_s
            options.append(max(0.0, self.hours * 3600 - spent))
        mean = self.mean_iteration_s()
        if self.iterations is not None and mean is not None:
            options.append(max(0, self.iterations - self.iteration) * mean)
        elif self.iterations is not None and self.baseline_t0 is not None:
            so_far = time.monotonic() - self.baseline_t0
            bound = self.iterations * so_far / max(1, self.baseline_runs) / max(1, self.lanes)
            if not options or bound < min(options):
                return bound, True
        return (min(options), False) if options else (None, False)

    def why_no_eta(self) -> str:
        if self.hours is None and self.iterations is None:
            return "no --hours or --iterations"
        return "the baseline has not started"

    def doing(self) -> str:
        if self.stopped:
            return "stopped: " + self.stopped
        self.refine_from_journals()
        parts = []
        for lane, jobs in sorted(self.now.items(), key=lambda kv: (kv[0] is None, str(kv[0]))):
            what = ", ".join(f"{phase} iteration {it}" if it else phase for it, phase in sorted(jobs.items()))
            if what:
                parts.append(what if lane is None else f"lane {lane}: {what}")
        return "; ".join(parts) or "between iterations"

    def refine_from_journals(self) -> None:
        """A candidate whose journal says phase "train" is committed and training."""
        for path in self.run_dir.glob("inflight*.json"):
            data = _read_json(path)
            it = data.get("iteration")
            if data.get("phase") != "train" or not it:
                continue
            for jobs in self.now.values():
                if jobs.get(it) == "proposing":
                    jobs[it] = "training"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def duty_text(w: Watched) -> str:
    """The fraction of wall time spent training: what the GPUs were busy with."""
    return "-" if not w.wall_total_s else f"{w.train_total_s / w.wall_total_s:.0%}"


def has_gpu_device(device: Any) -> bool:
    """run.json's device: the first GPU's name, or `cpu (arch)` (lifecycle/manifest.py: device_name)."""
    return bool(device) and not str(device).startswith("cpu")
