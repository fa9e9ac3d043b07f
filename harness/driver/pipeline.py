"""When to pipeline (propose the next candidate while one trains), and the lanes' GPUs.

Pipelining is on by default when it is safe: when the researcher cannot be slowed down by,
or slow down, the training job it overlaps, and there is latency to hide. That is the
remote researchers (openai on a non-local server, codex, claude). It is off for `mutate`
(it answers at once: nothing to hide, and one lane keeps its seeded sequence), for `cmd:`
researchers and for an openai server on this machine (either may be a local model on the
training GPU, which would perturb a fixed-time training budget and share a GPU between two
jobs). --pipeline / --no-pipeline override the default. See docs/pipeline.md.
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

from ..config import RunConfig
from ..errors import ConfigError

REMOTE_AGENTS = ("openai", "codex", "claude", "gemini")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def parse_gpus(gpus: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """'0,1,2,3' -> ('0', '1', '2', '3'); a GPU listed twice is refused (never two jobs on one GPU)."""
    items = gpus.split(",") if isinstance(gpus, str) else list(gpus or ())
    out = tuple(g.strip() for g in items if g.strip())
    if len(set(out)) != len(out):
        raise ConfigError(f"--gpus {gpus!r} lists a GPU twice; one job per GPU, e.g. --gpus 0,1,2,3")
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
