"""The `harness` command: a thin layer that parses options and calls the library."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

import sys

from . import __version__
from .ledger import guard as ledgerguard
from .agents import backends
from .lazy import lazy_function, lazy_module

# Loaded on first use: `harness elo`, `report` and `--help` need none of the run machinery.
driver, pipeline_mod, rerun_mod, runs, status_mod, trainenv, track_mod = (
    lazy_module(f"harness.{m}") for m in ("driver.loop", "driver.pipeline", "commands.rerun", "lifecycle.runs",
                                         "reporting.status", "workload.trainenv", "track"))
from .cli_display import Display, Watched, agent_label, literal, summary_text
from .config import read_repo_settings, resolve, with_run_settings
from .errors import HarnessError
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


@main.command()
@run_options
@iteration_options
@click.option("--hours", type=float, default=None, help="Stop starting iterations after this many hours.")
@click.option("--iterations", type=int, default=None, help="Stop after N iterations (the baseline not counted).")
@friendly
def run(repo, tag, resume, hours, iterations, pipeline, gpus, **flags):
    """Run the autoresearch loop until --hours, --iterations, a budget cap, or Ctrl-C."""
    cfg = build_config(repo, tag, resume, hours=hours, iterations=iterations, pipeline=pipeline,
                       gpus=pipeline_mod.parse_gpus(gpus) or None, **flags)
    summary = interrupted = None
    with hung_up_terminal(), Display(err, [watched(cfg)]) as display:
        summary, interrupted = driver.single(cfg, make_researcher(cfg), resume, driver.Printer(display),
                                             pipeline_mod.pipelined(cfg))
        display.mark_stopped("", summary.stopped)
    finish(cfg, summary, interrupted)


def make_researcher(cfg):
    from .agents import make_researcher as make
    return make(cfg.agent, cfg.model, cfg.agent_options)


def exit_for(interrupted) -> None:
    """A run stopped by a signal exits non-zero, as the shell expects (128 + the signal)."""
    if interrupted is not None:
        sys.exit(128 + interrupted.signum)


@main.command()
@run_options
@iteration_options
@friendly
def step(repo, tag, resume, pipeline, gpus, **flags):
    """Run exactly one iteration (setting the run up first if needed), then exit.

    It takes the options of `harness run` but --hours and --iterations: one iteration is never
    pipelined, whatever --pipeline says.
    """
    tag = tag or status_mod.latest_single(repo) or default_tag(repo)  # `harness step` again continues the run
    exists = (Path(repo) / "runs" / tag / "results.tsv").exists()
    cfg = build_config(repo, tag, resume or exists, pipeline=pipeline,
                       gpus=pipeline_mod.parse_gpus(gpus) or None, **flags)
    summary = interrupted = None
    with hung_up_terminal(), Display(err, [watched(cfg)]) as display:
        summary, interrupted = driver.single(cfg, make_researcher(cfg), resume or exists, driver.Printer(display),
                                             pipelined=False, steps=1)
        display.mark_stopped("", summary.stopped)
    finish(cfg, summary, interrupted)


@main.command()
@run_options
@click.option("--hours", type=float, default=8.0, show_default=True, help="The night to project.")
@friendly
def check(repo, tag, resume, hours, **flags):
    """Smoke test before a night: one researcher call and one baseline run, nothing committed.

    Prints the researcher's latency, tokens and cost per call, the training time, and the
    projected iterations and cost for --hours.
    """
    from .commands import check as check_mod
    cfg = build_config(repo, tag or "check", **flags)
    say(f"checking {cfg.agent} {cfg.model or ''}: one researcher call, then one baseline run ...")
    try:  # each stage's lines as soon as it passed: a later failure does not hide them
        report = check_mod.run_check(cfg, hours, progress=click.echo)
    except driver.Interrupted as stop:
        say((f"check stopped by {stop.why}", "yellow"), ": nothing it started is left running")
        sys.exit(128 + stop.signum)
    click.echo(check_mod.render_training(report))


@main.command()
@click.argument("tag", required=False)
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=".", show_default=True)
@click.option("--watch", is_flag=True, help="Refresh every few seconds until Ctrl-C; waits for a run not started yet.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--json", "as_json", is_flag=True, help="The same figures as JSON, for scripts.")
@click.option("--width", type=click.IntRange(min=20), default=None, help="Columns to fit (default: the terminal's).")
@friendly
def status(tag, repo, watch, interval, as_json, width):
    """A run's figures from its ledger; an A/B tag shows both arms side by side.

    Without TAG: the list of runs. TAG/a names one arm of an A/B run.
    """
    if tag is None and not watch:
        click.echo(json.dumps([status_mod.state(r) for r in status_mod.all_runs(repo)], indent=2, default=str)
                   if as_json else status_mod.render_list(repo, width or status_mod.terminal_width()))
        return
    if not watch:
        ref = status_mod.find_run(repo, tag)
        click.echo(status_mod.render_json(ref) if as_json else
                   status_mod.render_text(ref, width or status_mod.terminal_width()))
        return
    watch_status(repo, tag, interval, width)


def watch_status(repo: Path, tag: str | None, interval: float, width: int | None) -> None:
    from rich.live import Live
    console = Console(highlight=False)

    def frame() -> Text:
        name = tag or (status_mod.all_runs(repo)[-1].tag if status_mod.all_runs(repo) else None)
        ref = status_mod.find_run(repo, name, must_exist=False) if name else None
        if ref is None:
            return Text(status_mod.waiting_text(repo, name or "(none yet)"), no_wrap=True, overflow="ellipsis")
        return Text(status_mod.render_text(ref, width or console.width, height=console.height), no_wrap=True,
                    overflow="ellipsis")

    try:
        with Live(frame(), console=console, auto_refresh=False, vertical_overflow="crop") as live:
            while True:
                time.sleep(interval)
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        pass


@main.command()
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=".", show_default=True)
@click.option("--example", type=click.Path(path_type=Path), default=None,
              help="Create DIR as a ready research repo with the bundled workload.")
@friendly
def init(repo, example):
    """Make a repo with a train.py ready for `harness run` (or create one with --example DIR)."""
    if example is not None:
        path = init_example(example)
        say(f"created {path} with the bundled workload. Next: cd {path} && harness run --agent mutate "
            f"--iterations 5 --time-budget 10")
        found = trainenv.versions("python train.py", path)
        missing = [p for p in trainenv.WORKLOAD_NEEDS if found.get(p) is None]
        if missing:
            say((f"its train.py needs {' and '.join(missing)}", "yellow"), ", which `python` here does not have: "
                "pip install 'autoresearch-harness[workload]' (or your CUDA build of torch, and safetensors)")
        return
    for line in init_repo(repo):
        say(line)


@main.command()
@click.argument("commit", default="HEAD")
@click.option("--repeat", type=int, default=5, show_default=True, help="How many times to train it.")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=".", show_default=True)
@click.option("--time-budget", type=float, default=None, help="Seconds of training per run.")
@click.option("--kill-after", type=float, default=None, help="Hard deadline per run, seconds.")
@click.option("--max-steps", type=int, default=None, help="Stop each run after N steps.")
@click.option("--seed", type=int, default=None, help="Seed of the first run (then seed+1, ...).")
@friendly
def rerun(commit, repeat, repo, **flags):
    """Train COMMIT K times and print the mean, sd, min, max and spread of the metric."""
    cfg = build_config(repo, "rerun", **flags)
    stats = rerun_mod.rerun(cfg, commit, repeat, progress=lambda k, r: say(
        f"  run {k + 1}/{repeat}: {r.status} {r.value(cfg.metric) if r.status == 'ok' else r.reason}"))
    sd = "-" if stats.sd is None else f"{stats.sd:.6f}"
    click.echo(f"commit {stats.commit[:12]}  runs {len(stats.values)}  {cfg.metric} mean {stats.mean:.6f}  "
               f"sd {sd}  min {min(stats.values):.6f}  max {max(stats.values):.6f}  spread {stats.spread:.6f}")
    for failure in stats.failures:
        click.echo(f"failed: {failure}")


@main.command()
@run_options
@click.option("--agent-a", default=None, help="Arm A's researcher backend (default: --agent).")
@click.option("--agent-b", default=None, help="Arm B's researcher backend (default: --agent).")
@click.option("--model-a", default=None, help="Arm A's model (default: --model).")
@click.option("--model-b", default=None, help="Arm B's model (default: --model).")
@click.option("--arm", "arm_specs", multiple=True, metavar="NAME=AGENT[:MODEL][,KEY=VALUE]",
              help="An arm of a tournament (repeatable, two or more), e.g. high=codex:gpt-5.4,reasoning_effort=high.")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Run each arm R times from the same baseline, other seeds (at least 1).")
@click.option("--workload", "workloads", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Another research repo the same arms run on (repeatable): one task per repo and repeat.")
@click.option("--hours", type=float, default=None, help="Hours per arm: each arm's own elapsed time.")
@click.option("--iterations", type=int, default=None, help="Iterations per arm (the baseline not counted).")
@click.option("--schedule", type=click.Choice(["interleave", "sequential", "parallel"]), default=None,
              help="Default: parallel with two --gpus or --executor ray, else interleave.")
@click.option("--gpus", default=None, help="One GPU per arm for CUDA_VISIBLE_DEVICES, e.g. 0,1.")
@friendly
def ab(repo, tag, resume, agent, model, agent_a, agent_b, model_a, model_b, arm_specs, repeats, workloads,
       schedule, gpus, **flags):
    """Compare researchers from the same baseline commit, then write the side-by-side report.

    Two arms (--model-a/--model-b), or a tournament: --arm two or more times, --repeats R,
    --workload for more repos; then `harness elo runs/<tag>` rates the arms across tasks.
    """
    from .commands import ab as ab_mod
    from .commands.arms import parse_arm

    options = {k: flags.pop(k) for k in AGENT_OPTIONS if k in flags}
    flags["agent_options"] = {k: v for k, v in options.items() if given(v)} or None
    if arm_specs and (agent_a or agent_b or model_a or model_b):
        raise click.UsageError("use either --arm (a tournament) or --agent-a/--model-a/--agent-b/--model-b")
    tag = tag or default_tag(repo, prefix="ab-")
    if arm_specs:
        arms = [parse_arm(spec) for spec in arm_specs]
    else:
        arms = {"a": (agent_a or agent, model_a or model), "b": (agent_b or agent, model_b or model)}
        arms = {name: (pick_agent(repo, a, m, flags["agent_options"], flag=f"--model-{name}" if m != model else "--model"), m)
                for name, (a, m) in arms.items()}
    for path in (repo, *workloads):
        first = "a" if isinstance(arms, dict) else ab_mod.unit_name(arms[0].name, 0, repeats or 1)
        run_flags = with_run_settings(Path(path).resolve() / "runs" / tag / first, flags) if resume else flags
        display = Display(err, ab_watched(path, tag, arms, run_flags, repeats or 1), schedule=schedule)
        announce_arms(display)
        with display:
            result = ab_mod.run_ab(path, tag, arms, schedule=schedule, gpus=gpus, resume=resume,
                                   overrides=run_flags, progress=driver.Printer(display), repeats=repeats)
            for name, summary in result.summaries.items():
                display.mark_stopped(name, summary.stopped)
        for name, summary in result.summaries.items():
            print_summary(summary, f"arm {name}: {display.runs[name].label}")
        finish_tracking()
        say("\n" + "\n".join(result.report.summary["verdict"]["text"]))
        click.echo(result.report.markdown)
        exit_for(result.interrupted)
    if arm_specs or repeats or workloads:
        folders = " ".join(str(Path(p).resolve() / "runs" / tag) for p in (repo, *workloads))
        say(f"\nrate the arms across tasks: harness elo {folders}")


# --- what `harness ab` says about its arms (labels, the model -> agent pick) ---------------

def ab_watched(repo: Path, tag: str, arms: dict[str, tuple[str | None, str | None]] | list,
               flags: dict[str, Any], repeats: int = 1) -> list[Watched]:
    """The arms (or a tournament's units) as the screen shows them: labelled by model and
    researcher, not a/b."""
    from .commands.ab import unit_name
    from .agents.pricing import resolve_model
    settings, _ = read_repo_settings(Path(repo))
    setup_path = Path(repo).resolve() / "runs" / tag / "ab.json"
    old = json.loads(setup_path.read_text()).get("arms", {}) if setup_path.exists() else {}
    pairs = arms.items() if isinstance(arms, dict) else [(a.name, (a.agent, a.model)) for a in arms]
    out = []
    for arm, (agent, model) in pairs:
        for k in range(repeats):
            name = unit_name(arm, k, repeats)
            agent_ = agent or old.get(name, {}).get("agent") or settings.get("agent") or "mutate"
            model_ = resolve_model(model) or old.get(name, {}).get("model")
            out.append(Watched(name, agent_label(model_, agent_), Path(repo).resolve() / "runs" / tag / name,
                               hours=flags.get("hours"), iterations=flags.get("iterations"),
                               researcher=f"{model_ or 'no model'} ({agent_})"))
    return out


def announce_arms(display: Display) -> None:
    """Both arms' researcher and model before anything starts, and a warning when they are the same."""
    labels = [w.researcher or w.label for w in display.runs.values()]
    for w, label in zip(display.runs.values(), labels):
        say(("arm " + w.name, "bold cyan"), ": " + label)
    if len(set(labels)) == 1:
        say(("warning", "bold yellow"), f": both arms run the same researcher ({labels[0]}); the comparison "
            "measures run-to-run noise, not two models. Pass --model-a/--model-b (or --agent-a/--agent-b).")


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the report here (default: the run folder; required for several runs).")
@friendly
def report(paths, out):
    """Rebuild report.md, report.html and summary.json from run folders or results.tsv files.

    Works at any time (mid-run too), on an A/B folder (runs/<tag> with a/ and b/), and on
    karpathy/autoresearch's five-column results.tsv (missing figures are shown as unknown).
    """
    from .reporting import report as report_mod

    built = report_mod.build(list(paths), out)
    say("\n".join(built.summary["verdict"]["text"]))
    click.echo(built.markdown)
    click.echo(built.html)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--budget", type=click.Choice(["gpu-hours", "tokens", "usd", "wall"]), default="gpu-hours",
              show_default=True, help="Compare each task's arms at the spend of this they all reached.")
