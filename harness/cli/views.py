"""The commands that read what runs left: `status`, `report`, `elo`, `track`."""
from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from .common import err, friendly, main, say, status_mod, track_mod


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
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the report here (default: the run folder; required for several runs).")
@friendly
def report(paths, out):
    """Rebuild report.md, report.html and summary.json from run folders or results.tsv files.

    Works at any time (mid-run too), on an A/B folder (runs/<tag> with a/ and b/), and on
    karpathy/autoresearch's five-column results.tsv (missing figures are shown as unknown).
    """
    from ..reporting import report as report_mod

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

    from ..reporting import elo as elo_mod, elo_render

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
