"""The private test split: how much of a night's validation gain carries to bytes it never saw.

A night selects on the validation split hundreds of times, so the best commit's validation figure
is biased upward. The workload's `test_command` (evaluate_command's contract: run from the
baseline's protected files, in its own sandbox, on the model the job saved; its result file holds
the metric) scores a model on a test split that no training job, no researcher and no keep
decision ever sees. The harness asks for it only here, for the baseline and the best:

- at the end of a run (every arm of an A/B comparison or tournament), and with `--test-every N`
  after every N keeps (the best so far), each commit is trained once more with its own seed by
  the run's executor (bit-identical under --max-steps; a fresh draw of the same code under a time
  budget) and its model scored on both splits (`Scorer`);
- the figures go to `runs/<tag>/test_scores.tsv` (one row per commit, written whole and renamed,
  with its sha256 recorded like the run's other trusted files) and to the tracker; never to
  results.tsv, never to the run's state: no decision reads them;
- the report shows each arm's validation improvement (the ledger's) beside its test improvement
  and their gap, and says when the validation gain does not carry (`for_report`, `blocks`).

A commit is scored once: a resumed run (after kill -9 too) finds its rows and does not score it
again; a failed scoring is tried again at the next point.
"""
from __future__ import annotations

import csv
import io
import math
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..ledger import events, guard as ledgerguard
from .. import ledger, track
from ..reporting import figures
from ..errors import RepoError

TEST_FILE = "test_scores.tsv"
COLUMNS = ("commit", "point", "iteration", "keeps", "val", "val_rerun", "test", "seed", "train_s", "test_s",
           "scored_at", "note")
POLL_S = 2.0  # s between looks at the ledger for --test-every
NOT_CARRIED_SIGMAS = 2.0  # a gap beyond this many noise sigmas (or a test loss) "does not carry"


# ---------------------------------------------------------------------------
# The file


def path_of(run_dir: Path) -> Path:
    return Path(run_dir) / TEST_FILE


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of test_scores.tsv (numbers as floats, empty as None); [] when there is none.
    RepoError when it was changed or deleted behind the harness's back (its sha256 record)."""
    data = ledgerguard.read_trusted(path_of(run_dir)) or b""
    out = []
    for raw in csv.DictReader(io.StringIO(data.decode("utf-8", "replace")), delimiter="\t"):
        row: dict[str, Any] = {}
        for key in COLUMNS:
            value = raw.get(key) or ""
            if key in ("commit", "point", "scored_at", "note"):
                row[key] = value
            else:
                try:
                    row[key] = float(value) if value != "" else None
                except ValueError:
                    row[key] = None
        out.append(row)
    return out