@click.option("--anchor", default=None, help="The arm rated 1000 (default: the mutate control arm, else the first).")
@click.option("--bootstrap", "draws", type=click.IntRange(0), default=1000, show_default=True,
              help="Draws from the Bradley-Terry posterior for the intervals (0: none).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap.")
@click.option("--ci", "level", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True,
              help="Interval level.")
@click.option("--tie-z", type=click.FloatRange(0), default=1.0, show_default=True,
              help="A gap within this many standard errors of the task's noise floor is a tie.")
@click.option("--arm-by", type=click.Choice(["researcher", "folder"]), default="researcher", show_default=True,
              help="An arm is the arm name or agent:model (researcher), or each run folder's name (folder).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of markdown.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write elo.md, elo.json and the plots into this folder.")
@friendly
def elo(paths, out, as_json, **settings):
    """Bradley-Terry Elo of researchers across tasks, from ledgers alone.

    PATHS are run folders, A/B or tournament folders, or results.tsv files; every results.tsv
    under a folder is read. docs/elo.md says what an arm and a task are.
    """
    import json

    from .reporting import elo as elo_mod, elo_render

    result = elo_mod.analyze(list(paths), elo_mod.Settings(**settings), progress=lambda m: err.print(f"[dim]{m}[/]"))
    text = elo_render.markdown(result)
    if out is not None:
        written = elo_mod.write(result, out, text)
        err.print(f"wrote {', '.join(str(p) for p in written.values())}")
    click.echo(json.dumps(result, indent=2, allow_nan=False) if as_json else text)


@main.command("track")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--uri", default=None, help="Tracking URI (default: the run's track_uri, else sqlite:///runs/mlflow.db).")
@friendly
def track_cmd(paths, uri):
    """Log run folders (or A/B folders) to MLflow now: what is missing is logged, nothing twice.

    For a run made without --track, or while the tracker was down.
    """
    for path in paths:
        for run_dir in track_mod.run_dirs(path):
            result = track_mod.backfill(run_dir, uri=uri)
            click.echo(f"{run_dir}: {result.logged} new of {result.rows} rows in experiment "
                       f"{result.experiment!r} at {result.uri}")
