"""Researcher backends behind one protocol, and the registry that builds them by name."""
from __future__ import annotations

from typing import Any

from ..errors import AgentError
from .base import Proposal, Researcher, Task, Usage

__all__ = ["Proposal", "Researcher", "Task", "Usage", "make_researcher", "BACKENDS"]

BACKENDS = ("mutate",)


def make_researcher(agent: str, model: str | None, options: dict[str, Any] | None = None) -> Researcher:
    """Build a researcher from `--agent NAME` and its options."""
    options = options or {}
    if agent == "mutate":
        from .mutate import MutateResearcher
        return MutateResearcher(model=model, **options)
    raise AgentError(f"unknown agent {agent!r}; choose one of: {', '.join(BACKENDS)}")
