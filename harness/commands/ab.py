"""`harness ab`: researcher arms (two or more) from the same baseline commit, then the report.

Two arms by default (`--model-a/--model-b`), or any number (`--arm NAME=AGENT[:MODEL]`, arms.py),
each run `--repeats R` times with different seeds: a tournament. A unit (one arm's run for one
repeat) is an ordinary run under runs/<tag>/<arm> (or runs/<tag>/<arm>-r<k> with repeats).

Each arm is an ordinary run (its own branch `autoresearch/<tag>-<arm>`, worktree and ledger
under runs/<tag>/<arm>/) driven by the one run driver (driver/), over one executor whose
slots are the GPUs. Schedules:

- interleave: A, B, A, B, ... on one GPU, so both arms see the same machine (a GPU's speed
  drifts over a night) and get the same GPU time; the default on one GPU.
- sequential: arm A until it stops, then arm B (the classic).
- parallel: both arms at once, one GPU each (an executor with a slot per GPU); the default with
  `--executor ray`, where each arm's jobs go to the cluster's slots.

--hours and --iterations are per arm. --hours is the arm's own elapsed time (the time it was
being driven, carried across --resume), so interleaved arms, driven side by side, end together
after about --hours of wall clock with half of the GPU each.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ledger import atomic
from ..driver import loop as driver, pipeline
from ..driver.lanes import Turns
from ..driver.printer import safe
from ..driver.rundriver import RunDriver
from ..driver.signals import Interrupted
from ..agents import pricing
from ..lifecycle import runs
from ..reporting import report
from ..agents import Researcher, make_researcher
from .arms import ArmSpec
from ..config import RunConfig
from ..config.load import resolve
from ..errors import ConfigError, RepoError
from ..gitgate import GitGate
from ..lifecycle.runs import Progress, no_progress
from ..driver.step import now_iso

SCHEDULES = ("interleave", "sequential", "parallel")
ARMS = ("a", "b")


REPEAT_SEED_STEP = 1000  # repeat k trains (and the mutate researcher draws) with seed + k * this


@dataclass
class Arm:
    name: str  # the unit: the arm, or <arm>-r<k> with repeats
    cfg: RunConfig
    researcher: Researcher | None = None
    spec: ArmSpec | None = None
    repeat: int = 0


@dataclass
class ABResult:
    tag: str
    run_dir: Path
    schedule: str
    summaries: dict[str, runs.Summary] = field(default_factory=dict)
    report: report.Report | None = None
    stopped: str = "done"
    interrupted: Interrupted | None = None


# ---------------------------------------------------------------------------
# Set-up


def parse_gpus(gpus: str | None) -> list[str]:
    """'0,1' -> ['0', '1']; None or '' -> []."""
    out = [g.strip() for g in (gpus or "").split(",") if g.strip()]
    if len(set(out)) != len(out):
        raise ConfigError(f"--gpus {gpus!r} lists a GPU twice; give one GPU per arm, e.g. --gpus 0,1")
    return out


def choose_schedule(schedule: str | None, gpus: list[str], executor: str = "local") -> str:
    """The arms' schedule; on a Ray cluster the arms run side by side by default (the cluster's slots)."""
    schedule = schedule or ("parallel" if len(gpus) >= 2 or executor == "ray" else "interleave")
    if schedule not in SCHEDULES:
        raise ConfigError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "parallel" and len(gpus) < 2 and executor != "ray":
        raise ConfigError("--schedule parallel runs one arm per GPU: pass two GPUs, e.g. --gpus 0,1 "
                          "(or use --schedule interleave on one GPU)")
    return schedule


def arm_gpu(gpus: list[str], index: int) -> str | None:
    if not gpus:
        return None
    return gpus[index] if index < len(gpus) else gpus[0]


def baseline_commit(repo: Path, from_rev: str | None, editable: tuple[str, ...],
                    protected: tuple[str, ...]) -> str:
    """Resolve --from once, so both arms start from exactly the same commit."""
    gate = GitGate(repo)
    if from_rev in (None, "HEAD"):
        dirty = gate.dirty_files((*editable, *protected))
        if dirty:
            raise RepoError("uncommitted changes in " + ", ".join(dirty) + ": commit or stash them "
                            "first, so both arms' baseline is exactly what you see.")
    return gate.require_commit(from_rev or "HEAD")


def specs_of(arms: dict[str, tuple[str | None, str | None]] | list[ArmSpec]) -> list[ArmSpec]:
    """The arms as specs: `--model-a/--model-b`'s {name: (agent, model)}, or `--arm` specs."""
    if isinstance(arms, dict):
        return [ArmSpec(name, *(arms.get(name) or (None, None))) for name in (arms or dict.fromkeys(ARMS))]
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ConfigError(f"arm names must differ: {', '.join(names)}")
    if len(arms) < 2:
        raise ConfigError("a comparison needs at least two arms: pass --arm twice or more")
    return list(arms)


