"""`--agent cmd:TEMPLATE`: any command as a researcher.

The template is split like a shell would (shlex) but never run through one; `{workdir}`,
`{prompt_file}` and `{model}` are substituted inside each argument. The command runs in
the worktree and edits it in place. If its last stdout line is a JSON object, its
`input_tokens`, `cached_tokens`, `output_tokens`, `cost_usd` and `description` are used;
otherwise the last non-empty stdout line is the description.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ..errors import AgentError
from .base import Task, json_object, last_line, reported_usage
from .cli import CLIOutput, CLIResearcher, cost_source
from .process import find_executable
from .sandboxed import template_files

PLACEHOLDERS = ("{workdir}", "{prompt_file}", "{model}")


def parse_command_output(stdout: str) -> CLIOutput:
    """Usage and description from the command's stdout (pure); usage None when it printed none.
    A count or cost that is not a non-negative number is unknown, with the problem said."""
    line = last_line(stdout)
    data = json_object(line)
    if data is None:
        return CLIOutput(None, line, None, False)
    usage, problems = reported_usage(data)
    description = data.get("description")
    description = description if isinstance(description, str) else ""
    if not description:  # the line before the JSON, if any
        description = last_line(stdout.strip()[: -len(line)]) if stdout.strip() != line else ""
    return CLIOutput(usage, description, None, True, problems=tuple(problems))


def render_argv(template: str, workdir: Path, prompt_file: Path, model: str | None) -> list[str]:
    values = {"{workdir}": str(workdir), "{prompt_file}": str(prompt_file), "{model}": model or ""}
    argv = []
    for arg in shlex.split(template):
        for key, value in values.items():
            arg = arg.replace(key, value)
        argv.append(arg)
    return argv


def prompt_path(task: Task) -> Path:
    """The prompt file lives next to the log, outside the worktree (it is not a change)."""
    return task.log_path.parent / f"iter-{task.iteration:04d}-prompt.md"


class CommandResearcher(CLIResearcher):
    """Any command; it reports no usage (a plain script) and costs nothing, unless it was killed."""

    name = "cmd"
    silent_is_free = True

    def __init__(self, template: str, model: str | None = None, agent_args=None):
        try:
            argv = shlex.split(template)
        except ValueError as e:
            raise AgentError(f"cannot split the command template {template!r}: {e}") from None
        if not argv:
            raise AgentError("--agent cmd: needs a command, e.g. --agent 'cmd:my-agent {prompt_file}'.")
        if "/" not in argv[0]:
            find_executable(argv[0], "Check the command in --agent cmd:TEMPLATE.")
        elif not Path(argv[0]).exists():
            raise AgentError(f"{argv[0]} does not exist; check the command in --agent cmd:TEMPLATE.")
        self.template = template
        self.model = model
        self.executable = argv[0]
        self.agent_args = tuple(agent_args or ())
        self.base_url = None

    def describe(self) -> dict[str, Any]:
        return {"backend": "cmd", "model": self.model, "template": self.template,
                "agent_args": list(self.agent_args), "key_fingerprint": None, "cost_source": cost_source(self.model)}

    def command(self, task: Task) -> list[str]:
        prompt_file = prompt_path(task)
        prompt_file.parent.mkdir(parents=True, exist_ok=True)
        prompt_file.write_text(task.prompt)
        return render_argv(self.template, task.worktree, prompt_file, self.model)

    def readonly(self, task: Task) -> list[Path]:
        """The prompt file (in the run's hidden logs folder) and the files the template names."""
        prompt_file = prompt_path(task)
        argv = render_argv(self.template, task.worktree, prompt_file, self.model)
        return [prompt_file, *template_files(argv, task.worktree)]

    def parse(self, stdout: str, stderr: str = "") -> CLIOutput:
        return parse_command_output(stdout)
