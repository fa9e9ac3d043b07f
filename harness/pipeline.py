"""Keep the GPU busy: choose between the classic loop and the lane scheduler, and set lanes up.

`harness run` comes here. With one GPU and pipelining off it is the classic loop
(loop.run: propose, then train, one after the other). Otherwise lanes.Scheduler runs one
lane per GPU (--gpus), each proposing its next candidate while the current one trains
(--pipeline). See docs/pipeline.md.

Pipelining is on by default when it is safe: when the researcher cannot be slowed down by,
or slow down, the training job it overlaps, and there is latency to hide. That is the
remote researchers (openai on a non-local server, codex, claude). It is off for `mutate`
(it answers at once: nothing to hide, and the classic loop keeps its seeded sequence),
for `cmd:` researchers and for an openai server on this machine (either may be a local
model on the training GPU, which would perturb a fixed-time training budget and share a
GPU between two jobs). --pipeline / --no-pipeline override the default.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from urllib.parse import urlparse

from . import events, health, loop, recovery
from .loop import Progress, no_progress
from .agents import Researcher, make_researcher
from .config import RunConfig
from .errors import ConfigError
from .gitgate import GitGate
from .lanes import Guarded, Lane, Scheduler
from .step import Context

REMOTE_AGENTS = ("openai", "codex", "claude", "gemini")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")



def parse_gpus(gpus: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """'0,1,2,3' -> ('0', '1', '2', '3'); a GPU listed twice is refused (never two jobs on one GPU)."""
    items = gpus.split(",") if isinstance(gpus, str) else list(gpus or ())
    out = tuple(g.strip() for g in items if g.strip())
    if len(set(out)) != len(out):
        raise ConfigError(f"--gpus {gpus!r} lists a GPU twice; one lane per GPU, e.g. --gpus 0,1,2,3")
    return out


def pipeline_default(cfg: RunConfig) -> tuple[bool, str]:
    """(on?, why) for a run that did not pass --pipeline or --no-pipeline."""
    if cfg.agent == "mutate":
        return False, "the mutate researcher answers at once: there is no latency to hide"
    if cfg.agent.startswith("cmd:"):
        return False, "a cmd: researcher may run a model on the training GPU; pass --pipeline if it does not"
    if cfg.agent in ("openai", "codex", "claude", "gemini"):  # --base-url: any backend may go local
        env_url = os.environ.get("OPENAI_BASE_URL") if cfg.agent == "openai" else None
        url = cfg.agent_options.get("base_url") or env_url or ""
        if (urlparse(url).hostname or "") in LOCAL_HOSTS:
            return False, (f"the model server {url} is on this machine and may share the training GPU; "
                           f"pass --pipeline if it does not")
    if cfg.agent in REMOTE_AGENTS:
        return True, f"the {cfg.agent} researcher runs off this machine's GPU"
    return False, f"unknown researcher {cfg.agent!r}"


def pipelined(cfg: RunConfig) -> bool:
    return cfg.pipeline if cfg.pipeline is not None else pipeline_default(cfg)[0]


# ---------------------------------------------------------------------------
# Running


def make_lanes(main: Context, sched: Scheduler, gpus: tuple[str, ...], pipelined_: bool) -> list[Lane]:
    """One lane per GPU (or one lane on the inherited GPU), each with its own detached worktrees."""
    cfg, gate = main.cfg, GitGate(main.cfg.repo)
    lanes = []
    for i, gpu in enumerate(gpus or (cfg.gpu,)):
        lane_cfg = dataclasses.replace(cfg, gpu=gpu)
        slots = []
        for s in "ab"[: 2 if pipelined_ else 1]:
            wt = gate.detached_worktree(cfg.run_dir / "lanes" / f"{i}{s}", sched.state.best_commit)
            slots.append(Context(lane_cfg, wt, Guarded(main.researcher, sched), main.program_text,
                                 journal=f"inflight-{i}{s}.json"))
        lanes.append(Lane(i, slots))
    return lanes


def run(cfg: RunConfig, resume: bool = False, progress: Progress = no_progress,
        researcher: Researcher | None = None, max_steps: int | None = None) -> loop.Summary:
    """`harness run` and `harness step`: the classic loop, or lanes with pipelining."""
    gpus = parse_gpus(cfg.gpus)
    researcher = researcher or make_researcher(cfg.agent, cfg.model, cfg.agent_options)
    on = pipelined(cfg)
    if max_steps is not None or (len(gpus) <= 1 and not on):
        if gpus:
            cfg = dataclasses.replace(cfg, gpu=gpus[0])
        return loop.run(cfg, resume, progress, researcher, max_steps)
    return run_lanes(cfg, gpus, on, resume, progress, researcher)


def run_lanes(cfg: RunConfig, gpus: tuple[str, ...], pipelined_: bool, resume: bool, progress: Progress,
              researcher: Researcher) -> loop.Summary:
    with recovery.supervisor_lock(cfg.run_dir):
        return _run_lanes(cfg, gpus, pipelined_, resume, progress, researcher)


def _run_lanes(cfg: RunConfig, gpus: tuple[str, ...], pipelined_: bool, resume: bool, progress: Progress,
               researcher: Researcher) -> loop.Summary:
    start = time.monotonic()
    deadline = start + cfg.hours * 3600 if cfg.hours else None
    ctx = state = sched = None
    stopped = "done"
    events_from = events.size(cfg.run_dir)
    try:
        # The baseline trains on the first lane's GPU.
        ctx, state = loop.open_run(dataclasses.replace(cfg, gpu=gpus[0]) if gpus else cfg,
                                   resume, progress, researcher)
        sched = Scheduler(ctx, state, [], pipelined_, progress, deadline, start)
        sched.lanes = make_lanes(ctx, sched, gpus, pipelined_)
        lane0 = dataclasses.replace(ctx, cfg=sched.lanes[0].slots[0].cfg)  # its GPU trains the health re-runs
        sched.monitor = health.Monitor(lane0, state, sched.progress, events_from, lock=sched.lock)
        progress("start", {"best": state.best_value, "iteration": state.iteration,
                           "lanes": len(sched.lanes), "pipeline": pipelined_})
        stopped = sched.run()
    except KeyboardInterrupt:
        if ctx is not None:
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not tear the cleanup
            try:
                if sched is not None:
                    sched.shutdown()
                state = loop.reconcile(ctx, state.baseline_commit if state else "", retrain=False) or state
            finally:
                signal.signal(signal.SIGINT, old)
        stopped = loop.interrupted(cfg)
    return loop.summarize(cfg, state, stopped)
