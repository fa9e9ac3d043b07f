"""What the `harness` command's commands share: the group (`main`), the options repeated across
commands, the config built from flags, the run's end (summary, tracking, exit status) and the
run machinery loaded on first use. The commands are in `runs` (set up and train) and `views`
(read what runs left)."""
from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Any

import click
from rich.console import Console

import sys

from .. import __version__
from ..ledger import guard as ledgerguard
from ..agents import backends
from .lazy import lazy_function, lazy_module

# Loaded on first use: `harness elo`, `report` and `--help` need none of the run machinery.
driver, printer, signals, pipeline_mod, rerun_mod, runs, status_mod, trainenv, track_mod = (
    lazy_module(f"harness.{m}") for m in ("driver.loop", "driver.printer", "driver.signals", "driver.pipeline",
                                         "commands.rerun", "lifecycle.runs", "reporting.status",
                                         "workload.trainenv", "track"))
from .text import agent_label, literal, summary_text
from .watched import Watched
from ..config.load import read_repo_settings, resolve
from ..config.resume import with_run_settings
from ..errors import HarnessError
default_tag, init_example, init_repo = (lazy_function("harness.commands.initrepo", f)  # initrepo imports GitPython
                                        for f in ("default_tag", "init_example", "init_repo"))

err = Console(stderr=True, highlight=False, soft_wrap=True)  # a log line is never cut in two


def say(*parts: str | tuple[str, str]) -> None:
    """Progress to stderr, printed literally: user text is never read as rich markup."""
    err.print(literal(*parts))


