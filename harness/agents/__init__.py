"""Researcher backends behind one protocol, and the registry that builds them by name."""
from __future__ import annotations

from typing import Any

from . import pricing
from ..errors import AgentError
from .base import ERROR_KINDS, KEY_VARS, Proposal, Researcher, Task, Usage

__all__ = ["ERROR_KINDS", "KEY_VARS", "Proposal", "Researcher", "Task", "Usage", "make_researcher", "BACKENDS",
           "routing_mismatch"]

BACKENDS = ("mutate", "openai", "codex", "claude", "gemini", "cmd:TEMPLATE")

# The options each backend accepts (from the CLI's agent options, minus the general ones).
CLI_OPTIONS = {"executable", "agent_args", "base_url"}  # --agent-executable, --agent-arg, --base-url
BACKEND_OPTIONS: dict[str, set[str]] = {
    "mutate": {"seed"},
    "openai": {"wire_api", "base_url", "api_key", "temperature", "reasoning_effort",
               "request_timeout", "max_retries", "repair_turns"},
    "codex": {"reasoning_effort", "wire_api"} | CLI_OPTIONS,
    "claude": set(CLI_OPTIONS),
    "gemini": set(CLI_OPTIONS),
    "cmd": {"agent_args"},
}



def backend_kind(agent: str) -> str:
    return "cmd" if agent.startswith("cmd:") else agent
GENERAL_OPTIONS = {"prices", "force"}  # for the price table and the resume check, not the backend


def make_researcher(agent: str, model: str | None, options: dict[str, Any] | None = None) -> Researcher:
    """Build a researcher from `--agent NAME`, the model (an alias is resolved) and its options."""
    options = {k: v for k, v in (options or {}).items() if v is not None}
    prices = options.pop("prices", None)
    options.pop("force", None)
    if prices:
        pricing.set_prices_file(prices)
    model = pricing.resolve_model(model)
    kind = backend_kind(agent)
    if kind not in BACKEND_OPTIONS:
        raise AgentError(f"unknown agent {agent!r}; choose one of: {', '.join(BACKENDS)}")
    unsupported = sorted(set(options) - BACKEND_OPTIONS[kind])
    if unsupported:
        flags = {"executable": "--agent-executable", "agent_args": "--agent-arg"}
        names = ", ".join(flags.get(name, "--" + name.replace("_", "-")) for name in unsupported)
        raise AgentError(f"{names} does not apply to --agent {kind}; drop it.")
    if kind == "mutate":
        from .mutate import MutateResearcher
        return MutateResearcher(model=model, **options)
    if kind == "openai":
        from .openai_api import OpenAIResearcher
        return OpenAIResearcher(model, **options)
    if kind == "codex":
        from .codex import CodexResearcher
        return CodexResearcher(model, **options)
    if kind == "claude":
        from .claude import ClaudeResearcher
        return ClaudeResearcher(model, **options)
    if kind == "gemini":
        from .gemini import GeminiResearcher
        return GeminiResearcher(model, **options)
    from .command import CommandResearcher
    return CommandResearcher(agent[len("cmd:"):], model, **options)


# What says where the researcher goes, and which CLI goes there: a resume with another value is
# refused. Keys that an older manifest lacks are not compared (it could not record them).
ROUTING_KEYS = ("provider", "base_url", "base_url_host", "key_var", "key_fingerprint", "cli_version")


def routing_mismatch(manifest: dict[str, Any], agent: str, model: str | None,
                     describe: dict[str, Any]) -> list[str]:
    """How a resumed run's routing differs from its manifest: backend, model, base URL, key."""
    if not manifest:
        return []
    old = manifest.get("researcher") or {}
    pairs = [("backend", manifest.get("agent"), agent), ("model", manifest.get("model"), model)]
    pairs += [(key.replace("_", " "), old.get(key), describe.get(key)) for key in ROUTING_KEYS
              if key in old or key in ("base_url", "key_fingerprint")]
    return [f"{name} {before!r} -> {now!r}" for name, before, now in pairs if before != now]
