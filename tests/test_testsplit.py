"""The private test split (issue 24, item 1): the baseline and the best scored once on bytes no job,
researcher or decision sees, beside the validation figures; a foreign workload with and without a
test_command; kill -9 and --resume score nothing twice.

The bundled workload's night is real: train.py step-bounded on the CPU, the separate evaluator and
the test evaluator under bubblewrap. The trust boundary around the test bytes is in
tests/cheats/test_cheats_testsplit.py."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.driver import loop as driver
from harness import ledger
from harness.executors import warm
from harness.workload import testsplit
from harness.config.load import resolve

from conftest import FAKE_TRAIN, ScriptedResearcher, git, make_repo, small_example
from fakes.helpers import harness

MAX_STEPS = 5  # CPU steps: bit-identical from run to run
BIGGER_BATCH = {"BATCH_SIZE": 64}  # an honest edit that lowers val_bpb at MAX_STEPS on the CPU


def night_settings(**more) -> dict:
    return {"time_budget": 60, "max_steps": MAX_STEPS, "kill_after": 300, "baseline_runs": 1, "gate": "strict",
            "health_every": 0, "on_unhealthy": "continue", **more}


def figure_in(log: Path) -> float:
    """The val_bpb an evaluator printed in its own log (prepare.py's result block)."""
    return float(re.findall(r"^val_bpb: ([0-9.]+)$", log.read_text(), re.M)[-1])


# ---------------------------------------------------------------------------
# The bundled workload


READIED: list[str] = []  # the bundled night's warm interpreters (executors/warm.py): one per job after the first
HANDED: list[str] = []  # ... and those handed a job


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        start, hand_over = warm.start, warm.Warm.hand_over
        mp.setattr(warm, "start", lambda *a, **k: READIED.append(str(a[1])) or start(*a, **k))
        mp.setattr(warm.Warm, "hand_over", lambda self, *a, **k: HANDED.append(str(a[2])) or hand_over(self, *a, **k))
        repo = small_example(tmp_path_factory.mktemp("testsplit") / "example")
        cfg = resolve(repo, "night", night_settings(iterations=2))
        driver.run(cfg, researcher=ScriptedResearcher([BIGGER_BATCH, {"LOG_EVERY": 26}]))
        yield cfg


def test_a_night_scores_the_baseline_and_the_best_on_the_test_split_once(bundled):
    cfg = bundled
    rows = ledger.read_rows(cfg.ledger_path)
    keeps = [r for r in rows if r["status"] == "keep"]
    assert len(keeps) == 2, [(r["status"], r["description"]) for r in rows]  # the baseline and the bigger batch
    tests = testsplit.read(cfg.run_dir)
    assert [(t["commit"][:12], t["point"]) for t in tests] == [(keeps[0]["commit"], "baseline"),
                                                                (keeps[1]["commit"], "end")]
    for t, keep in zip(tests, keeps):
        # the same model as the ledger's: trained again with its seed, bit-identical under --max-steps
        assert t["val"] == keep["metric"] and t["val_rerun"] == keep["metric"], (t, keep)
        log = cfg.logs_dir / f"test-{t['commit'][:12]}.test.log"  # the separate test evaluator's own output
        assert figure_in(log) == pytest.approx(t["test"], abs=1e-6)
        assert abs(t["test"] - t["val"]) > 1e-4 and 1.0 < t["test"] < 8.0  # other bytes, a real figure
        assert t["note"] == ""
    assert "sandbox" in json.loads((cfg.run_dir / "run.json").read_text()) and \
        json.loads((cfg.run_dir / "run.json").read_text())["sandbox"] == "bwrap"


def test_each_job_after_the_first_starts_warm_and_none_is_readied_after_the_last(bundled):
    """Five jobs: the baseline, two candidates, the two test-split jobs (whose start is not the
    candidates': the first is cold). An interpreter is readied only for a job that uses it: none
    after the last candidate, none after the last test job (the run foresees no successor)."""
    rows = ledger.read_rows(bundled.ledger_path)
    assert [r["start"] for r in rows] == ["cold", "warm", "warm"]
    assert len(READIED) == 3 and len(HANDED) == 3, (READIED, HANDED)
    assert HANDED[-1].endswith(f"test-{testsplit.read(bundled.run_dir)[-1]['commit'][:12]}.log"), HANDED


def test_the_ledger_keeps_its_columns_and_no_decision_saw_a_test_figure(bundled):
    cfg = bundled
    header = cfg.ledger_path.read_text().split("\n", 1)[0].split("\t")
    assert header[:5] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert not any("test" in h for h in header)
    rows = ledger.read_rows(cfg.ledger_path)
    assert len(rows) == 3  # baseline + 2 iterations: the test jobs wrote no row
    figures = {f"{t['test']:.6f}" for t in testsplit.read(cfg.run_dir)}
    assert not any(f in cfg.ledger_path.read_text() for f in figures)
    assert "test-" not in cfg.ledger_path.read_text()


def test_the_report_shows_validation_beside_test(bundled, tmp_path):
    out = harness(["report", bundled.run_dir, "--out", tmp_path / "report"])
    assert out.exit_code == 0, out.output
    md = (tmp_path / "report" / "report.md").read_text()
    section = md.split("## Validation vs test", 1)[1].split("\n## ", 1)[0]
    tests = testsplit.read(bundled.run_dir)
    keeps = [r for r in ledger.read_rows(bundled.ledger_path) if r["status"] == "keep"]
    val_gain, test_gain = keeps[0]["metric"] - keeps[1]["metric"], tests[0]["test"] - tests[1]["test"]
    line = next(l for l in section.splitlines() if l.startswith("| night |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert float(cells[1]) == pytest.approx(val_gain, abs=1e-5)
    assert float(cells[2]) == pytest.approx(test_gain, abs=1e-5)
    assert float(cells[3]) == pytest.approx(val_gain - test_gain, abs=1e-5)
    assert cells[6] in ("carries", "does not carry")
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["arms"][0]["test_split"]["status"] == "scored"


# ---------------------------------------------------------------------------
# A foreign workload: test_command is its own, with the contract of evaluate_command

# The job saves its "model" (its VALUE) where the evaluators read it
SAVES = FAKE_TRAIN + ('\nif os.environ.get("HARNESS_OUTPUT_DIR"):\n'
                      '    open(os.path.join(os.environ["HARNESS_OUTPUT_DIR"], "model.txt"), "w").write(repr(VALUE))\n')
# The protected test scorer: a test figure that gets worse as the validation figure gets better
# (a night that fits its validation split), from the model the job saved
SCORER = ('import json, os\nvalue = float(open(os.path.join(os.environ["HARNESS_OUTPUT_DIR"], "model.txt")).read())\n'
          'json.dump({"val_bpb": 2.0 - value, "scorer_pid": os.getpid()}, open(os.environ["HARNESS_RESULT_FILE"], "w"))\n'
          'print("scored the test split:", 2.0 - value)\n')


def foreign(tmp_path: Path, with_test: bool) -> Path:
    extra = ('protected = ["prepare.py", "score_test.py"]\n'
             f'test_command = "{sys.executable} score_test.py"\n') if with_test else ""
    repo = make_repo(tmp_path / "foreign", train_source=SAVES, extra="")
    if with_test:
        (repo / "score_test.py").write_text(SCORER)
        text = (repo / "harness.toml").read_text().replace('protected = ["prepare.py"]\n', extra)
        (repo / "harness.toml").write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "a test scorer")
    return repo


def test_a_foreign_workload_without_test_command_is_validation_only(tmp_path: Path):
    repo = foreign(tmp_path, with_test=False)
    cfg = resolve(repo, "f", {"iterations": 2, "baseline_runs": 1, "gate": "strict", "health_every": 0})
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.8}, {"VALUE": 0.9}]))
    assert not testsplit.path_of(cfg.run_dir).exists()
    assert not list(cfg.logs_dir.glob("test-*"))  # nothing trained again
    out = harness(["report", cfg.run_dir])
    assert out.exit_code == 0, out.output
    md = (cfg.run_dir / "report.md").read_text()
    section = md.split("## Validation vs test", 1)[1].split("\n## ", 1)[0]
    assert "Validation-only: no workload here names a `test_command`" in section
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["arms"][0]["test_split"]["status"] == "validation-only"
    assert summary["arms"][0]["test_split"]["val_improvement"] == pytest.approx(0.2)