def unit_name(arm: str, repeat: int, repeats: int) -> str:
    return arm if repeats == 1 else f"{arm}-r{repeat + 1}"


def arm_configs(repo: Path, tag: str, specs: list[ArmSpec], overrides: dict[str, Any], base: str,
                gpus: list[str], repeats: int = 1, seed: int = 42) -> dict[str, tuple[ArmSpec, int, RunConfig]]:
    run_dir = Path(repo).resolve() / "runs" / tag
    out = {}
    for i, spec in enumerate(specs):
        for k in range(repeats):
            unit = unit_name(spec.name, k, repeats)
            options = dict(spec.options)
            unit_seed = options.pop("seed", seed) + k * REPEAT_SEED_STEP
            agent_options = {**(overrides.get("agent_options") or {}), **options} or None
            cfg = resolve(repo, f"{tag}-{unit}", {
                **overrides, "agent": spec.agent or overrides.get("agent"), "model": spec.model or overrides.get("model"),
                "arm": spec.name, "from_rev": base, "run_root": run_dir / unit, "gpu": arm_gpu(gpus, i),
                "seed": unit_seed, "agent_options": agent_options, "repeat": k + 1 if repeats > 1 else None})
            out[unit] = (spec, k, cfg)
    return out


def write_setup(run_dir: Path, tag: str, base: str, schedule: str, gpus: list[str],
                arms: dict[str, Arm]) -> None:
    """runs/<tag>/ab.json: what was compared, how (kept from the first start across resumes)."""
    path = run_dir / "ab.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    setup = {
        "tag": tag, "repo": str(next(iter(arms.values())).cfg.repo), "baseline_commit": base,
        "schedule": schedule, "gpus": gpus, "created_at": old.get("created_at", now_iso()),
        "resumed_at": old.get("resumed_at", []) + ([now_iso()] if old else []),
        "repeats": max(arm.repeat for arm in arms.values()) + 1,
        "arms": {name: {
            "arm": arm.cfg.arm, "repeat": arm.repeat + 1, "seed": arm.cfg.seed,
            "agent": arm.cfg.agent, "researcher": arm.researcher.name if arm.researcher else arm.cfg.agent,
            "model": pricing.resolve_model(arm.cfg.model), "branch": arm.cfg.branch,
            "options": {k: v for k, v in (arm.spec.options if arm.spec else {}).items()},
            "ledger": str(arm.cfg.ledger_path.relative_to(run_dir)), "gpu": arm.cfg.gpu,
            "hours": arm.cfg.hours, "iterations": arm.cfg.iterations,
        } for name, arm in arms.items()},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic.atomic_write(path, json.dumps(setup, indent=2) + "\n")


def old_specs(old: dict[str, Any]) -> list[ArmSpec]:
    """The arms of an A/B run being resumed, from its ab.json."""
    seen: dict[str, ArmSpec] = {}
    for unit, arm in old["arms"].items():
        name = arm.get("arm") or unit
        if name not in seen:
            options = dict(arm.get("options") or {})
            seen[name] = ArmSpec(name, arm["agent"], arm.get("model"), options)
    return list(seen.values())


