"""Tournament arm specs: `--arm NAME=AGENT[:MODEL][,KEY=VALUE...]`, parsed by pure functions.

    --arm control=mutate,seed=2
    --arm high=codex:gpt-5.4,reasoning_effort=high
    --arm local=openai:qwen3,base_url=http://127.0.0.1:8000/v1,wire_api=chat
    --arm script=cmd:python propose.py --model {model},agent_timeout=600

A `cmd:` agent's template runs to the end of the spec (it may hold ':' and ','), except for
trailing `,KEY=VALUE` pieces whose KEY is an option the arm accepts. Other agents split the
part after NAME= on ',' and then on the first ':' (AGENT:MODEL).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..agents import BACKEND_OPTIONS, BACKENDS
from ..errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
# Options any arm takes, whatever its backend: the price table, the researcher's hard timeout.
ARM_GENERAL_OPTIONS = {"prices", "agent_timeout"}
# Never on a command line: keys are looked up from the environment, not passed in argv.
SECRET_OPTIONS = {"api_key"}
INT_OPTIONS = {"seed", "max_retries", "repair_turns"}
FLOAT_OPTIONS = {"temperature", "request_timeout", "agent_timeout"}
CHOICES = {"wire_api": ("responses", "chat")}


@dataclass(frozen=True)
class ArmSpec:
    name: str
    agent: str  # mutate, openai, codex, claude, or cmd:TEMPLATE
    model: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "cmd" if self.agent.startswith("cmd:") else self.agent


def allowed_options(kind: str) -> set[str]:
    return (BACKEND_OPTIONS.get(kind, set()) | ARM_GENERAL_OPTIONS) - SECRET_OPTIONS


def _typed(spec: str, key: str, raw: str) -> Any:
    if raw == "":
        raise ConfigError(f"--arm {spec!r}: option {key} has no value; write {key}=VALUE.")
    try:
        if key in INT_OPTIONS:
            return int(raw)
        if key in FLOAT_OPTIONS:
            return float(raw)
    except ValueError:
        kind = "a whole number" if key in INT_OPTIONS else "a number"
        raise ConfigError(f"--arm {spec!r}: {key}={raw!r} must be {kind}.") from None
    if key in CHOICES and raw not in CHOICES[key]:
        raise ConfigError(f"--arm {spec!r}: {key} must be one of {', '.join(CHOICES[key])}, not {raw!r}.")
    return raw


def _split_options(spec: str, kind: str, body: str) -> tuple[str, list[str]]:
    """(the agent part, the KEY=VALUE pieces) of what follows NAME=."""
    if kind != "cmd":
        head, *pieces = body.split(",")
        return head, pieces
    keys = "|".join(sorted(allowed_options("cmd"), key=len, reverse=True))
    head, *pieces = re.split(rf",(?=(?:{keys})=)", body)
    return head, pieces


def parse_arm(spec: str) -> ArmSpec:
    """One `NAME=AGENT[:MODEL][,KEY=VALUE...]` spec; ConfigError says what is wrong and how to write it."""
    usage = "write NAME=AGENT[:MODEL][,KEY=VALUE...], e.g. high=codex:gpt-5.4,reasoning_effort=high"
    name, sep, body = spec.partition("=")
    name, body = name.strip(), body.strip()
    if not sep or not body:
        raise ConfigError(f"--arm {spec!r}: no agent after the name; {usage}.")
    if not NAME_RE.match(name):
        raise ConfigError(f"--arm {spec!r}: the name {name!r} must be letters, digits, '.', '_' or '-' "
                          f"(at most 32, starting with a letter or digit); {usage}.")
    kind = "cmd" if body.startswith("cmd:") else body.split(",")[0].split(":")[0]
    if kind not in BACKEND_OPTIONS:
        raise ConfigError(f"--arm {spec!r}: unknown agent {kind!r}; choose one of: {', '.join(BACKENDS)}.")
    head, pieces = _split_options(spec, kind, body)
    if kind == "cmd":
        agent, model = head, None
        if not head[len("cmd:"):].strip():
            raise ConfigError(f"--arm {spec!r}: cmd: needs a command template, e.g. x=cmd:python propose.py.")
    else:
        agent, _, model = head.partition(":")
        model = model.strip() or None
    options: dict[str, Any] = {}
    allowed = allowed_options(kind)
    for piece in pieces:
        key, eq, raw = piece.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise ConfigError(f"--arm {spec!r}: {piece!r} is not KEY=VALUE; {usage}.")
        if key in SECRET_OPTIONS:
            raise ConfigError(f"--arm {spec!r}: keys never go on the command line; set the environment "
                              f"variable (e.g. OPENAI_API_KEY) instead.")
        if key not in allowed:
            raise ConfigError(f"--arm {spec!r}: option {key!r} does not apply to agent {kind}; it takes: "
                              f"{', '.join(sorted(allowed)) or 'no options'}.")
        if key in options:
            raise ConfigError(f"--arm {spec!r}: option {key} given twice.")
        options[key] = _typed(spec, key, raw.strip())
    return ArmSpec(name=name, agent=agent.strip(), model=model, options=options)


def parse_arms(specs: list[str] | tuple[str, ...]) -> list[ArmSpec]:
    """Every `--arm`, in order; names must be unique (they name the arms' folders and branches)."""
    arms = [parse_arm(s) for s in specs]
    seen: dict[str, str] = {}
    for spec, arm in zip(specs, arms):
        if arm.name in seen:
            raise ConfigError(f"--arm {spec!r}: the name {arm.name!r} is already used by --arm {seen[arm.name]!r}; "
                              f"give every arm its own name.")
        seen[arm.name] = spec
    return arms
