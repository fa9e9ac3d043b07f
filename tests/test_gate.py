"""The noise-aware keep rule: unit tests on constructed ledgers, and end to end with a noisy fake trainer."""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import pytest

from harness.driver import decide, loop as driver
from harness import ledger
from harness.config.load import resolve
from harness.driver.decide import GateSettings

from conftest import ScriptedResearcher, git
from test_cli import harness

NOISE = GateSettings(gate="noise", z=2.0)
STRICT = GateSettings(gate="strict")


def test_pooled_sigma():
    assert decide.pooled_sigma([[1.0]]) is None
    assert decide.pooled_sigma([[1.0, 1.0]]) == 0.0
    a, b = [1.0, 1.2, 0.8], [5.0, 5.4]
    pooled = ((statistics.variance(a) * 2 + statistics.variance(b) * 1) / 3) ** 0.5
    assert decide.pooled_sigma([a, b]) == pytest.approx(pooled)


def test_strict_keeps_any_improvement():
    assert decide.decide(STRICT, [0.999], 1.0, 1, 0.01, True)[0] == "keep"
    assert decide.decide(STRICT, [1.0], 1.0, 1, 0.01, True)[0] == "discard"
    ties = GateSettings(gate="strict", keep_ties=True)
    assert decide.decide(ties, [1.0], 1.0, 1, None, True)[0] == "keep"
    maxi = GateSettings(gate="strict", direction="maximize")
    assert decide.decide(maxi, [1.1], 1.0, 1, None, True)[0] == "keep"


def test_noise_gate_threshold_and_confirmation():
    sigma, n_best = 0.01, 2
    thr = 2 * sigma * (1 + 1 / n_best) ** 0.5  # about 0.0245
    assert decide.threshold(NOISE, sigma, 1, n_best) == pytest.approx(thr)
    assert decide.decide(NOISE, [1.0 - 0.02], 1.0, n_best, sigma, True)[0] == "discard"  # within noise
    assert decide.decide(NOISE, [1.0 - 0.03], 1.0, n_best, sigma, True)[0] == "confirm"  # a win: confirm
    assert decide.decide(NOISE, [1.0 - 0.3], 1.0, n_best, sigma, True)[0] == "confirm"  # implausible too
    assert decide.decide(NOISE, [1.0 - 0.03], 1.0, n_best, sigma, False)[0] == "keep"  # confirmed
    assert decide.decide(NOISE, [0.97, 1.0, 0.99], 1.0, n_best, sigma, False)[0] == "discard"  # mean lost
    # Averaging runs lowers the bar; min_delta is a floor; no noise estimate falls back to strict.
    assert decide.threshold(NOISE, sigma, 3, n_best) < thr
    assert decide.threshold(GateSettings(min_delta=0.1), sigma, 1, 1) == 0.1
    assert decide.decide(NOISE, [0.999], 1.0, 1, None, True)[0] == "keep"


def test_repeat_groups_from_a_constructed_ledger(tmp_path: Path):
    path = tmp_path / "results.tsv"
    rows = [
        ledger.Row("base", 1.00, "keep", "baseline", 0, runs=3, mean=1.01),
        ledger.Row("base", 1.02, "repeat", "repeat", 0, candidate=0),
        ledger.Row("base", 1.01, "repeat", "repeat", 0, candidate=0),
        ledger.Row("c1", 0.97, "discard", "x [mean of 2 runs]", 1, runs=2, mean=0.98),
        ledger.Row("c1", 0.99, "repeat", "repeat", 1, candidate=1),
        ledger.Row("c2", 0.90, "discard", "y", 2, runs=1),
    ]
    for r in rows:
        ledger.append(path, "val_bpb", r)
    groups = decide.repeat_groups(ledger.read_rows(path))
    assert sorted(sorted(g) for g in groups) == [[0.97, 0.99], [1.0, 1.01, 1.02]]
    assert ledger.decided_value(ledger.read_rows(path)[0]) == pytest.approx(1.01)


def test_every_run_of_the_best_counts_in_its_estimate(tmp_path: Path):
    path = tmp_path / "results.tsv"
    rows = [
        ledger.Row("base", 1.00, "keep", "baseline", 0, runs=2, mean=1.01),
        ledger.Row("base", 1.02, "repeat", "repeat of iteration 0", 0, candidate=0),
        ledger.Row("c1", 0.90, "keep", "a clear win", 1, runs=1),  # kept on one run
        ledger.Row("c2", 0.95, "discard", "y", 2, runs=1),
        ledger.Row("c1", 0.94, "repeat", "repeat of iteration 1 [health check]", 1, candidate=1),
        ledger.Row("c1", None, "crash", "repeat of iteration 1 [it crashed]", 1, candidate=1),
        ledger.Row("c1", 0.92, "repeat", "repeat of iteration 1 [health check]", 1, candidate=1),
    ]
    for r in rows:
        ledger.append(path, "val_bpb", r)
    read = ledger.read_rows(path)
    assert decide.runs_of(read, 1) == [0.90, 0.94, 0.92]
    assert decide.best_estimate(read, ledger.best_row(read)) == (pytest.approx(0.92), 3)
    # The kept run and its re-runs are one group of identical code, as is the baseline.
    assert sorted(sorted(g) for g in decide.repeat_groups(read)) == [[0.9, 0.92, 0.94], [1.0, 1.02]]


