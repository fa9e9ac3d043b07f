"""`harness check`: the smoke test before a night.

One researcher call in a throwaway worktree (a detached `git worktree` in a temporary folder of
the check's own, removed afterwards; nothing is committed) and one baseline training run, both
under the check's process supervisor (a signal stops them, and the clean-up still runs). It
measures what a night costs and fails fast, with a message that says what to fix.
"""
from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..driver import prompt, signals
from ..agents import pricing
from ..lifecycle import supervise
from ..agents import KEY_VARS, Proposal, Task, make_researcher, sandboxed
from ..config import RunConfig
from ..errors import HarnessError
from ..executors import sandbox
from .. import gitgate
from ..gitgate import GitGate
from ..executors import train_once
from ..workload.runner import tail
from ..lifecycle.runs import program_text


class CheckError(HarnessError):
    """The check failed; the message says what to fix."""


HELP = {
    "missing_key": "missing key: set the backend's API key in the environment.",
    "auth": "the key was rejected (401/403): check that {key_var} holds a valid key for {where}.",
    "not_found": "not found (404): the base URL or the model is wrong. Check --base-url {where} (most "
                 "servers want the /v1 suffix) and --model {model}.",
    "not_logged_in": "the {agent} CLI is not logged in: run `{agent}` once and log in, or set its API key.",
    "rate_limit": "rate limited (429): wait and try again, or check the account's rate limits, plan "
                  "and credit.",
    "timeout": "no answer within the time limit ({timeout_flags}): is {where} reachable and the model this slow?",
    "connection": "cannot connect to {where}: check --base-url and that the server is running.",
    "server": "the server failed (5xx, overloaded or high demand): try again later, or another --base-url.",
    "bad_response": "the answer from {where} was not the API's format (empty, malformed or cut off): is "
                    "--base-url an API of the kind {agent} speaks, and not a web page or a proxy's error page?",
    "cancelled": "the researcher call was cancelled before it finished.",
    "bad_request": "the server refused the request (400): does the model support the options given "
                   "(--temperature, --reasoning-effort, --wire-api)?",
    "agent": "the researcher failed.",
}


@dataclass
class CheckReport:
    agent: str
    model: str | None
    agent_s: float
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cost_usd: float | None
    retries: int
    description: str
    changed: list[str]
    train_s: float
    metric: str
    value: float | None
    hours: float
    settings: dict = field(default_factory=dict)
    cost_source: str = "table"  # table | researcher | unknown (pricing.call_cost)
    sandbox: str = ""  # what the training jobs run under, and what that leaves unprotected
    agent_sandbox: str = ""  # what the researcher's own process runs under
    kill_after: float | None = None  # s, the night's hard deadline per training job (the check's is longer)

    @property
    def iteration_s(self) -> float:
        return self.agent_s + self.train_s

    @property
    def iterations(self) -> int:
        return math.floor(self.hours * 3600 / self.iteration_s) if self.iteration_s > 0 else 0

    @property
    def night_cost_usd(self) -> float | None:
        return None if self.cost_usd is None else self.cost_usd * self.iterations


def explain(proposal: Proposal, researcher, cfg: RunConfig) -> str:
    settings = researcher.describe()
    where = settings.get("base_url") or f"the {researcher.name} CLI's default server"
    key_var = settings.get("key_var") or " or ".join(KEY_VARS.get(researcher.name, ("its API key",)))
    text = HELP.get(proposal.error_kind or "agent", HELP["agent"]).format(
        agent=researcher.name, model=researcher.model, where=where, key_var=key_var,
        timeout_flags=timeout_flags(researcher.name, cfg.agent_timeout))
    if proposal.error_kind == "auth" and not settings.get("key_fingerprint"):
        text += f" (no {key_var} is set)"
    if proposal.retries:
        text += f" It failed after {proposal.retries} retr{'y' if proposal.retries == 1 else 'ies'} of its own."
    return f"{text}\n  {proposal.error}"