def write(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """The whole file, written and renamed (fsynced), its sha256 recorded (ledgerguard.write_trusted)."""
    buf = io.StringIO()
    buf.write("\t".join(COLUMNS) + "\n")
    for row in rows:
        cells = []
        for key in COLUMNS:
            value = row.get(key)
            if value is None:
                cells.append("")
            elif isinstance(value, float):
                cells.append(f"{value:.6f}" if key not in ("iteration", "keeps", "seed") else f"{value:.0f}")
            else:
                cells.append(ledger.one_line(str(value), 300))
        buf.write("\t".join(cells) + "\n")
    ledgerguard.write_trusted(path_of(run_dir), buf.getvalue().encode())


def upsert(run_dir: Path, row: dict[str, Any]) -> None:
    """Add row, or replace the row of the same commit (a failed scoring tried again)."""
    rows = [r for r in read_or_restart(run_dir) if not _same(r["commit"], row["commit"])]
    write(run_dir, [*rows, row])


def read_or_restart(run_dir: Path) -> list[dict[str, Any]]:
    """read(), for the harness's own writes: a file changed behind its back is set aside (an event)
    and its commits scored again, never believed."""
    try:
        return read(run_dir)
    except RepoError as e:
        path = path_of(run_dir)
        if path.exists():
            path.replace(path.with_name(f"{TEST_FILE}.tampered"))
        ledgerguard.write_trusted(path, ("\t".join(COLUMNS) + "\n").encode())
        events.record(run_dir, "test_scores_refused", f"{str(e)[:300]}; set aside as {TEST_FILE}.tampered, "
                                                      f"its commits are scored again")
        return []


def _same(a: str, b: str) -> bool:
    return bool(a) and bool(b) and (a.startswith(b) or b.startswith(a))


def scored(rows: list[dict[str, Any]], commit: str) -> dict[str, Any] | None:
    """The row of commit that has a figure, if any."""
    return next((r for r in rows if _same(r["commit"], commit) and r.get("test") is not None), None)


# ---------------------------------------------------------------------------
# Scoring, in the run's thread


class Scorer:
    """Scores the baseline and the best of one run on the test split (RunDriver: poll, at_end)."""

    def __init__(self, ctx: Any, state: Any, cancel: threading.Event, progress: Any = None):
        self.ctx, self.state, self.cancel = ctx, state, cancel  # due() is called by the driver's loop only
        self.cfg = ctx.cfg
        self.progress = progress
        self.looked = 0.0

    @property
    def on(self) -> bool:
        return bool(self.cfg.test_command)

    def due(self, now: bool = False) -> list[tuple[str, str, int]]:
        """--test-every N: the commit kept N-th, 2N-th, ... (the best so far then); score_points
        skips those scored already."""
        if not self.on or not self.cfg.test_every or (not now and time.monotonic() - self.looked < POLL_S):
            return []
        self.looked = time.monotonic()
        n = self.cfg.test_every
        rows = ledger.read_rows(self.cfg.ledger_path)
        kept = [r for r in rows if r.get("status") == "keep"][1:]  # after the baseline's
        return [(self.ctx.wt.resolve(str(kept[m - 1]["commit"])), f"every {n} keeps", m)
                for m in range(n, len(kept) + 1, n)]

    def end_points(self) -> list[tuple[str, str, int]]:
        """The end of the run (not a stop by a signal): the --test-every points the run's last keeps
        left, then the final best."""
        if not self.on or self.cancel.is_set():
            return []
        rows = ledger.read_rows(self.cfg.ledger_path)
        kept = sum(1 for r in rows if r.get("status") == "keep") - 1
        return [*self.due(now=True), (self.state.best_commit, "end", max(0, kept))]

    def unscored(self, wanted: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
        """The baseline, then each (commit, point, keeps) of wanted, that has no test figure yet, once each."""
        have = read_or_restart(self.cfg.run_dir)
        todo: list[tuple[str, str, int]] = []
        for commit, point, keeps in [(self.state.baseline_commit, "baseline", 0), *wanted]:
            if commit and scored(have, commit) is None and not any(_same(commit, c) for c, _, _ in todo):
                todo.append((commit, point, keeps))
        return todo

    def score_points(self, wanted: list[tuple[str, str, int]], rows: list[dict[str, Any]], final: bool = False) -> None:
        """The baseline, then each (commit, point, keeps) of wanted, unless already scored; final: the
        run's end (its last job foresees no successor: executors.Job.successor)."""
        base = self.state.baseline_commit
        todo = self.unscored(wanted)
        for k, (commit, point, keeps) in enumerate(todo):
            if self.cancel.is_set():
                return
            self.score(commit, "baseline" if _same(commit, base) else point, rows, 0 if _same(commit, base) else keeps,
                       successor=not final or k < len(todo) - 1)

    def score(self, commit: str, point: str, rows: list[dict[str, Any]], keeps: int,
              successor: bool = True) -> dict[str, Any]:
        from ..driver.step import train  # the run's executor, its trusted baseline

        cfg = self.cfg
        row = _ledger_row(rows, commit)
        seed = int(row["seed"]) if row and row.get("seed") is not None else cfg.seed
        log = cfg.logs_dir / f"test-{commit[:12]}.log"
        self.say(f"training {commit[:12]} ({point}) once more with seed {seed}, to score it on the test split ...")
        ctx = replace(self.ctx, cfg=replace(cfg, score_test=True))
        iteration = int(row.get("iteration") or 0) if row else 0
        result = train(ctx, commit, log, seed, cancel=self.cancel, iteration=iteration,  # a stop: KeyboardInterrupt
                       successor=successor)
        figure = result.test_metrics.get(cfg.metric) if result.status == "ok" else None
        note = "" if figure is not None else (result.test_metrics.get("error") or result.reason
                                               or f"the job ended {result.status}")
        out = {"commit": commit, "point": point, "iteration": float(iteration), "keeps": float(keeps),
               "val": ledger.decided_value(row) if row else None, "val_rerun": result.value(cfg.metric),
               "test": figure, "seed": float(seed), "train_s": result.train_s,
               "test_s": result.test_metrics.get("test_s"), "scored_at": _now(), "note": note}
        upsert(cfg.run_dir, out)
        events.record(cfg.run_dir, "test_scored" if figure is not None else "test_failed",
                      f"{point}: {commit[:12]} on the test split: "
                      + (f"{cfg.metric} {figure:.6f}" if figure is not None else note))
        track.after_row(cfg)  # the tracker gets the test figures too (track/base.py)
        self.say(f"{commit[:12]} ({point}): " + (f"{cfg.metric} {figure:.6f} on the test split (validation "
                                                  f"{_fmt(out['val'])}; it decides nothing)" if figure is not None
                                                  else f"not scored: {note}"))
        return out

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress("event", {"kind": "test split", "message": message})


def _ledger_row(rows: list[dict[str, Any]], commit: str) -> dict[str, Any] | None:
    """The primary row of commit (its keep, or the baseline) on the ledger."""
    found = [r for r in rows if _same(str(r.get("commit") or ""), commit) and r.get("status") == "keep"]
    return found[-1] if found else None


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.6f}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------------------
# The report


def for_report(run_dir: Path, rows: list[dict[str, Any]], metric: str, direction: str,
               config: dict[str, Any], sigma: float | None) -> dict[str, Any]:
    """One arm's validation-vs-test figures. Improvements are signed so that positive is better
    (as the report's headline): baseline minus best when minimizing."""
    head = figures.headline(rows, metric, direction)
    sign = 1.0 if direction == "minimize" else -1.0
    out: dict[str, Any] = {"test_command": config.get("test_command"), "val_improvement": head.improvement,
                           "baseline_commit": None, "best_commit": None, "test_baseline": None, "test_best": None,
                           "test_improvement": None, "gap": None, "carries": None, "status": "", "points": []}
    if not config.get("test_command"):
        out["status"] = "validation-only"
        return out
    keeps = [r for r in rows if r.get("status") == "keep"]
    if not keeps:
        out["status"] = "no baseline"
        return out
    base, best = str(keeps[0].get("commit") or ""), str(keeps[-1].get("commit") or "")
    out["baseline_commit"], out["best_commit"] = base[:12], best[:12]
    try:
        tests = read(run_dir)
    except RepoError:
        out["status"] = f"refused: {TEST_FILE} was changed after the harness wrote it"
        return out
    out["points"] = [{k: r[k] for k in ("point", "commit", "keeps", "val", "test", "note")} for r in tests]
    b, e = scored(tests, base), scored(tests, best)
    out["test_baseline"] = b and b["test"]
    out["test_best"] = e and e["test"]
    if b is None or e is None:
        out["status"] = "not scored yet"
        return out
    out["test_improvement"] = sign * (b["test"] - e["test"])
    if head.improvement is not None:
        out["gap"] = head.improvement - out["test_improvement"]
        tolerance = NOT_CARRIED_SIGMAS * sigma * math.sqrt(2) if sigma else 0.0
        out["carries"] = bool(out["test_improvement"] > 0 and out["gap"] <= max(tolerance, 0.5 * head.improvement)) \
            if head.improvement > 0 else None
    out["status"] = "scored"
    return out


def warnings(arms: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The verdict's plain words where a validation gain does not carry to the test split."""
    out = []
    for label, t in arms:
        if t.get("carries") is False:
            out.append(f"**{label}: the validation gain does not carry to the test split** (validation "
                       f"{t['val_improvement']:+.6g}, test {t['test_improvement']:+.6g}, gap {t['gap']:+.6g}): "
                       f"the night's best was selected on noise or on the validation bytes themselves.")
    return out


def blocks(summary: dict[str, Any]) -> list[tuple]:
    """The report's "Validation vs test" section (report_render's block tuples)."""
    arms = [(f["label"], f.get("test_split") or {}) for f in summary.get("arms") or []]
    if not arms:
        return []
    out: list[tuple] = [("h2", "Validation vs test")]
    if all(t.get("status") == "validation-only" for _, t in arms):
        return out + [("p", "Validation-only: no workload here names a `test_command`, so how much of each gain is "
                            "selection on the validation split is unknown (docs/report.md).")]

    def num(v: Any, signed: bool = True) -> str:
        return "unknown" if v is None else (f"{v:+.6g}" if signed else f"{v:.6f}")

    rows = []
    for label, t in arms:
        if t.get("status") == "validation-only":
            verdict = "validation-only: the workload names no test_command"
        elif t.get("status") != "scored":
            verdict = t.get("status") or "unknown"
            if verdict == "not scored yet":
                verdict += " (scored at the end of the run; `harness run --resume` finishes it)"
        elif t.get("carries") is None:
            verdict = "no validation gain to carry"
        else:
            verdict = "carries" if t["carries"] else "does not carry"
        rows.append([label, num(t.get("val_improvement")), num(t.get("test_improvement")), num(t.get("gap")),
                     num(t.get("test_baseline"), False), num(t.get("test_best"), False), verdict])
    out.append(("p", "Improvements over the baseline, positive = better. Validation: the ledger's figure, which "
                     "the keep decisions selected on. Test: the baseline and the best scored once on the private "
                     "test split, which no job, researcher or decision saw. Gap = validation minus test."))
    out.append(("table", ["arm", "validation improvement", "test improvement", "gap", "test: baseline",
                          "test: best", "verdict"], rows))
    for label, t in arms:
        if t.get("status") == "validation-only":
            out.append(("p", f"{label}: the figure is validation-only (no `test_command` in the workload's "
                             f"settings), so how much of its gain is selection on the validation split is unknown."))
        points = [p for p in t.get("points") or [] if p.get("point", "").startswith("every")]
        if points:
            out.append(("p", f"{label}, the best so far on the test split: " + ", ".join(
                f"after {p['keeps']:.0f} keeps {num(p['test'], False)}" for p in points) + "."))
    return out


# ---------------------------------------------------------------------------
# The tracker


def tracker_records(run_dir: Path, tag: str, metric: str) -> list[Any]:
    """The scored rows as tracker records (key `<tag>/test/<commit>`): logged once each."""
    from ..track.records import Record

    out = []
    try:
        rows = read(run_dir)
    except RepoError:  # changed behind the harness's back: the run's next scoring sets it aside
        return []
    for r in rows:
        if r.get("test") is None:
            continue
        metrics = {f"test_{metric}": r["test"]}
        for key, name in (("val", metric), ("val_rerun", f"rerun_{metric}"), ("train_s", "train_s")):
            if r.get(key) is not None:
                metrics[name] = r[key]
        step = int(r.get("iteration") or 0)
        tags = {"harness.run": tag, "harness.split": "test", "commit": r["commit"], "harness.point": r["point"]}
        out.append(Record(f"{tag}/test/{r['commit'][:12]}", -1, f"{step:04d} test split ({r['point']})",
                          {"point": r["point"]}, metrics, tags, step, None, None, False))
    return out
