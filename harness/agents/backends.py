"""Which researcher backend runs a model: `--model M` without `--agent` picks one.

models.toml's [backends] table lists, per model, the backends that serve it in order of
preference; the first one usable on this machine is chosen. `mutate` (the offline researcher)
runs no model, so `--model` with it is refused rather than silently ignored.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable

from . import pricing
from ..errors import ConfigError

HOW_TO_ENABLE = {
    "codex": "install the codex CLI (npm install -g @openai/codex) and log in",
    "claude": "install the claude CLI (npm install -g @anthropic-ai/claude-code) and log in",
    "gemini": "install the gemini CLI (npm install -g @google/gemini-cli) and set GEMINI_API_KEY or log in",
    "openai": "set OPENAI_API_KEY (or pass --base-url for a local server)",
}


def usable(backend: str, options: dict[str, Any] | None = None,
           which: Callable[[str], str | None] = shutil.which) -> bool:
    """Can this backend run here: its CLI on PATH (or --agent-executable), or an API key / base URL for openai."""
    if backend in ("codex", "claude", "gemini"):
        executable = (options or {}).get("executable")
        return which(executable or backend) is not None
    if backend == "openai":
        return bool(os.environ.get("OPENAI_API_KEY") or (options or {}).get("base_url"))
    return False


def pick(agent: str | None, model: str | None, options: dict[str, Any] | None = None,
         flag: str = "--model") -> tuple[str | None, str | None]:
    """(the agent to run, a note saying what was chosen, or None). Raises ConfigError when a
    model is named with the offline researcher, or when no backend for it is usable here."""
    if model is None:
        return agent, None
    resolved = pricing.resolve_model(model)
    served = pricing.backends_for(model)
    serves = f" (models.toml: {resolved} is served by {', '.join(served)})" if served else ""
    if agent == "mutate":
        raise ConfigError(f"{flag} {model} does not apply to --agent mutate: the offline researcher runs no "
                          f"model. Pass the researcher that runs it, e.g. --agent "
                          f"{served[0] if served else 'openai'}{serves}, or drop {flag}.")
    if agent is not None:
        return agent, None
    if not served:
        raise ConfigError(f"{flag} {model}: models.toml does not say which researcher serves {resolved}. "
                          f"Pass --agent openai, codex, claude, gemini or cmd:TEMPLATE (or add it to [backends] "
                          f"in a --prices file).")
    for backend in served:
        if usable(backend, options):
            return backend, (f"{flag} {model}: researcher {backend} (the first usable of "
                             f"{', '.join(served)}; pass --agent to choose another)")
    needs = "; or ".join(HOW_TO_ENABLE.get(b, b) for b in served)
    raise ConfigError(f"{flag} {model}: none of its researchers ({', '.join(served)}) is usable here: {needs}. "
                      f"Or pass --agent explicitly.")
