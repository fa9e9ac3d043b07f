"""`harness ab` end to end on real git repos with the fake trainer: every schedule, resume, the CLI.

One scripted researcher proposes good changes (VALUE goes down), the other bad ones (VALUE goes
up). The report must name the good one, and every figure in summary.json must match the ledgers.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.commands import ab
from harness import ledger
from harness.reporting import report
from harness.agents import Proposal, Usage
from harness.cli import main
from harness.errors import RepoError

from conftest import FAKE_TRAIN, ScriptedResearcher, git, make_repo, set_globals

GOOD = [0.9, 0.8, 0.7]
BAD = [1.1, 1.2, 1.3]
USAGE = (1000, 200, 100, 0.01)  # input, cached, output tokens; USD


def researcher(values, order: list, arm: str, name: str = "scripted") -> ScriptedResearcher:
    """Each call records its arm in order, sets VALUE and reports tokens and a cost."""
    def make(value):
        def step(task):
            order.append(arm)
            train = task.worktree / "train.py"
            train.write_text(set_globals(train.read_text(), VALUE=value))
            return Proposal(f"VALUE={value}", Usage(*USAGE[:3], cost_usd=USAGE[3]), agent_s=0.05)
        return step

    r = ScriptedResearcher([make(v) if isinstance(v, float) else v for v in values])
    r.name = name
    return r


def primary(rows):
    """The experiments' decision rows (and the baseline): not a repeat, not a call the stop cut short."""
    return [r for r in rows if r["status"] not in ("repeat", "stopped")]


def assert_three_experiments(rows):
    """The baseline and --iterations 3 experiments across the stop and the resume; a call the stop cut
    short (a `stopped` row: its spend) took a number of its own, so no number is used twice."""
    assert [r["iteration"] for r in primary(rows)][:1] == [0] and len(primary(rows)) == 4
    numbers = [r["iteration"] for r in rows if r["status"] != "repeat"]
    assert numbers == sorted(set(numbers))


def recompute(path: Path) -> dict:
    """The report's figures, recomputed here from the ledger alone."""
    rows = ledger.read_rows(path)
    exp = [r for r in rows[1:] if r["status"] not in ("budget", "repeat", "stopped")]
    value = lambda r: r["mean"] if r.get("mean") is not None else r["metric"]  # noqa: E731
    keeps = [r for r in exp if r["status"] == "keep"]
    base = value(rows[0])
    best = min([base] + [value(r) for r in keeps])
    train_s = sum(r["train_s"] or 0 for r in rows)
    wall_s = sum(r["wall_s"] or 0 for r in rows if r["status"] != "repeat")
    calls = [r for r in rows if r["status"] != "repeat" and r["agent_s"] is not None]  # stopped ones too
    tokens = sum(r["input_tokens"] + r["output_tokens"] for r in calls)
    cost = sum(r["cost_usd"] for r in calls)
    return {
        "experiments": len(exp), "acceptance_rate": len(keeps) / len(exp), "baseline": base, "best": best,
        "improvement": base - best, "improvement_pct": 100 * (base - best) / base,
        "gpu_minutes_discarded_failed": sum(r["train_s"] or 0 for r in exp if r["status"] != "keep") / 60,
        "mean_agent_s": statistics.fmean(r["agent_s"] for r in exp),
        "mean_wall_s": statistics.fmean(r["wall_s"] for r in exp),
        "gpu_duty": train_s / wall_s,
        "input_tokens_per_iteration": sum(r["input_tokens"] for r in exp) / len(exp),
        "cached_tokens_per_iteration": sum(r["cached_tokens"] for r in exp) / len(exp),
        "output_tokens_per_iteration": sum(r["output_tokens"] for r in exp) / len(exp),
        "cost_usd": cost, "tokens": tokens,
        "improvement_per_gpu_hour": (base - best) / (train_s / 3600),
        "improvement_per_1m_tokens": (base - best) / (tokens / 1e6),
        "improvement_per_usd": (base - best) / cost,
    }


