"""The `harness` command: a thin layer that parses options and calls the library."""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from . import __version__, backends, loop, pipeline as pipeline_mod, rerun as rerun_mod, status as status_mod
from .cli_display import Display, Watched, literal, summary_text
from .config import read_repo_settings, resolve, with_run_settings
from .errors import HarnessError
from .initrepo import default_tag, init_example, init_repo

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
        click.option("--agent", default=None, help="Researcher backend: mutate (offline), openai, codex, claude, cmd:TEMPLATE."),
        click.option("--model", default=None, help="Researcher model or alias (see models.toml)."),
        click.option("--time-budget", type=float, default=None, help="Seconds of training per experiment."),
        click.option("--kill-after", type=float, default=None, help="Hard deadline per training job, seconds."),
        click.option("--max-steps", type=int, default=None, help="Stop each training job after N steps (HARNESS_MAX_STEPS)."),
        click.option("--agent-timeout", type=float, default=None, help="Hard limit per researcher call, seconds."),
        click.option("--stall-after", type=float, default=None,
                     help="Kill a training job with no output for this many minutes (default 20)."),
        click.option("--health-every", type=int, default=None,
                     help="Health checkpoint every N iterations (default 25; 0 = none)."),
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
                     help="openai: the Responses API (default) or Chat Completions (vLLM, Ollama, routers)."),
        click.option("--base-url", default=None, help="openai: the server's URL (default $OPENAI_BASE_URL or OpenAI's)."),
        click.option("--temperature", type=float, default=None, help="openai: sampling temperature."),
        click.option("--reasoning-effort", default=None, help="openai/codex: reasoning effort (low, medium, high...)."),
        click.option("--request-timeout", type=float, default=None, help="openai: seconds per request (default 600)."),
        click.option("--max-retries", type=int, default=None, help="openai: retries of a 429/5xx/timeout (default 4)."),
        click.option("--repair-turns", type=int, default=None, help="openai: follow-ups when an edit does not apply (default 2)."),
        click.option("--prices", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="A TOML price file over the packaged table (also $HARNESS_PRICES)."),
        click.option("--force", is_flag=True, default=None, help="Resume even if the model, backend, base URL or key changed."),
        click.option("--resume", is_flag=True, help="Continue the run with this tag."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


AGENT_OPTIONS = ("wire_api", "base_url", "temperature", "reasoning_effort", "request_timeout",
                 "max_retries", "repair_turns", "prices", "force")


def build_config(repo: Path, tag: str | None, resume: bool = False, **flags: Any):
    tag = tag or default_tag(repo)
    options = {k: flags.pop(k) for k in AGENT_OPTIONS if k in flags}
    flags["agent_options"] = {k: v for k, v in options.items() if v is not None and v is not False} or None
    flags["agent"] = pick_agent(repo, flags.get("agent"), flags.get("model"), flags["agent_options"])
    if resume:  # the run keeps the settings it was measured with (config.with_run_settings)
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
    label = f"{cfg.model or 'no model'} ({cfg.agent})"
    return Watched("", label, cfg.run_dir, hours=cfg.hours, iterations=cfg.iterations,
                   lanes=max(1, len(cfg.gpus)))


def print_summary(summary: loop.Summary, label: str = "") -> None:
    err.print()
    err.print(summary_text(summary, label))


@click.group()
@click.version_option(__version__, prog_name="harness")
def main() -> None:
    """An unattended overnight autoresearch loop: one fresh researcher per iteration, the harness judges."""


@main.command()
@run_options
@click.option("--hours", type=float, default=None, help="Stop starting iterations after this many hours.")
@click.option("--iterations", type=int, default=None, help="Stop after N iterations (the baseline not counted).")
@click.option("--pipeline/--no-pipeline", default=None,
              help="Propose the next candidate while one trains (default: on for remote researchers).")
@click.option("--gpus", default=None, help="One lane per GPU, e.g. 0,1,2,3 (CUDA_VISIBLE_DEVICES of each lane).")
@friendly
def run(repo, tag, resume, hours, iterations, pipeline, gpus, **flags):
    """Run the autoresearch loop until --hours, --iterations, a budget cap, or Ctrl-C."""
    cfg = build_config(repo, tag, resume, hours=hours, iterations=iterations, pipeline=pipeline,
                       gpus=pipeline_mod.parse_gpus(gpus) or None, **flags)
    with Display(err, [watched(cfg)]) as display:
        summary = pipeline_mod.run(cfg, resume=resume, progress=display)
        display.mark_stopped("", summary.stopped)
    print_summary(summary)


@main.command()
@run_options
@friendly
def step(repo, tag, resume, **flags):
    """Run exactly one iteration (setting the run up first if needed), then exit."""
    tag = tag or status_mod.latest_single(repo) or default_tag(repo)  # `harness step` again continues the run
    exists = (Path(repo) / "runs" / tag / "results.tsv").exists()
    cfg = build_config(repo, tag, resume or exists, **flags)
    with Display(err, [watched(cfg)]) as display:
        summary = pipeline_mod.run(cfg, resume=resume or exists, progress=display, max_steps=1)
        display.mark_stopped("", summary.stopped)
    print_summary(summary)


@main.command()
@run_options
@click.option("--hours", type=float, default=8.0, show_default=True, help="The night to project.")
@friendly
def check(repo, tag, resume, hours, **flags):
    """Smoke test before a night: one researcher call and one baseline run, nothing committed.

    Prints the researcher's latency, tokens and cost per call, the training time, and the
    projected iterations and cost for --hours.
    """
    from . import check as check_mod
    cfg = build_config(repo, tag or "check", **flags)
    say(f"checking {cfg.agent} {cfg.model or ''}: one researcher call, then one baseline run ...")
    click.echo(check_mod.render(check_mod.run_check(cfg, hours)))


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
        return Text(status_mod.render_text(ref, width or console.width), no_wrap=True, overflow="ellipsis")

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
@click.option("--hours", type=float, default=None, help="Hours per arm (interleaved: about twice this in all).")
@click.option("--iterations", type=int, default=None, help="Iterations per arm (the baseline not counted).")
@click.option("--schedule", type=click.Choice(["interleave", "sequential", "parallel"]), default=None,
              help="Default: parallel with two --gpus, else interleave.")
@click.option("--gpus", default=None, help="One GPU per arm for CUDA_VISIBLE_DEVICES, e.g. 0,1.")
@friendly
def ab(repo, tag, resume, agent, model, agent_a, agent_b, model_a, model_b, schedule, gpus, **flags):
    """Compare two researchers from the same baseline commit, then write the side-by-side report."""
    from . import ab as ab_mod

    options = {k: flags.pop(k) for k in AGENT_OPTIONS if k in flags}
    flags["agent_options"] = {k: v for k, v in options.items() if v is not None and v is not False} or None
    tag = tag or default_tag(repo, prefix="ab-")
    arms = {"a": (agent_a or agent, model_a or model), "b": (agent_b or agent, model_b or model)}
    arms = {name: (pick_agent(repo, a, m, flags["agent_options"], flag=f"--model-{name}" if m != model else "--model"), m)
            for name, (a, m) in arms.items()}
    if resume:
        flags = with_run_settings(Path(repo).resolve() / "runs" / tag / "a", flags)
    display = Display(err, ab_watched(repo, tag, arms, flags), schedule=schedule)
    announce_arms(display)
    with display:
        result = ab_mod.run_ab(repo, tag, arms, schedule=schedule, gpus=gpus, resume=resume,
                               overrides=flags, progress=display)
        for name, summary in result.summaries.items():
            display.mark_stopped(name, summary.stopped)
    for name, summary in result.summaries.items():
        print_summary(summary, f"arm {name}: {display.runs[name].label}")
    say("\n" + "\n".join(result.report.summary["verdict"]["text"]))
    click.echo(result.report.markdown)


# --- what `harness ab` says about its arms (labels, the model -> agent pick) ---------------

def ab_watched(repo: Path, tag: str, arms: dict[str, tuple[str | None, str | None]],
               flags: dict[str, Any]) -> list[Watched]:
    """The arms as the screen shows them: labelled by model and researcher, not a/b."""
    from .pricing import resolve_model
    settings, _ = read_repo_settings(Path(repo))
    setup_path = Path(repo).resolve() / "runs" / tag / "ab.json"
    old = json.loads(setup_path.read_text()).get("arms", {}) if setup_path.exists() else {}
    out = []
    for name, (agent, model) in arms.items():
        agent = agent or old.get(name, {}).get("agent") or settings.get("agent") or "mutate"
        model = resolve_model(model) or old.get(name, {}).get("model")
        out.append(Watched(name, f"{model or 'no model'} ({agent})", Path(repo).resolve() / "runs" / tag / name,
                           hours=flags.get("hours"), iterations=flags.get("iterations")))
    return out


def announce_arms(display: Display) -> None:
    """Both arms' researcher and model before anything starts, and a warning when they are the same."""
    labels = [w.label for w in display.runs.values()]
    for w in display.runs.values():
        say(("arm " + w.name, "bold cyan"), ": " + w.label)
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
    from . import report as report_mod

    built = report_mod.build(list(paths), out)
    say("\n".join(built.summary["verdict"]["text"]))
    click.echo(built.markdown)
    click.echo(built.html)