def test_a_foreign_test_command_scores_the_best_every_n_keeps_and_says_when_the_gain_does_not_carry(tmp_path: Path):
    repo = foreign(tmp_path, with_test=True)
    cfg = resolve(repo, "g", {"iterations": 3, "baseline_runs": 1, "gate": "strict", "health_every": 0,
                              "test_every": 1})
    assert cfg.test_command.endswith("score_test.py") and cfg.test_every == 1
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.8}, {"VALUE": 0.9}, {"VALUE": 0.6}]))
    tests = testsplit.read(cfg.run_dir)
    keeps = [r for r in ledger.read_rows(cfg.ledger_path) if r["status"] == "keep"]
    assert [k["metric"] for k in keeps] == [1.0, 0.8, 0.6]
    by_commit = {t["commit"][:12]: t for t in tests}
    assert set(by_commit) == {k["commit"] for k in keeps}  # each scored once: baseline, after keep 1, after keep 2
    for k in keeps:
        t = by_commit[k["commit"]]
        assert t["test"] == pytest.approx(2.0 - k["metric"]) and t["val"] == k["metric"]
    assert by_commit[keeps[1]["commit"]]["point"] == "every 1 keeps" and by_commit[keeps[1]["commit"]]["keeps"] == 1
    assert by_commit[keeps[2]["commit"]]["keeps"] == 2
    out = harness(["report", cfg.run_dir])
    md = (cfg.run_dir / "report.md").read_text()
    assert "| g | +0.4 | -0.4 | +0.8 | 1.000000 | 1.400000 | does not carry |" in md
    verdict = md.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "g: the validation gain does not carry to the test split" in verdict
    assert "after 1 keeps 1.200000, after 2 keeps 1.400000" in md