@pytest.mark.parametrize("gate", ["noise", "strict"])
def test_reruns_of_the_best_move_the_bar_under_the_noise_gate(repo: Path, tmp_path: Path, monkeypatch, gate: str):
    noisy(repo, tmp_path, monkeypatch, noise=0.01)
    script = [neutral(i) for i in range(5)]
    options = {"gate": gate, "baseline_runs": 2, "health_every": 2}
    cfg = resolve(repo, gate, {**options, "iterations": 3})
    driver.run(cfg, researcher=ScriptedResearcher(script[:3]))
    # The resumed run rebuilds the best's estimate from the ledger: health re-runs included.
    cfg = resolve(repo, gate, {**options, "iterations": 5})
    driver.run(cfg, resume=True, researcher=ScriptedResearcher(script[3:]))
    rows = ledger.read_rows(cfg.ledger_path)
    reruns = [r for r in rows if r["status"] == "repeat" and "health check" in r["description"]]
    assert len(reruns) == 2
    for it in (3, 5):  # the candidates that came after a health checkpoint
        row = next(r for r in rows if r["iteration"] == it and r["status"] != "repeat")
        before = rows[:rows.index(row)]
        best = ledger.best_row(before)
        if gate == "noise":  # the mean over every run of the best's code, its health re-runs included
            runs = decide.runs_of(before, best["iteration"])
            assert sum(1 for r in reruns if rows.index(r) < rows.index(row) and r["commit"] == best["commit"]) \
                == len(runs) - (best["runs"] or 1)
            expected = statistics.fmean(runs)
        else:  # strict: the best's recorded value, whatever the re-runs say
            expected = ledger.decided_value(best)
        assert row["best_before"] == pytest.approx(expected, abs=2e-6)


def noisy(repo: Path, tmp_path: Path, monkeypatch, noise: float = 0.01):
    monkeypatch.setenv("FAKE_NOISE", str(noise))
    monkeypatch.setenv("FAKE_COUNTER", str(tmp_path / "counter"))


def neutral(i: int):
    """A change that does nothing: the code differs (a comment), the true quality does not."""
    def step(task):
        from harness.agents import Proposal
        train = task.worktree / "train.py"
        train.write_text(train.read_text() + f"# neutral change {i}\n")
        return Proposal(f"neutral change {i}")
    return step


@pytest.mark.parametrize("gate", ["strict", "noise"])
def test_noise_gate_keeps_real_wins_not_noise(repo: Path, tmp_path: Path, monkeypatch, gate: str):
    noisy(repo, tmp_path, monkeypatch)
    script = [neutral(i) for i in range(12)] + [{"VALUE": 0.95}]
    cfg = resolve(repo, gate, {"gate": gate, "baseline_runs": 3, "confirm": 2, "iterations": len(script)})
    driver.run(cfg, researcher=ScriptedResearcher(script))
    rows = ledger.read_rows(cfg.ledger_path)
    primary = [r for r in rows if r["status"] != "repeat"]
    false_keeps = [r for r in primary[1:-1] if r["status"] == "keep"]
    if gate == "noise":
        # One unlucky baseline can still let one neutral change through; strict keeps many.
        assert len(false_keeps) <= 1
        assert primary[-1]["status"] == "keep"  # a 5-sigma win
        assert rows[0]["runs"] == 3 and rows[0]["sigma"] > 0
        assert [r["candidate"] for r in rows if r["status"] == "repeat"][:2] == [0, 0]
    else:
        assert len(false_keeps) >= 3  # strict keeps noise
    # HEAD is the best commit, and the best's decided value is what the summary says.
    best = ledger.best_row(rows)
    assert git(cfg.worktree, "rev-parse", "HEAD").startswith(best["commit"])


def test_borderline_win_is_confirmed_with_linked_rows(repo: Path, tmp_path: Path, monkeypatch):
    noisy(repo, tmp_path, monkeypatch, noise=0.01)
    cfg = resolve(repo, "b", {"baseline_runs": 3, "confirm": 2, "iterations": 1})
    # The measured baseline mean and sigma decide which value is borderline: compute it.
    driver.run(cfg, researcher=ScriptedResearcher([]), steps=0)
    rows = ledger.read_rows(cfg.ledger_path)
    base, sigma = rows[0]["mean"], rows[0]["sigma"]
    thr = decide.threshold(decide.GateSettings(), sigma, 1, 3)
    target = base - 1.5 * thr
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": round(target, 6), "MODE": "ok"}]))
    rows = ledger.read_rows(cfg.ledger_path)
    cand = [r for r in rows if r["iteration"] == 1]
    first, repeats = cand[0], cand[1:]
    # Noise may move the first run out of the band; only a run that landed in it is confirmed.
    if base - 2 * thr < first["metric"] < base - thr:
        assert [r["status"] for r in repeats] == ["repeat", "repeat"]
        assert [r["candidate"] for r in repeats] == [1, 1] and [r["seed"] for r in repeats] == [43, 44]
        assert first["runs"] == 3 and first["mean"] == pytest.approx(
            statistics.fmean([first["metric"]] + [r["metric"] for r in repeats]))
        assert all(r["train_s"] > 0 for r in repeats)