def timeout_flags(backend: str, agent_timeout: float) -> str:
    """The flags that bound a call of this backend: only openai reads --request-timeout."""
    flags = f"--agent-timeout {agent_timeout:g}s"
    return flags + ", --request-timeout" if backend == "openai" else flags


def run_check(cfg: RunConfig, hours: float, progress: Callable[[str], None] | None = None) -> CheckReport:
    """One researcher call and one baseline run; raise CheckError with what to fix.

    Everything lives in a temporary folder of the check's own (two checks of one repo at once do
    not meet), every child runs under its supervisor, and SIGINT/SIGTERM/SIGHUP stop them all
    (signals.Interrupted comes out). progress gets each stage's lines as soon as it passed."""
    options = dict(cfg.agent_options)
    if cfg.agent == "openai":
        options.setdefault("max_retries", 0)  # a smoke test reports a 429 instead of waiting it out
    researcher = make_researcher(cfg.agent, cfg.model, options)
    gate = GitGate(cfg.repo)
    base = gate.require_commit(cfg.from_rev)
    night_kill_after = cfg.kill_after
    scratch = Path(tempfile.mkdtemp(prefix="harness-check-"))
    cfg = replace(cfg, run_root=scratch)  # its journal, jail home, logs: the check's alone
    worktree = scratch / "worktree"
    with signals.interrupts() as seen:
        held = contextlib.ExitStack()
        try:
            held.enter_context(supervise.active(scratch))
            gate.add_detached(worktree, base)
            text = prompt.render(program_text(cfg, gate, base), metric=cfg.metric, direction=cfg.direction,
                                 best=None, rows=[], history_rows=cfg.history_rows, last_failure="",
                                 editable=cfg.editable)
            task = Task(worktree=worktree, prompt=text, editable=cfg.editable, timeout_s=cfg.agent_timeout,
                        log_path=scratch / "agent.log", iteration=1, seed=cfg.seed, jail=sandboxed.for_run(cfg, scratch))
            proposal = researcher.propose(task)
            if proposal.error:
                raise CheckError(explain(proposal, researcher, cfg))
            changed = [c[3:] for c in gate.status(worktree)]
            report = researcher_report(cfg, researcher, proposal, changed, hours)
            if progress is not None:
                progress(render_researcher(report))
            gate.reset_clean(worktree, base)
            deadline_s = check_deadline(night_kill_after)
            result = train_once(replace(cfg, kill_after=deadline_s), worktree, scratch / "train.log", cfg.seed)
            if result.status != "ok":
                raise CheckError(f"the baseline training run failed ({result.status}: {result.reason}; the check "
                                 f"gives it {deadline_s:g}s, {CHECK_DEADLINE_FACTOR:g}x the night's --kill-after "
                                 f"{night_kill_after:g}s). Its log ends:\n{tail(scratch / 'train.log', 1500)}")
        except (gitgate.GitCommandError, gitgate.GitFailed) as e:
            raise CheckError(f"could not make a throwaway worktree of {cfg.repo}: {e}") from None
        finally:
            signals.quiet(seen)  # a second signal must not cut the clean-up short
            held.close()  # nothing the check started outlives it
            with contextlib.suppress(gitgate.GitCommandError, gitgate.GitFailed):
                gate.remove_worktree(worktree)
            shutil.rmtree(scratch, ignore_errors=True)
            gate.prune()
    return replace(report, train_s=result.train_s, value=result.value(cfg.metric), kill_after=night_kill_after)


CHECK_DEADLINE_FACTOR = 3.0  # the check's baseline run may take this many times the night's --kill-after


def check_deadline(kill_after: float) -> float:
    """The check's own deadline for its baseline run: a slow first run (cold caches, a first
    download) is measured, not killed; render() says when the night's --kill-after would not hold it."""
    return CHECK_DEADLINE_FACTOR * kill_after