def test_test_command_and_test_every_are_checked_like_the_other_keys(tmp_path: Path):
    repo = make_repo(tmp_path / "r", extra='test_command = ""\n')
    with pytest.raises(Exception, match="config key 'test_command' must be a command line"):
        resolve(repo, "t", {})
    repo2 = make_repo(tmp_path / "r2")
    out = harness(["run", "--repo", repo2, "--test-every", "-1", "--iterations", "1"])
    assert out.exit_code != 0 and "--test-every must be an integer >= 0" in out.output


# ---------------------------------------------------------------------------
# kill -9 during the test scoring, then --resume: nothing scored twice


def test_kill_9_while_the_best_is_scored_then_resume_scores_each_commit_once(tmp_path: Path):
    repo = foreign(tmp_path, with_test=True)
    slow = (repo / "train.py").read_text().replace(  # only a test job has an output folder here
        'print(f"fake training,', 'import pathlib\nif os.environ.get("HARNESS_OUTPUT_DIR") and VALUE < 1.0:\n'
        '    pathlib.Path(os.environ["HARNESS_OUTPUT_DIR"], "best-training").write_text("")\n'
        '    time.sleep(float(os.environ.get("SLOW_BEST_S", "0")))\nprint(f"fake training,')
    (repo / "train.py").write_text(slow)
    git(repo, "commit", "-qam", "the best trains slowly when scored")
    script = tmp_path / "researcher.py"
    script.write_text('import re, sys\np = sys.argv[1] + "/train.py"\ns = open(p).read()\n'
                      'open(p, "w").write(re.sub(r"^VALUE = .*$", "VALUE = 0.5", s, count=1, flags=re.M))\n'
                      'print("lower VALUE")\n')
    argv = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", "k", "--iterations", "1",
            "--baseline-runs", "1", "--gate", "strict", "--health-every", "0",
            "--agent", f"cmd:{sys.executable} {script} {{workdir}}"]
    env = {**os.environ, "SLOW_BEST_S": "600"}
    run_dir = repo / "runs" / "k"
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list((run_dir / "logs").glob("test-*.job/out/best-training")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    rows_before = testsplit.read(run_dir)
    assert [r["point"] for r in rows_before] == ["baseline"]
    base_log = run_dir / "logs" / f"test-{rows_before[0]['commit'][:12]}.log"
    stamp = base_log.stat().st_mtime_ns
    env["SLOW_BEST_S"] = "0"
    done = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    after = testsplit.read(run_dir)
    assert [r["point"] for r in after] == ["baseline", "end"]
    assert base_log.stat().st_mtime_ns == stamp  # the baseline was not trained again
    keeps = [r for r in ledger.read_rows(run_dir / "results.tsv") if r["status"] == "keep"]
    assert [t["test"] for t in after] == pytest.approx([2.0 - k["metric"] for k in keeps])
    assert len(ledger.read_rows(run_dir / "results.tsv")) == 2


def test_the_tracker_gets_the_test_figures_once(tmp_path: Path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    repo = foreign(tmp_path, with_test=True)
    monkeypatch.chdir(tmp_path)
    out = harness(["run", "--repo", repo, "--tag", "tr", "--agent", "mutate", "--iterations", "3",
                   "--baseline-runs", "1", "--gate", "strict", "--health-every", "0", "--track", "mlflow"])
    assert out.exit_code == 0, out.output
    run_dir = repo / "runs" / "tr"
    scores = {t["commit"][:12]: t for t in testsplit.read(run_dir)}
    assert scores and all(t["test"] is not None for t in scores.values())
    harness(["track", run_dir])  # a back-fill afterwards logs nothing twice
    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'runs/mlflow.db'}")
    exp = client.get_experiment_by_name("tr")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("harness.split") == "test"]
    assert sorted(r.data.tags["commit"][:12] for r in runs) == sorted(scores)
    for r in runs:
        t = scores[r.data.tags["commit"][:12]]
        assert r.data.metrics["test_val_bpb"] == pytest.approx(t["test"])
        assert r.data.metrics["val_bpb"] == pytest.approx(t["val"])