def test_duplicate_code_is_skipped_not_trained(repo: Path):
    cfg = resolve(repo, "d", {"baseline_runs": 1, "iterations": 3})
    # The third proposal, made on top of the second, recreates the first one's code exactly.
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 1.5}, {"VALUE": 0.5}, {"VALUE": 1.5}]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [r["status"] for r in rows] == ["keep", "discard", "keep", "skip"]
    assert rows[-1]["train_s"] is None and "already evaluated" in rows[-1]["description"]
    assert git(cfg.worktree, "rev-parse", "HEAD").startswith(rows[2]["commit"])


def test_rerun_command(repo: Path, tmp_path: Path, monkeypatch):
    noisy(repo, tmp_path, monkeypatch, noise=0.01)
    out = harness("rerun", "--repo", str(repo), "--repeat", "4").output
    assert "runs 4" in out and "mean" in out and "spread" in out
    sd = float(out.split(" sd ")[1].split()[0])
    assert 0.001 < sd < 0.05
    assert git(repo, "worktree", "list").count("\n") == 0  # the scratch worktree is gone
    assert git(repo, "status", "--porcelain") == ""


SET_VALUE = """import re, sys
path = sys.argv[1] + "/train.py"
src = open(path).read()
open(path, "w").write(re.sub(r"^VALUE = .*$", "VALUE = " + sys.argv[2], src, count=1, flags=re.M))
print("VALUE to " + sys.argv[2])
"""


def set_value_agent(tmp_path: Path, value: float) -> str:
    (tmp_path / "set_value.py").write_text(SET_VALUE)
    return f"cmd:{sys.executable} {tmp_path / 'set_value.py'} {{workdir}} {value}"


def test_a_discard_that_beats_the_best_says_it_was_within_the_noise(repo: Path, tmp_path: Path, monkeypatch):
    """Three noisy baseline runs set the bar; a candidate a little better than their mean is
    discarded, and its row (and the line `harness run` prints) says what it needed."""
    noisy(repo, tmp_path, monkeypatch, noise=0.01)  # reproducible: the baseline's runs, then the candidate's
    result = harness("run", "--repo", str(repo), "--tag", "n", "--agent", set_value_agent(tmp_path, 1.005),
                     "--iterations", "1", "--baseline-runs", "3")
    assert result.exit_code == 0, result.output
    row = next(r for r in ledger.read_rows(repo / "runs/n/results.tsv") if r["iteration"] == 1)
    thr = decide.threshold(GateSettings(), row["sigma"], 1, 3)
    assert row["status"] == "discard" and 0 < row["best_before"] - row["metric"] < thr  # better, not enough
    m = re.search(r"\[within the noise: needs < (\d\.\d{6})\]$", row["description"])
    assert m, row["description"]
    assert float(m.group(1)) == pytest.approx(row["best_before"] - thr, abs=2e-6)
    assert m.group(0) in result.output


def test_a_discard_under_min_delta_says_so_and_a_worse_one_says_nothing(repo: Path, tmp_path: Path):
    result = harness("run", "--repo", str(repo), "--tag", "d", "--agent", set_value_agent(tmp_path, 0.95),
                     "--iterations", "1", "--baseline-runs", "1", "--gate", "strict", "--min-delta", "0.1")
    assert result.exit_code == 0, result.output
    row = ledger.read_rows(repo / "runs/d/results.tsv")[1]
    assert row["status"] == "discard" and row["description"] == "VALUE to 0.95 [under --min-delta: needs < 0.900000]"
    result = harness("run", "--repo", str(repo), "--tag", "w", "--agent", set_value_agent(tmp_path, 1.5),
                     "--iterations", "1", "--baseline-runs", "1")
    row = ledger.read_rows(repo / "runs/w/results.tsv")[1]
    assert row["status"] == "discard" and row["description"] == "VALUE to 1.5"  # worse: nothing to explain


def test_why_discarded_names_the_bar_in_either_direction():
    up = GateSettings(gate="noise", direction="maximize")
    assert decide.why_discarded(up, [0.51], 0.5, 0.02) == "within the noise: needs > 0.520000"
    assert decide.why_discarded(up, [0.49], 0.5, 0.02) == ""
    assert decide.why_discarded(NOISE, [0.99, 0.985], 1.0, 0.03) == "within the noise: needs < 0.970000"