# ---------------------------------------------------------------------------
# The launcher


def run_ab(repo: Path, tag: str, arms: dict[str, tuple[str | None, str | None]] | list[ArmSpec],
           schedule: str | None = None, gpus: str | None = None, resume: bool = False,
           overrides: dict[str, Any] | None = None, progress: Progress = no_progress,
           researchers: dict[str, Researcher] | None = None, write_report: bool = True,
           repeats: int | None = None) -> ABResult:
    """Run the arms ({name: (agent, model)}, or specs) from the same baseline commit, each
    `repeats` times, then write the report.

    overrides are per-arm RunConfig settings (hours and iterations are per arm).
    researchers injects ready researcher objects by unit or arm name (tests, custom backends).
    """
    repo = Path(repo).resolve()
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    run_dir = repo / "runs" / tag
    setup_path = run_dir / "ab.json"
    old = json.loads(setup_path.read_text()) if setup_path.exists() else None
    if old is not None and not resume:
        raise RepoError(f"{run_dir} already holds an A/B run: pass --resume to continue it, "
                        f"or choose another --tag.")
    if old is None and resume:
        raise RepoError(f"nothing to resume: {setup_path} does not exist. Drop --resume.")
    gpu_list = parse_gpus(gpus) if gpus is not None or old is None else list(old.get("gpus", []))
    probe = resolve(repo, f"{tag}-a", {k: v for k, v in overrides.items()
                                       if k not in ("hours", "iterations", "max_tokens", "max_cost")})
    schedule = choose_schedule(schedule or (old or {}).get("schedule"), gpu_list, probe.executor)
    base = old["baseline_commit"] if old else baseline_commit(
        repo, overrides.get("from_rev"), probe.editable, probe.protected)
    if old:  # an arm's agent, model and options cannot change under --resume
        specs = old_specs(old)
        repeats = old.get("repeats", 1)
    else:
        specs = specs_of(arms)
        repeats = repeats or 1
        if repeats < 1:
            raise ConfigError(f"--repeats must be at least 1, got {repeats}")
    cfgs = arm_configs(repo, tag, specs, overrides, base, gpu_list, repeats, probe.seed)
    researchers = researchers or {}
    pool = {}
    for unit, (spec, k, cfg) in cfgs.items():
        researcher = researchers.get(unit) or researchers.get(spec.name) or make_researcher(
            cfg.agent, cfg.model, cfg.agent_options)
        pool[unit] = Arm(unit, cfg, researcher, spec, k)
    result = ABResult(tag, run_dir, schedule)
    cancel = threading.Event()  # one stop for both arms
    arms_ = []
    for i, arm in enumerate(pool.values()):
        # An arm whose branch was never made (stopped before it started) starts fresh on --resume.
        resume_arm = resume and GitGate(arm.cfg.repo).branch_exists(arm.cfg.branch)
        arms_.append(RunDriver(arm.cfg, arm.researcher, resume_arm, safe(progress), 1,
                                      pipeline.pipelined(arm.cfg), cancel))
    if schedule == "interleave":
        turns = Turns(len(arms_))
        for i, r in enumerate(arms_):
            r.turns, r.turn_index = turns, i
    slots = tuple(gpu_list[:len(arms_)]) if schedule == "parallel" else tuple(gpu_list[:1])
    summaries, result.interrupted = driver.run_all(
        run_dir, repo, arms_, slots, "sequential" if schedule == "sequential" else "together",
        locks=tuple(arm.cfg.run_dir for arm in pool.values()),
        on_locked=lambda: write_setup(run_dir, tag, base, schedule, gpu_list, pool))
    if result.interrupted is not None:
        result.stopped = f"interrupted ({result.interrupted.why}); continue with --resume"
    for name, summary in zip(pool, summaries):
        result.summaries[name] = summary
    if write_report:
        result.report = report.build([run_dir])
    return result