def friendly(fn):
    """Typed library errors become one clear message and exit code 1."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HarnessError as e:
            raise click.ClickException(str(e)) from None
    return wrapper


def run_options(fn):
    """Options shared by `run` and `step`."""
    opts = [
        click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=".",
                     show_default=True, help="The research repo (a git repo with train.py)."),
        click.option("--tag", default=None, help="Run name; branch autoresearch/<tag>. Default: the date and time, e.g. dec01-0930."),
        click.option("--agent", default=None, help="Researcher backend: mutate (offline), openai, codex, claude, gemini, cmd:TEMPLATE."),
        click.option("--model", default=None, help="Researcher model or alias (see models.toml)."),
        click.option("--time-budget", type=float, default=None, help="Seconds of training per experiment."),
        click.option("--kill-after", type=float, default=None, help="Hard deadline per training job, seconds."),
        click.option("--max-steps", type=int, default=None, help="Stop each training job after N training steps (HARNESS_MAX_STEPS)."),
        click.option("--agent-timeout", type=float, default=None, help="Hard limit per researcher call, seconds."),
        click.option("--stall-after", "stall_after_min", type=float, default=None,
                     help="Kill a training job with no output for this many minutes (default 20)."),
        click.option("--health-every", type=int, default=None,
                     help="Health checkpoint every N iterations (default 25; 0 = none)."),
        click.option("--test-every", type=int, default=None,
                     help="Score the best so far on the private test split every N keeps, beside the end of "
                          "the run (default 0: at the end only; the figure never decides; docs/report.md)."),
        click.option("--on-unhealthy", type=click.Choice(["stop", "continue"]), default=None,
                     help="At a failed health check: stop (default) or continue."),
        click.option("--keep-ties/--no-keep-ties", default=None, help="Keep a candidate that equals the best."),
        click.option("--from", "from_rev", default=None, help="Start the run from this commit (default HEAD)."),
        click.option("--seed", type=int, default=None, help="Seed for training and the mutate researcher."),
        click.option("--max-tokens", type=int, default=None, help="Stop before the run's tokens would pass N."),
        click.option("--max-cost", type=float, default=None, help="Stop before the run's cost would pass USD."),
        click.option("--gate", type=click.Choice(["strict", "noise"]), default=None,
                     help="Keep rule: any improvement (strict) or beyond the noise floor (noise, default)."),
        click.option("--baseline-runs", type=int, default=None, help="Train the baseline K times (noise floor)."),
        click.option("--confirm", type=int, default=None, help="Extra runs to confirm a borderline win."),
        click.option("--min-delta", type=float, default=None, help="Smallest improvement worth keeping."),
        click.option("--z", "z", type=float, default=None, help="Standard errors a win must exceed (noise gate, default 2)."),
        click.option("--wire-api", type=click.Choice(["responses", "chat"]), default=None,
                     help="openai/codex: the Responses API (default) or Chat Completions (vLLM, Ollama, routers)."),
        click.option("--base-url", default=None,
                     help="The researcher's server: openai's client URL, codex's generated provider, claude's "
                          "ANTHROPIC_BASE_URL, gemini's GOOGLE_GEMINI_BASE_URL."),
        click.option("--agent-executable", "executable", default=None,
                     help="codex/claude/gemini: the CLI to run (a path or a name on PATH)."),
        click.option("--agent-arg", "agent_args", multiple=True, default=None,
                     help="An argument passed through to the researcher CLI (repeatable), e.g. -c key=value."),
        click.option("--temperature", type=float, default=None, help="openai: sampling temperature."),
        click.option("--reasoning-effort", default=None, help="openai/codex: reasoning effort (low, medium, high...)."),
        click.option("--request-timeout", type=float, default=None, help="openai: seconds per request (default 600)."),
        click.option("--max-retries", type=int, default=None, help="openai: retries of a 429/5xx/timeout (default 4)."),
        click.option("--repair-turns", type=int, default=None, help="openai: follow-ups when an edit does not apply (default 2)."),
        click.option("--prices", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="A TOML price file over the packaged table (also $HARNESS_PRICES)."),
        click.option("--track", default=None, metavar="mlflow[:URI]",
                     help="Log every experiment to MLflow (default URI sqlite:///runs/mlflow.db; see docs/tracking.md)."),
        click.option("--force", is_flag=True, default=None, help="Resume even if the model, backend, base URL or key changed."),
        click.option("--resume", is_flag=True, help="Continue the run with this tag."),
        click.option("--rebaseline", is_flag=True, default=None,
                     help="With --resume, when no baseline succeeded yet: train the baseline again from your "
                          "checkout's HEAD (or --from), with the settings as they are now."),
        click.option("--sandbox", type=click.Choice(["auto", "bwrap", "off"]), default=None,
                     help="Run jobs under bubblewrap: auto (default: when it works here), bwrap (required), off."),
        click.option("--network/--no-network", default=None, help="Let sandboxed training jobs reach the network."),
        click.option("--warm-start/--no-warm-start", default=None,
                     help="Hand each sandboxed `python SCRIPT` job to an interpreter started, imports done, while "
                          "the previous job trained (default on)."),
        click.option("--agent-sandbox", type=click.Choice(["auto", "bwrap", "off"]), default=None,
                     help="Run the researcher's own process under bubblewrap: auto (default), bwrap (required), off."),
        click.option("--agent-network", type=click.Choice(["on", "off"]), default=None,
                     callback=lambda ctx, param, value: None if value is None else value == "on",
                     help="Let the sandboxed researcher reach the network (default on: its API); off for a cmd: that needs none."),
        click.option("--job-memory-mb", type=int, default=None,
                     help="Memory per training job and per evaluation, MB (default half the machine's; 0 = none)."),
        click.option("--job-pids", type=int, default=None,
                     help="Processes and threads per job and per evaluation (default 4096; 0 = none)."),
        click.option("--job-disk-mb", type=int, default=None,
                     help="MB a job's /tmp, output folder and worktree may each grow (default 1/4 of the free disk, "
                          "at most 50 GB; 0 = none)."),
        click.option("--job-log-mb", type=int, default=None, help="MB of a job's log kept, head and tail (default 64)."),
        click.option("--eval-kill-after", type=float, default=None,
                     help="Hard deadline per evaluation, seconds (default: calibrated on the baseline's evaluation)."),
        click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
                     help="Where training jobs run: this machine (local) or a Ray cluster (docs/cluster.md)."),
        click.option("--ray-address", default=None, help="ray: the cluster's address (default $RAY_ADDRESS, else auto)."),
        click.option("--job-resources", default=None, metavar="JSON",
                     help='ray: resources per job, e.g. \'{"GPU": 1}\' (default) or \'{"CPU": 1}\'.'),
        click.option("--slots", type=int, default=None, help="ray: jobs at once (default: what the cluster holds)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def iteration_options(fn):
    """The run's own options besides run_options that an iteration also uses: `run` and `step`
    (one iteration of the same run) take both lists; only --hours and --iterations are run's alone."""
    opts = [
        click.option("--pipeline/--no-pipeline", default=None,
                     help="Propose the next candidate while one trains (default: on for remote researchers; "
                          "`step` runs one iteration, which has nothing to overlap)."),
        click.option("--gpus", default=None, help="One lane per GPU, e.g. 0,1,2,3 (CUDA_VISIBLE_DEVICES of each lane)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


AGENT_OPTIONS = ("wire_api", "base_url", "temperature", "reasoning_effort", "request_timeout",
                 "max_retries", "repair_turns", "prices", "force", "executable", "agent_args")
def given(value: Any) -> bool:
    """An option the user gave: not left out (None, an unset flag, a repeatable one's ()); 0 counts."""
    return not (value is None or value is False or value == ())


def build_config(repo: Path, tag: str | None, resume: bool = False, **flags: Any):
    tag = tag or default_tag(repo)
    options = {k: flags.pop(k) for k in AGENT_OPTIONS if k in flags}
    flags["agent_options"] = {k: v for k, v in options.items() if given(v)} or None
    flags["agent"] = pick_agent(repo, flags.get("agent"), flags.get("model"), flags["agent_options"])
    if flags.get("rebaseline") and not resume:
        raise click.UsageError("--rebaseline restarts the failed baseline of an existing run: use it with --resume.")
    if resume and not flags.get("rebaseline"):  # the run keeps the settings it was measured with
        flags = with_run_settings(Path(repo).resolve() / "runs" / tag, flags)
    return resolve(repo, tag, flags)


def pick_agent(repo: Path, agent: str | None, model: str | None, options: dict[str, Any] | None,
               flag: str = "--model") -> str | None:
    """--model without --agent: the first backend models.toml names that is usable here, said aloud."""
    settings, _ = read_repo_settings(Path(repo)) if Path(repo).is_dir() else ({}, None)
    chosen, note = backends.pick(agent or settings.get("agent"), model or settings.get("model"), options, flag)
    if note:  # picked from models.toml: say which
        say((note, "dim"))
        return chosen
    return agent


def watched(cfg) -> Watched:
    return Watched("", agent_label(cfg.model, cfg.agent), cfg.run_dir, hours=cfg.hours, iterations=cfg.iterations,
                   lanes=max(1, len(cfg.gpus)))


def print_summary(summary: runs.Summary, label: str = "") -> None:
    err.print()
    err.print(summary_text(summary, label))


HUNG_UP = (5, 6, 32)  # EIO, ENXIO, EPIPE: what writing to a closed terminal or pipe raises


@contextlib.contextmanager
def hung_up_terminal():
    """A closed terminal (tmux pane, ssh session) makes every print fail with EIO: the run's end must
    go on regardless (the summary to its file, the tracker's flush, the exit status), so output is
    muted from there; any other OSError is the run's own and is raised."""
    try:
        yield
    except OSError as e:
        if e.errno not in HUNG_UP:
            raise
        mute()


def mute() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def finish(cfg, summary: runs.Summary, interrupted) -> None:
    """The end of `harness run` / `harness step`: the summary to runs/<tag>/summary.txt (read it when
    the terminal is gone) and the screen, the tracker's last sync, the exit status (128 + signal)."""
    if summary is None:  # the terminal was gone before the run began
        sys.exit(1)
    with contextlib.suppress(OSError):
        ledgerguard.atomic_write(cfg.run_dir / "summary.txt", (summary_text(summary).plain + "\n").encode())
    with hung_up_terminal():
        print_summary(summary)
    with hung_up_terminal():
        finish_tracking()
    exit_for(interrupted)


def finish_tracking() -> None:
    """The tracker's last sync (bounded by track_timeout), and where the experiments are."""
    try:
        outcomes = track_mod.finish()
    except KeyboardInterrupt:  # a second Ctrl-C: the ledger is complete, the back-fill can wait
        err.print("[yellow]tracking interrupted[/]: `harness track RUN_DIR` logs what is missing")
        return
    for out in outcomes:
        if out.complete and out.result is not None:
            err.print(f"tracked: {out.result.rows} rows in experiment {out.result.experiment!r} at {out.uri}")
        else:
            err.print(f"[yellow]tracking incomplete[/] at {out.uri}: the ledger has every row; "
                      f"`harness track {out.run_dir}` logs the missing ones")


class Group(click.Group):
    """Ctrl-C outside a run's own handlers (reading the config, starting the researcher): one line
    and exit 130, as a shell expects of an interrupted command, not click's "Aborted!" and 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            with hung_up_terminal():
                err.print("interrupted (Ctrl-C)")
            sys.exit(130)


@click.group(cls=Group)
@click.version_option(__version__, prog_name="harness")
def main() -> None:
    """An unattended overnight autoresearch loop: one fresh researcher per iteration, the harness judges."""


def make_researcher(cfg):
    from ..agents import make_researcher as make
    return make(cfg.agent, cfg.model, cfg.agent_options)


def exit_for(interrupted) -> None:
    """A run stopped by a signal exits non-zero, as the shell expects (128 + the signal)."""
    if interrupted is not None:
        sys.exit(128 + interrupted.signum)