def test_test_scores_changed_behind_the_harness_are_refused_then_scored_again(tmp_path: Path):
    repo = foreign(tmp_path, with_test=True)
    settings = {"iterations": 1, "baseline_runs": 1, "gate": "strict", "health_every": 0}
    cfg = resolve(repo, "t", settings)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.8}]))
    path = testsplit.path_of(cfg.run_dir)
    honest = path.read_text()
    path.write_text(honest.replace("\t1.200000\t", "\t0.100000\t"))  # a better test figure for the best
    out = harness(["report", cfg.run_dir])
    assert out.exit_code == 0, out.output
    md = (cfg.run_dir / "report.md").read_text()
    assert "refused: test_scores.tsv was changed after the harness wrote it" in md and "0.100000" not in md
    driver.run(resolve(repo, "t", settings), resume=True, researcher=ScriptedResearcher([]))
    assert path.read_text().split("\n")[1:] != [] and "0.100000" not in path.read_text()
    assert [t["test"] for t in testsplit.read(cfg.run_dir)] == pytest.approx([1.0, 1.2])
    assert (cfg.run_dir / "test_scores.tsv.tampered").read_text().count("0.100000") == 1
    assert "test_scores_refused" in (cfg.run_dir / "events.log").read_text()


def test_each_arm_of_an_ab_is_scored_and_the_ab_report_has_a_row_per_arm(tmp_path: Path):
    repo = foreign(tmp_path, with_test=True)
    out = harness(["ab", "--repo", repo, "--tag", "ab", "--agent", "mutate", "--iterations", "2",
                   "--baseline-runs", "1", "--gate", "strict", "--health-every", "0"])
    assert out.exit_code == 0, out.output
    run_dir = repo / "runs" / "ab"
    for arm in ("a", "b"):
        keeps = [r for r in ledger.read_rows(run_dir / arm / "results.tsv") if r["status"] == "keep"]
        scores = {t["commit"][:12]: t["test"] for t in testsplit.read(run_dir / arm)}
        assert scores == {k["commit"]: pytest.approx(2.0 - k["metric"]) for k in (keeps[0], keeps[-1])}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [a["test_split"]["status"] for a in summary["arms"]] == ["scored", "scored"]
    md = (run_dir / "report.md").read_text()
    section = md.split("## Validation vs test", 1)[1].split("\n## ", 1)[0]
    assert section.count("| a: no model (mutate) |") == 1 and section.count("| b: no model (mutate) |") == 1
