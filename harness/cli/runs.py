"""The commands that set a repo up and train: `run`, `step`, `check`, `init`, `rerun`, `ab`."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..config.load import read_repo_settings
from ..config.resume import with_run_settings
from .common import (AGENT_OPTIONS, build_config, default_tag, driver, err, exit_for, finish, finish_tracking,
                     friendly, given, hung_up_terminal, init_example, init_repo, iteration_options, main,
                     make_researcher, pick_agent, pipeline_mod, print_summary, printer, rerun_mod, run_options, say,
                     signals, status_mod, trainenv, watched)
from .display import Display
from .text import agent_label
from .watched import Watched


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
        summary, interrupted = driver.single(cfg, make_researcher(cfg), resume, printer.Printer(display),
                                             pipeline_mod.pipelined(cfg))
        display.mark_stopped("", summary.stopped)
    finish(cfg, summary, interrupted)


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
        summary, interrupted = driver.single(cfg, make_researcher(cfg), resume or exists, printer.Printer(display),
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
    from ..commands import check as check_mod
    cfg = build_config(repo, tag or "check", **flags)
    say(f"checking {cfg.agent} {cfg.model or ''}: one researcher call, then one baseline run ...")
    try:  # each stage's lines as soon as it passed: a later failure does not hide them
        report = check_mod.run_check(cfg, hours, progress=click.echo)
    except signals.Interrupted as stop:
        say((f"check stopped by {stop.why}", "yellow"), ": nothing it started is left running")
        sys.exit(128 + stop.signum)
    click.echo(check_mod.render_training(report))


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
    from ..commands import ab as ab_mod
    from ..commands.arms import parse_arm

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
                                   overrides=run_flags, progress=printer.Printer(display), repeats=repeats)
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
    from ..commands.ab import unit_name
    from ..agents.pricing import resolve_model
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