def check_report(run_dir: Path, winner: str) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    label = next(a["label"] for a in summary["arms"] if a["arm"] == winner)  # arms are named by model
    assert summary["verdict"]["winner"] == label
    assert f"Winner: {label}" in (run_dir / "report.md").read_text()
    for arm in summary["arms"]:
        expected = recompute(run_dir / arm["arm"] / "results.tsv")
        for key, want in expected.items():
            assert arm[key] == pytest.approx(want), (arm["label"], key)
        rows = ledger.read_rows(run_dir / arm["arm"] / "results.tsv")
        counts = {s: sum(1 for r in primary(rows)[1:] if r["status"] == s) for s in arm["counts"]}
        assert arm["counts"] == counts
    html = (run_dir / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4
    return summary


def test_interleave_alternates_and_names_the_good_arm(repo: Path):
    order: list[str] = []
    result = ab.run_ab(repo, "il", {"a": (None, "gpt-5.4"), "b": (None, "spark")},
                       overrides={"iterations": 3},
                       researchers={"a": researcher(GOOD, order, "a"), "b": researcher(BAD, order, "b")})
    assert order == ["a", "b"] * 3
    assert result.schedule == "interleave"
    run_dir = repo / "runs" / "il"
    rows = {arm: primary(ledger.read_rows(run_dir / arm / "results.tsv")) for arm in "ab"}
    assert [r["status"] for r in rows["a"]] == ["keep"] * 4
    assert [r["status"] for r in rows["b"]] == ["keep"] + ["discard"] * 3
    # started_at never goes back along the alternation a1, b1, a2, b2, ...
    stamps = [rows[arm][i]["started_at"] for i in range(4) for arm in "ab"]
    assert stamps == sorted(stamps)
    # Both arms come from the same baseline commit, on their own branches.
    setup = json.loads((run_dir / "ab.json").read_text())
    for arm in "ab":
        assert rows[arm][0]["commit"] == setup["baseline_commit"][:12] == git(repo, "rev-parse", "HEAD")[:12]
        assert git(repo, "rev-parse", f"autoresearch/il-{arm}")
    assert setup["arms"]["b"]["model"] == "gpt-5.3-codex-spark" and setup["schedule"] == "interleave"
    summary = check_report(run_dir, "a")
    assert summary["convergent"]["per_arm"]["gpt-5.4 (scripted)"]["hyperparameters"] == ["VALUE"]  # by model
    assert summary["convergent"]["hyperparameters"] == []  # b kept nothing
    assert result.summaries["a"].best_value == pytest.approx(0.7)
    assert "mixes scaffolds" not in (run_dir / "report.md").read_text()


def test_sequential_runs_a_then_b_and_says_when_scaffolds_differ(repo: Path):
    order: list[str] = []
    ab.run_ab(repo, "seq", {"a": (None, "m1"), "b": (None, "m2")}, schedule="sequential",
              overrides={"iterations": 3},
              researchers={"a": researcher(BAD, order, "a"), "b": researcher(GOOD, order, "b", name="other")})
    assert order == ["a"] * 3 + ["b"] * 3
    summary = check_report(repo / "runs" / "seq", "b")
    assert summary["verdict"]["mixed_scaffolds"]
    assert "mixes scaffolds" in (repo / "runs" / "seq" / "report.md").read_text()
    # An unknown model has no price: the researcher's reported cost is used, never a silent zero.
    assert summary["arms"][0]["cost_usd"] == pytest.approx(0.03)


# Each job marks itself running (a file per job, removed as it ends) and, until two jobs have met,
# waits a while for a job on another GPU to be running too: a job that sees one proves the arms'
# training overlapped (not how much work fitted in a time). Run one after the other, none would.
RENDEZVOUS = """import pathlib
gpu = os.environ.get('CUDA_VISIBLE_DEVICES')
print('gpu', gpu)
rv = pathlib.Path({folder!r})
mine = rv / f'running-{{gpu}}-{{os.getpid()}}'
mine.touch()
waited = time.monotonic() + 10
while not (rv / 'met').exists() and time.monotonic() < waited:
    others = [p.name for p in rv.glob('running-*') if not p.name.startswith(f'running-{{gpu}}-')]
    if others:
        (rv / 'met').write_text(f'{{mine.name}} saw {{others[0]}}')
        break
    time.sleep(0.05)
time.sleep(SLEEP_S)
mine.unlink()
"""


def test_parallel_gives_each_arm_its_own_gpu(tmp_path: Path):
    folder = tmp_path / "rendezvous"
    folder.mkdir()
    source = FAKE_TRAIN.replace("time.sleep(SLEEP_S)", RENDEZVOUS.format(folder=str(folder)), 1)
    repo = make_repo(tmp_path / "research", train_source=source)
    order: list[str] = []
    ab.run_ab(repo, "par", {"a": (None, None), "b": (None, None)}, gpus="0,1", overrides={"iterations": 3},
              researchers={"a": researcher(GOOD, order, "a"), "b": researcher(BAD, order, "b")},
              write_report=False)
    run_dir = repo / "runs" / "par"
    # The arms ran at the same time: a job of one arm saw a job of the other running on its GPU.
    met = (folder / "met").read_text() if (folder / "met").exists() else ""
    assert met.startswith("running-") and " saw running-" in met, "the arms' jobs never ran at the same time"
    mine, other = (part.split("-")[1] for part in met.split(" saw "))
    assert {mine, other} == {"0", "1"}, met
    assert not list(folder.glob("running-*"))  # every job ended
    assert json.loads((run_dir / "ab.json").read_text())["schedule"] == "parallel"
    assert sorted(order) == ["a"] * 3 + ["b"] * 3
    for arm, gpu in (("a", "0"), ("b", "1")):
        for log in ("iter-0000.log", "iter-0003.log"):
            assert f"gpu {gpu}\n" in (run_dir / arm / "logs" / log).read_text()
    report.build([run_dir])
    check_report(run_dir, "a")


def test_ctrl_c_then_resume_continues_both_arms(repo: Path):
    order: list[str] = []
    first = ab.run_ab(repo, "rs", {"a": (None, None), "b": (None, None)}, overrides={"iterations": 3},
                      researchers={"a": researcher([0.9, KeyboardInterrupt()], order, "a"),
                                   "b": researcher([1.1], order, "b")})
    assert "interrupted" in first.stopped
    run_dir = repo / "runs" / "rs"
    assert (run_dir / "report.md").exists()  # a partial report is written on Ctrl-C too
    for arm in "ab":
        wt = run_dir / arm / "worktree"
        assert git(wt, "status", "--porcelain") == ""
    # a's second call was the Ctrl-C; b's first proposal, made while a trained, may still have been
    # waiting for the one GPU (its candidate is trained on resume, from its journal)
    assert len(primary(ledger.read_rows(run_dir / "a" / "results.tsv"))) == 2
    assert len(primary(ledger.read_rows(run_dir / "b" / "results.tsv"))) in (1, 2)
    with pytest.raises(RepoError, match="--resume"):
        ab.run_ab(repo, "rs", {"a": (None, None), "b": (None, None)}, overrides={"iterations": 3})
    order.clear()
    ab.run_ab(repo, "rs", {"a": (None, None), "b": (None, None)}, resume=True, overrides={"iterations": 3},
              researchers={"a": researcher([0.8, 0.7], order, "a"), "b": researcher([1.2, 1.3], order, "b")})
    assert order == ["a", "b", "a", "b"]
    for arm in "ab":
        assert_three_experiments(ledger.read_rows(run_dir / arm / "results.tsv"))
    assert len(json.loads((run_dir / "ab.json").read_text())["resumed_at"]) == 1
    check_report(run_dir, "a")


def test_parallel_ctrl_c_stops_both_arms_and_resumes(repo: Path):
    order: list[str] = []
    first = ab.run_ab(repo, "pr", {}, gpus="0,1", overrides={"iterations": 3}, write_report=False,
                      researchers={"a": researcher([0.9, KeyboardInterrupt()], order, "a"),
                                   "b": researcher(BAD, order, "b")})
    assert "interrupted" in first.stopped
    run_dir = repo / "runs" / "pr"
    for arm in "ab":
        assert git(run_dir / arm / "worktree", "status", "--porcelain") == ""
        assert not (run_dir / arm / "inflight.json").exists()
    ab.run_ab(repo, "pr", {}, resume=True, overrides={"iterations": 3},  # parallel again, from ab.json
              researchers={"a": researcher([0.8, 0.7], order, "a"), "b": researcher(BAD, order, "b")})
    for arm in "ab":
        assert_three_experiments(ledger.read_rows(run_dir / arm / "results.tsv"))
    check_report(run_dir, "a")


def test_hours_are_per_arm_the_arms_own_time_carried_across_resume(repo: Path):
    """--hours is each arm's own elapsed time: a resume with the same --hours starts nothing new."""
    source = (repo / "train.py").read_text().replace("SLEEP_S = 0.0", "SLEEP_S = 0.25")
    (repo / "train.py").write_text(source)
    git(repo, "commit", "-qam", "slower")
    order: list[str] = []
    hours = 1.6 / 3600
    first = ab.run_ab(repo, "hr", {"a": (None, None), "b": (None, None)}, overrides={"hours": hours},
                      researchers={"a": researcher(GOOD * 3, order, "a"), "b": researcher(BAD * 3, order, "b")},
                      write_report=False)
    counts = {}
    for arm in "ab":
        assert first.summaries[arm].stopped.startswith("reached --hours")
        counts[arm] = len(ledger.read_rows(repo / "runs" / "hr" / arm / "results.tsv"))
        elapsed_s = json.loads((repo / "runs" / "hr" / arm / "clock.json").read_text())["elapsed_s"]
        assert 0 < elapsed_s < 60
    assert order[:2] == ["a", "b"][:len(order[:2])]
    again = ab.run_ab(repo, "hr", {}, resume=True, overrides={"hours": hours}, write_report=False,
                      researchers={"a": researcher(GOOD, order, "a"), "b": researcher(BAD, order, "b")})
    for arm in "ab":
        assert again.summaries[arm].stopped.startswith("reached --hours")
        assert len(ledger.read_rows(repo / "runs" / "hr" / arm / "results.tsv")) == counts[arm]


def test_cli_ab_then_report(repo: Path):
    runner = CliRunner()
    result = runner.invoke(main, ["ab", "--repo", str(repo), "--tag", "cli", "--agent", "mutate",
                                  "--iterations", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run_dir = repo / "runs" / "cli"
    assert result.stdout.strip() == str(run_dir / "report.md")
    setup = json.loads((run_dir / "ab.json").read_text())
    assert setup["arms"]["a"]["agent"] == "mutate" and setup["arms"]["a"]["model"] is None
    (run_dir / "summary.json").unlink()
    result = runner.invoke(main, ["report", str(run_dir)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [a["label"] for a in summary["arms"]] == ["a: no model (mutate)", "b: no model (mutate)"]
    assert all(a["experiments"] == 2 for a in summary["arms"])
    # Several runs need --out; two single ledgers compare like arms.
    a, b = run_dir / "a" / "results.tsv", run_dir / "b" / "results.tsv"
    result = runner.invoke(main, ["report", str(a.parent), str(b)])
    assert result.exit_code != 0 and "--out" in result.output
    result = runner.invoke(main, ["report", str(a.parent), str(b), "--out", str(repo / "cmp")],
                           catch_exceptions=False)
    assert result.exit_code == 0 and (repo / "cmp" / "report.html").exists()


def test_refusals(repo: Path):
    with pytest.raises(Exception, match="--gpus 0,1"):
        ab.run_ab(repo, "x", {}, schedule="parallel")
    with pytest.raises(Exception, match="nothing to resume"):
        ab.run_ab(repo, "x", {}, resume=True)
    (repo / "train.py").write_text("VALUE = 2.0\n")
    with pytest.raises(RepoError, match="uncommitted"):
        ab.run_ab(repo, "x", {})


def test_an_arm_that_keeps_failing_stops_unhealthy_while_the_other_goes_on(repo: Path):
    """Health checkpoints watch each arm as they watch `harness run`."""
    order: list[str] = []
    crashing = ScriptedResearcher([RuntimeError(f"researcher bug {i}") for i in range(8)])
    result = ab.run_ab(repo, "hl", {"a": (None, None), "b": (None, None)}, overrides={"iterations": 8},
                       researchers={"a": researcher(GOOD + [0.55, 0.54, 0.53, 0.52, 0.51], order, "a"),
                                    "b": crashing}, write_report=False)
    assert result.summaries["b"].stopped.startswith("unhealthy: 5 failures in a row")
    assert result.summaries["a"].stopped == "reached --iterations 8"
    rows_b = primary(ledger.read_rows(repo / "runs/hl/b/results.tsv"))
    assert [r["status"] for r in rows_b] == ["keep"] + ["crash"] * 5
