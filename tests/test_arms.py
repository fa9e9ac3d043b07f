"""Tournament arm specs (`--arm NAME=AGENT[:MODEL][,KEY=VALUE...]`): pure parsing, typed options,
errors that say how to write the spec."""
from __future__ import annotations

import pytest

from harness.commands.arms import ArmSpec, parse_arm, parse_arms
from harness.errors import ConfigError


@pytest.mark.parametrize("spec, expected", [
    ("control=mutate", ArmSpec("control", "mutate")),
    ("control=mutate,seed=2", ArmSpec("control", "mutate", None, {"seed": 2})),
    ("high=codex:gpt-5.4,reasoning_effort=high", ArmSpec("high", "codex", "gpt-5.4", {"reasoning_effort": "high"})),
    ("fast=claude:sonnet", ArmSpec("fast", "claude", "sonnet")),
    ("local=openai:qwen3,base_url=http://127.0.0.1:8000/v1,wire-api=chat,temperature=0.2,max_retries=1",
     ArmSpec("local", "openai", "qwen3", {"base_url": "http://127.0.0.1:8000/v1", "wire_api": "chat",
                                          "temperature": 0.2, "max_retries": 1})),
    # A model name may hold ':' after the first one (provider-style ids).
    ("r=openai:org/model:v2", ArmSpec("r", "openai", "org/model:v2")),
    # A cmd: template keeps its ':' and ',' up to the first option the arm takes.
    ("script=cmd:python p.py --x a,b --m {model},agent_timeout=600",
     ArmSpec("script", "cmd:python p.py --x a,b --m {model}", None, {"agent_timeout": 600.0})),
])
def test_specs_parse(spec: str, expected: ArmSpec):
    assert parse_arm(spec) == expected


def test_kind_names_the_backend():
    assert parse_arm("s=cmd:echo {prompt_file}").kind == "cmd"
    assert parse_arm("h=codex:gpt-5.4").kind == "codex"


@pytest.mark.parametrize("spec, message", [
    ("codex:gpt-5.4", "no agent after the name"),
    ("x=", "no agent after the name"),
    ("=codex", "the name '' must be"),
    ("bad name=codex", "the name 'bad name' must be"),
    ("x=bard:pro", "unknown agent 'bard'; choose one of: mutate, openai, codex, claude, gemini, cmd:TEMPLATE"),
    ("x=claude:opus,reasoning_effort=high", "option 'reasoning_effort' does not apply to agent claude; it takes:"),
    ("x=mutate,seed=two", "seed='two' must be a whole number"),
    ("x=openai:m,temperature=hot", "temperature='hot' must be a number"),
    ("x=openai:m,wire_api=grpc", "wire_api must be one of responses, chat"),
    ("x=openai:m,api_key=sk-123", "keys never go on the command line"),
    ("x=codex:m,reasoning_effort", "'reasoning_effort' is not KEY=VALUE"),
    ("x=codex:m,reasoning_effort=", "has no value"),
    ("x=mutate,seed=1,seed=2", "option seed given twice"),
    ("x=cmd:", "cmd: needs a command template"),
])
def test_bad_specs_say_how_to_fix_them(spec: str, message: str):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_arm(spec)


def test_arm_names_are_unique():
    arms = parse_arms(["control=mutate", "high=codex:gpt-5.4,reasoning_effort=high"])
    assert [a.name for a in arms] == ["control", "high"]
    with pytest.raises(ConfigError, match="the name 'x' is already used by --arm 'x=mutate'"):
        parse_arms(["x=mutate", "x=codex:gpt-5.4"])