def researcher_report(cfg: RunConfig, researcher, proposal: Proposal, changed: list[str], hours: float) -> CheckReport:
    usage = proposal.usage
    model = pricing.resolve_model(cfg.model)
    cost, cost_source = pricing.call_cost(model, usage)
    return CheckReport(agent=researcher.name, model=model, agent_s=proposal.agent_s,
                       input_tokens=usage.input_tokens, cached_tokens=usage.cached_tokens,
                       output_tokens=usage.output_tokens, cost_usd=cost, retries=proposal.retries,
                       description=proposal.description, changed=changed, train_s=0.0, metric=cfg.metric,
                       value=None, hours=hours, settings=researcher.describe(), cost_source=cost_source,
                       sandbox=sandbox_line(cfg), agent_sandbox=agent_sandbox_line(cfg, researcher.name))


def sandbox_line(cfg: RunConfig) -> str:
    return _confinement(sandbox.resolve(cfg.sandbox), "--sandbox", cfg.network, sandbox.UNPROTECTED,
                        "sees the system runtime, its interpreter, its worktree and data, nothing else")


def agent_sandbox_line(cfg: RunConfig, backend: str) -> str:
    if backend in ("openai", "mutate"):
        return "none needed (it runs no code: the harness applies its edits)"
    return _confinement(sandboxed.resolve(cfg.agent_sandbox), "--agent-sandbox", cfg.agent_network,
                        sandboxed.OFF_WARNING, "its worktree without .git and the protected data, its own home, "
                                               "run folder and repo hidden")


def _confinement(choice, flag: str, network: bool, off_warning: str, sees: str) -> str:
    """One line of `harness check`: what confines the job or the researcher, read from inside it."""
    if not choice.on:
        return f"off ({f'{flag} off: ' + off_warning if choice.setting == 'off' else choice.warning})"
    caps = sandbox.caps_line(sandbox.probe(sandbox.bwrap_path()).capabilities)
    return f"bwrap ({caps}; own PID namespace; {sees}; {'network allowed' if network else 'no network'})"


def render_researcher(r: CheckReport) -> str:
    """The researcher stage's lines (printed as soon as it passed)."""
    source = {"table": "from the price table", "researcher": f"as {r.agent} reported it (no price for the model)"}
    cost = ("unknown (no price for this model; add one with --prices)" if r.cost_usd is None
            else f"${r.cost_usd:.4f} per call, {source.get(r.cost_source, r.cost_source)}")
    where = r.settings.get("base_url") or r.settings.get("executable") or ""
    version = f" ({r.settings['cli_version']})" if r.settings.get("cli_version") else ""
    return "\n".join([
        f"researcher  {r.agent} {r.model or '(default model)'} {where}{version}".rstrip(),
        f"  latency   {r.agent_s:.1f} s per call ({r.retries} retries)",
        f"  tokens    input {r.input_tokens} (cached {r.cached_tokens}), output {r.output_tokens} per call",
        f"  cost      {cost}",
        f"  edit      {', '.join(r.changed) or 'no file changed'}: {r.description or '(no description)'}",
        f"researcher sandbox  {r.agent_sandbox}",
    ])


def render_training(r: CheckReport) -> str:
    """The training stage's lines and the night's projection."""
    night = "unknown" if r.night_cost_usd is None else f"${r.night_cost_usd:.2f}"
    slow = (f" (longer than the night's --kill-after {r.kill_after:g}s, which would kill it: raise --kill-after)"
            if r.kill_after is not None and r.train_s > r.kill_after else "")
    return "\n".join([
        f"training    {r.train_s:.1f} s wall, {r.metric} {'-' if r.value is None else f'{r.value:.6f}'}{slow}",
        f"sandbox     {r.sandbox}",
        f"night       {r.hours:g} h / {r.iteration_s:.1f} s per iteration = about {r.iterations} iterations, "
        f"cost {night}",
    ])


def render(r: CheckReport) -> str:
    return render_researcher(r) + "\n" + render_training(r)
