"""Health checkpoints: a failing night stops with its cause; the best is re-trained; token spikes warned."""
from __future__ import annotations

import json
from pathlib import Path

from harness import ledger
from harness.driver import loop as driver
from harness.agents import Proposal, Usage
from harness.config.load import resolve

from conftest import ScriptedResearcher


def config(repo: Path, tag: str, **overrides):
    overrides.setdefault("baseline_runs", 1)
    return resolve(repo, tag, overrides)


def kinds(cfg) -> list[str]:
    return [json.loads(line)["kind"] for line in (cfg.run_dir / "events.log").read_text().splitlines()]


def test_a_failure_rate_over_30_percent_stops_at_the_checkpoint_naming_the_cause(repo: Path):
    cfg = config(repo, "rate", health_every=4, iterations=10)
    script = [{"VALUE": 0.9}, {"MODE": "crash"}, {"VALUE": 0.95}, {"MODE": "crash", "VALUE": 0.8}] + [{"VALUE": 0.5}] * 6
    summary = driver.run(cfg, researcher=ScriptedResearcher(script))
    assert summary.stopped.startswith("unhealthy: 2 of the last 4 iterations failed")
    assert "most often crash" in summary.stopped and "CUDA out of memory" in summary.stopped
    rows = ledger.read_rows(cfg.ledger_path)
    assert max(r["iteration"] for r in rows) == 4  # stopped before iteration 5
    health = [r for r in rows if r["status"] == "repeat"]
    assert len(health) == 1 and "health check at iteration 4: within the noise" in health[0]["description"]
    assert health[0]["candidate"] == 1 and health[0]["metric"] == 0.9  # the best, trained again
    # `harness status` shows the stop among the latest events
    from click.testing import CliRunner
    from harness.cli import main
    out = CliRunner().invoke(main, ["status", "rate", "--repo", str(repo)], catch_exceptions=False).output
    assert "events: 1" in out and "unhealthy: 2 of the last 4 iterations failed" in out
    # --on-unhealthy continue goes on, with the event on record
    cont = config(repo, "cont", health_every=4, iterations=6, on_unhealthy="continue")
    summary = driver.run(cont, researcher=ScriptedResearcher(script))
    assert summary.stopped == "reached --iterations 6" and "unhealthy" in kinds(cont)


DRIFTING = """import os
value = 0.9 + float(open(os.environ["DRIFT_FILE"]).read() or 0)
print("---")
print(f"val_bpb: {value:.6f}")
print("training_seconds: 0.1")
"""


def test_a_best_that_no_longer_reproduces_is_flagged_as_drift(repo: Path, tmp_path: Path, monkeypatch):
    drift = tmp_path / "drift"
    drift.write_text("0")
    monkeypatch.setenv("DRIFT_FILE", str(drift))

    def write(source, description, shift=None):
        def step(task):
            if shift is not None:
                drift.write_text(shift)  # the machine changes under the run (a slower GPU, new drivers)
            (task.worktree / "train.py").write_text(source)
            return Proposal(description)
        return step

    script = [write(DRIFTING, "drifting"), write(DRIFTING.replace("0.9", "0.95"), "worse"),
              write(DRIFTING.replace("0.9", "0.97"), "worse again", shift="0.5"), write(DRIFTING, "same")]
    cfg = config(repo, "drift", health_every=3, iterations=4)
    driver.run(cfg, researcher=ScriptedResearcher(script))
    rows = ledger.read_rows(cfg.ledger_path)
    health = [r for r in rows if r["status"] == "repeat"]
    assert len(health) == 1 and "drift +0.500000" in health[0]["description"]
    assert "beyond the noise" in health[0]["description"] and "drift" in kinds(cfg)


def test_a_token_spike_is_warned(repo: Path):
    def spend(tokens):
        def step(task):
            (task.worktree / "train.py").write_text((task.worktree / "train.py").read_text() + f"\n# {tokens}\n")
            return Proposal(f"spend {tokens}", Usage(tokens, 0, 0))
        return step

    cfg = config(repo, "tok", iterations=7)
    driver.run(cfg, researcher=ScriptedResearcher([spend(t) for t in (100, 110, 90, 100, 105, 1000, 100)]))
    events = [json.loads(line) for line in (cfg.run_dir / "events.log").read_text().splitlines()]
    assert [e["iteration"] for e in events if e["kind"] == "tokens"] == [6]


def test_health_checks_run_under_pipelining_and_lanes(repo: Path):
    """The scheduler for pipelined runs and GPU lanes re-trains the best and stops on a failure streak too."""

    cfg = config(repo, "lanes", health_every=3, iterations=20, gpus=("0", "1"), pipeline=True)
    script = [{"VALUE": 0.9}] + [{"MODE": "crash", "VALUE": round(0.5 + i / 100, 2)} for i in range(19)]
    summary = driver.run(cfg, researcher=ScriptedResearcher(script))
    assert summary.stopped.startswith("unhealthy: "), summary.stopped
    assert "crash" in summary.stopped and "CUDA out of memory" in summary.stopped
    rows = ledger.read_rows(cfg.ledger_path)
    health = [r for r in rows if r["status"] == "repeat" and "health check" in r["description"]]
    assert health and health[0]["metric"] in (0.9, 1.0)  # the best at that moment, trained again
    assert max(r["iteration"] for r in rows) < 20  # stopped well before the cap
    assert "unhealthy" in kinds(cfg)
