"""A new user's first night, done as the README says: each test repeats what the user did
(the CLI in-process or in a subprocess, real repos, tmux for the panes) and checks what they saw."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness import ledger

from conftest import FAKE_TRAIN, ROOT, git, make_repo
from fakes.helpers import harness, install_stand_ins

PY = sys.executable


def run_cli(*args, expect: int | None = 0, env: dict | None = None):
    result = harness(list(args), env=env)
    if expect is not None:
        assert result.exit_code == expect, result.output
    return result


def status_json(repo: Path, tag: str) -> dict:
    return json.loads(run_cli("status", tag, "--repo", repo, "--json").stdout)


# ---------------------------------------------------------------------------
# 1. A model names its researcher


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch):
    """The stand-in codex and claude CLIs first on PATH, a throwaway HOME, no API key."""
    bin_dir = install_stand_ins(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return bin_dir


def test_ab_with_two_models_runs_their_researcher_and_labels_arms_by_model(repo: Path, stand_ins):
    out = run_cli("ab", "--repo", repo, "--tag", "night", "--model-a", "gpt-5.4", "--model-b", "spark",
                  "--iterations", "1", "--baseline-runs", "1")
    said = " ".join(out.output.split())
    assert "--model-a gpt-5.4: researcher codex" in said
    assert "arm a: gpt-5.4 (codex)" in said and "arm b: gpt-5.3-codex-spark (codex)" in said
    setup = json.loads((repo / "runs/night/ab.json").read_text())
    assert {n: (a["agent"], a["model"]) for n, a in setup["arms"].items()} == {
        "a": ("codex", "gpt-5.4"), "b": ("codex", "gpt-5.3-codex-spark")}
    for arm in "ab":
        rows = [r for r in ledger.read_rows(repo / f"runs/night/{arm}/results.tsv") if r["iteration"]]
        assert rows and all(r["agent"] == "codex" for r in rows)
    summary = json.loads((repo / "runs/night/summary.json").read_text())
    assert [a["label"] for a in summary["arms"]] == ["gpt-5.4 (codex)", "gpt-5.3-codex-spark (codex)"]
    assert "gpt-5.4 (codex)" in (repo / "runs/night/report.md").read_text()


def test_a_model_with_the_offline_researcher_is_refused_saying_what_to_pass(repo: Path, stand_ins):
    out = run_cli("ab", "--repo", repo, "--tag", "x", "--agent", "mutate", "--model-a", "gpt-5.4", expect=1)
    assert "--agent codex" in out.output and "mutate" in out.output
    out = run_cli("run", "--repo", repo, "--tag", "y", "--agent", "mutate", "--model", "opus", expect=1)
    assert "--agent claude" in out.output
    assert not (repo / "runs").exists()


def test_a_model_whose_researchers_are_missing_says_what_to_install(repo: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = run_cli("run", "--repo", repo, "--tag", "y", "--model", "gpt-5.4", expect=1)
    assert "codex CLI" in out.output and "OPENAI_API_KEY" in out.output
    out = run_cli("run", "--repo", repo, "--tag", "y", "--model", "my-local-llm", expect=1)
    assert "--agent openai" in out.output


def test_same_researcher_on_both_arms_is_warned(repo: Path):
    out = run_cli("ab", "--repo", repo, "--tag", "same", "--iterations", "1", "--baseline-runs", "1")
    assert "both arms run the same researcher" in " ".join(out.output.split())


# ---------------------------------------------------------------------------
# 2 and 6. A failed baseline, --resume, and one sign for the improvement

SLOW_FIRST = '''
marker = os.environ.get("SLOW_FIRST_MARKER")
if marker and not os.path.exists(marker):  # the first run ever overruns its budget
    open(marker, "w").close()
    print("---")
    print("val_bpb: 7.999998")
    print("training_seconds: 99.0")
    print("peak_vram_mb: 1.0")
    sys.exit(0)
'''


def failed_baseline_repo(tmp_path: Path, monkeypatch) -> Path:
    source = FAKE_TRAIN.replace("time.sleep(SLEEP_S)\n", SLOW_FIRST + "time.sleep(SLEEP_S)\n", 1)
    source = source.replace("VALUE = 1.0", "VALUE = 7.34894")
    monkeypatch.setenv("SLOW_FIRST_MARKER", str(tmp_path / "first-run-done"))
    return make_repo(tmp_path / "research", train_source=source)


def test_failed_baseline_then_resume_gives_true_figures_everywhere(tmp_path: Path, monkeypatch):
    repo = failed_baseline_repo(tmp_path, monkeypatch)
    args = ["--repo", repo, "--tag", "fb", "--agent", "mutate", "--baseline-runs", "1"]
    first = run_cli("run", *args, "--iterations", "1", expect=1)
    assert "training_seconds 99.0" in first.output and "--resume" in first.output
    shown = run_cli("status", "fb", "--repo", repo, "--width", "200").stdout
    assert "baseline [training_seconds 99.0" in shown  # the row's reason, not eaten as markup
    out = run_cli("run", *args, "--iterations", "1", "--resume")
    rows = ledger.read_rows(repo / "runs/fb/results.tsv")
    assert [r["status"] for r in rows][:2] == ["invalid", "keep"]
    said = " ".join(out.output.split())
    assert "vs baseline 7.348940" in said and "1 experiments" in said
    assert "1 failed baseline attempt not counted" in said
    figs = status_json(repo, "fb")["figures"]
    assert figs["baseline"] == pytest.approx(7.34894) and figs["failed_baselines"] == 1
    assert figs["experiments"] == 1 and "invalid" not in figs["counts"]
    run_cli("report", repo / "runs/fb")
    arm = json.loads((repo / "runs/fb/summary.json").read_text())["arms"][0]
    assert arm["baseline"] == pytest.approx(7.34894) and arm["experiments"] == 1
    assert arm["improvement"] == pytest.approx(figs["improvement"])
    assert arm["counts"]["invalid"] == 0 and arm["failed_baselines"] == 1
    text = run_cli("status", "fb", "--repo", repo).stdout
    assert "1 failed" in text


def test_one_sign_for_the_improvement(repo: Path):
    """status, the summary, --json and the report agree: positive = better than the baseline."""
    out = run_cli("run", "--repo", repo, "--tag", "s", "--agent", "mutate", "--iterations", "4",
                  "--baseline-runs", "1")
    figs = status_json(repo, "s")["figures"]
    assert figs["improvement"] > 0 and figs["best"] < figs["baseline"]  # mutate finds VALUE 0.64 here
    shown = f"+{figs['improvement']:.6f}"
    assert f"improvement {shown}" in out.output
    assert f"improvement:   {shown}" in run_cli("status", "s", "--repo", repo).stdout
    run_cli("report", repo / "runs/s")
    arm = json.loads((repo / "runs/s/summary.json").read_text())["arms"][0]
    assert arm["improvement"] == pytest.approx(figs["improvement"])
    report_md = (repo / "runs/s/report.md").read_text()
    assert f"| improvement | {figs['improvement']:+.6g} |" in report_md
    assert all(k["improvement"] > 0 for k in arm["kept"])  # each kept change: positive = better
    assert "positive" in (ROOT / "docs/report.md").read_text().lower()


# ---------------------------------------------------------------------------
# karpathy/autoresearch's own reading of the ledger agrees with `harness status --json`

RESEARCHER = '''
import json, re, sys
from pathlib import Path
script = Path(sys.argv[1])
values = script.read_text().split()
script.write_text(" ".join(values[1:]))
train = Path(sys.argv[2]) / "train.py"
train.write_text(re.sub(r"^VALUE = .*$", f"VALUE = {values[0]}", train.read_text(), count=1, flags=re.M))
print(json.dumps({"description": f"use x[idx] not x[mask]: VALUE {values[0]}", "input_tokens": 1000,
                  "output_tokens": 100}))
'''


def karpathy_reader(path: Path) -> dict:
    """What karpathy/autoresearch's analysis notebook computes from results.tsv: the first kept
    row is the baseline, the later kept rows are the improvements, the val_bpb column the value."""
    import pandas as pd
    df = pd.read_csv(path, sep="\t")
    df["val_bpb"] = pd.to_numeric(df["val_bpb"], errors="coerce")
    df["status"] = df["status"].str.strip().str.upper()
    kept = df[df["status"] == "KEEP"].copy()
    kept["delta"] = kept["val_bpb"].shift(1) - kept["val_bpb"]
    return {"baseline": float(kept.iloc[0]["val_bpb"]), "best": float(kept["val_bpb"].min()),
            "improvement": float(kept.iloc[1:]["delta"].sum()), "improvements": len(kept) - 1}


def test_karpathy_reader_agrees_with_status_json(tmp_path: Path, monkeypatch):
    """A failed baseline, baseline repeats and confirmation runs (noise), a skip, two resumes."""
    repo = failed_baseline_repo(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_NOISE", "0.001")
    monkeypatch.setenv("FAKE_COUNTER", str(tmp_path / "counter"))
    (tmp_path / "researcher.py").write_text(RESEARCHER)
    (tmp_path / "script").write_text("7.1 7.9 7.9 6.9")  # keep, discard, skip (same code), keep
    agent = f"cmd:{PY} {tmp_path / 'researcher.py'} {tmp_path / 'script'} {{workdir}}"
    args = ["--repo", repo, "--tag", "k", "--agent", agent, "--baseline-runs", "2", "--confirm", "1"]
    run_cli("run", *args, "--iterations", "2", expect=1)  # the baseline overran its budget
    out = run_cli("run", *args, "--iterations", "2", "--resume")
    assert "use x[idx] not x[mask]" in out.output  # a description printed literally
    run_cli("run", *args, "--iterations", "4", "--resume")
    path = repo / "runs/k/results.tsv"
    statuses = [r["status"] for r in ledger.read_rows(path)]
    assert statuses[0] == "invalid" and "skip" in statuses and "repeat" in statuses and "discard" in statuses
    theirs = karpathy_reader(path)
    ours = status_json(repo, "k")["figures"]
    assert ours["baseline"] == pytest.approx(theirs["baseline"], abs=1e-9)
    assert ours["best"] == pytest.approx(theirs["best"], abs=1e-9)
    assert ours["improvement"] == pytest.approx(theirs["improvement"], abs=1e-9)
    assert ours["counts"]["keep"] == theirs["improvements"] == 2
    # the baseline was measured twice with noise: the metric column holds their mean
    rows = ledger.read_rows(path)
    assert rows[1]["mean"] is not None and rows[1]["metric"] != rows[1]["mean"]
    # and the failed attempt is not part of the noise floor nor of the best's value after the resume
    assert max(r["sigma"] or 0 for r in rows) < 0.01


# ---------------------------------------------------------------------------
# 4. Negative and zero limits


@pytest.mark.parametrize("flag,value,says", [
    ("--hours", "-1", "--hours must be a positive number of hours"),
    ("--hours", "0", "--hours must be a positive number of hours"),
    ("--iterations", "-2", "--iterations must be a positive number"),
    ("--iterations", "0", "--iterations must be a positive number"),
    ("--max-cost", "-1", "--max-cost must be a positive amount"),
    ("--max-tokens", "0", "--max-tokens must be a positive number"),
    ("--z", "0", "--z must be a positive number"),
    ("--confirm", "-1", "--confirm must be an integer >= 0"),
    ("--baseline-runs", "0", "--baseline-runs must be an integer >= 1"),
    ("--time-budget", "-5", "--time-budget must be a positive number"),
    ("--max-steps", "0", "--max-steps must be a positive number of steps"),
    ("--request-timeout", "0", "--request-timeout must be > 0"),
])
def test_bad_limits_are_refused_before_anything_runs(repo: Path, flag: str, value: str, says: str):
    out = run_cli("run", "--repo", repo, "--tag", "lim", "--agent", "mutate", "--iterations", "1", flag, value,
                  expect=1)
    assert says in " ".join(out.output.split())
    assert not (repo / "runs").exists() and "autoresearch/lim" not in git(repo, "branch")


def test_bad_limits_in_the_settings_file_are_refused_too(tmp_path: Path):
    repo = make_repo(tmp_path / "r", extra="z = 0\n")
    out = run_cli("run", "--repo", repo, "--tag", "lim", "--agent", "mutate", expect=1)
    assert "harness.toml" in out.output and "'z' must be a positive number" in out.output
    ab = run_cli("ab", "--repo", make_repo(tmp_path / "ok"), "--tag", "lim", "--hours", "-1", expect=1)
    assert "--hours must be a positive number" in ab.output and not (tmp_path / "ok/runs").exists()


# ---------------------------------------------------------------------------
# 5. Text is printed literally


def test_init_prints_its_notes_literally(tmp_path: Path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text("print('hi')\n")
    (plain / "pyproject.toml").write_text('[project]\nname = "p"\n')
    out = run_cli("init", "--repo", plain)
    assert f"added [tool.harness] to {plain / 'pyproject.toml'}" in " ".join(out.output.split())


# ---------------------------------------------------------------------------
# 7. `harness status` on an A/B tag; the list of runs


def test_status_of_an_ab_tag_shows_both_arms_side_by_side(repo: Path):
    run_cli("ab", "--repo", repo, "--tag", "ab4", "--agent", "mutate", "--iterations", "2",
            "--baseline-runs", "1")
    text = run_cli("status", "ab4", "--repo", repo, "--width", "80").stdout
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    header = next(line for line in lines if "arm a" in line)
    assert "arm b" in header  # side by side
    assert any(line.startswith("improvement") and line.count("+") + line.count("-") >= 2 for line in lines)
    data = status_json(repo, "ab4")
    half = run_cli("status", "ab4", "--repo", repo, "--width", "39").stdout.split("\n\n")[0].splitlines()
    assert all(len(line) <= 39 for line in half)
    figures_block = half[half.index(next(line for line in half if line.startswith("baseline"))):]
    assert not any("…" in line for line in figures_block), half  # a narrow column shows whole figures
    for arm in data["arms"].values():
        f = arm["figures"]
        assert any(f"{f['experiments']}, keep {f['keep_rate']:.0%}" in line for line in half), half
        assert sum(f"{k} {v}" in " ".join(half) for k, v in f["counts"].items()) == len(f["counts"]), half
    assert data["kind"] == "ab" and set(data["arms"]) == {"a", "b"}
    assert all(a["figures"]["experiments"] == 2 for a in data["arms"].values())
    assert status_json(repo, "ab4/a")["figures"] == data["arms"]["a"]["figures"]
    listed = run_cli("status", "--repo", repo).stdout
    assert "ab4/a" in listed and "ab4/b" in listed
    assert run_cli("status", "nope", "--repo", repo, expect=1).output.count("--watch") == 1


# ---------------------------------------------------------------------------
# 8 (the resume part). A resume may change limits, not what is measured


def test_resume_refuses_a_changed_budget_and_records_changed_limits(repo: Path):
    args = ["--repo", repo, "--tag", "r", "--agent", "mutate", "--baseline-runs", "1"]
    run_cli("run", *args, "--iterations", "1", "--time-budget", "4")
    out = run_cli("run", *args, "--iterations", "2", "--time-budget", "8", "--resume", expect=1)
    assert "time_budget 4.0 -> 8.0" in out.output and "--time-budget" in out.output
    out = run_cli("run", *args, "--iterations", "2", "--gate", "strict", "--resume", expect=1)
    assert "gate 'noise' -> 'strict'" in out.output
    assert len(ledger.read_rows(repo / "runs/r/results.tsv")) == 2  # nothing trained
    run_cli("run", *args, "--iterations", "2", "--resume")  # the run's own budget, without repeating it
    assert len([r for r in ledger.read_rows(repo / "runs/r/results.tsv") if r["iteration"]]) == 2
    happened = [json.loads(line) for line in (repo / "runs/r/events.log").read_text().splitlines()]
    assert any(e["kind"] == "resume_settings" and "iterations 1 -> 2" in e["message"] for e in happened)


# ---------------------------------------------------------------------------
# 9. `harness init` on a karpathy/autoresearch checkout

KARPATHY_PROGRAM = textwrap.dedent("""\
    # autoresearch
    Run the baseline with `uv run train.py > run.log 2>&1`, then record it in results.tsv.
    If the result improved, keep the commit; otherwise git reset back to where you started.
    LOOP FOREVER: never stop to ask the human.
    """)


def test_init_on_a_karpathy_checkout_supersedes_its_loop(tmp_path: Path):
    kp = tmp_path / "kp"
    kp.mkdir()
    for name in ("train.py", "prepare.py", "uv.lock"):
        (kp / name).write_text("# x\n")
    (kp / "program.md").write_text(KARPATHY_PROGRAM)
    (kp / "pyproject.toml").write_text('[project]\nname = "autoresearch"\nversion = "0.1.0"\n')
    git(kp, "init", "-q", "-b", "master")
    run_cli("init", "--repo", kp)
    program = (kp / "program.md").read_text()
    top, original = program.split("# The original program", 1)
    assert "Do not run training" in top and "do not loop" in top.lower() and "{{RESULTS}}" in top
    assert KARPATHY_PROGRAM in original  # kept for reference
    exclude = (kp / ".git/info/exclude").read_text().split()
    assert "/runs/" in exclude and "/results.tsv" in exclude
    run_cli("init", "--repo", kp)  # a second init leaves it as it is
    assert (kp / "program.md").read_text() == program


# ---------------------------------------------------------------------------
# Every commit on the ledger stays reachable; the default tag is unique


def test_every_ledger_commit_survives_gc(repo: Path):
    run_cli("run", "--repo", repo, "--tag", "g", "--agent", "mutate", "--iterations", "4", "--baseline-runs", "1")
    rows = ledger.read_rows(repo / "runs/g/results.tsv")
    assert any(r["status"] == "discard" for r in rows)
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/autoresearch/g/tried").split()
    assert refs == [f"refs/autoresearch/g/tried/{i:04d}" for i in range(1, 5)]
    assert not any(b.strip().startswith("autoresearch/g/") for b in git(repo, "branch", "-a").splitlines())
    git(repo, "reflog", "expire", "--expire=now", "--all")
    git(repo, "gc", "--prune=now", "-q")
    for r in rows:
        git(repo, "cat-file", "-e", f"{r['commit']}^{{commit}}")  # raises if gc deleted it


def test_tried_refs_are_packed_so_listing_them_stays_one_file(repo: Path):
    """Every PACK_REFS_EVERY-th tried ref packs the loose ones: the git guard lists refs twice an
    iteration, and a night of loose refs would make that one file read per candidate. The
    commit-graph is written then too."""
    from harness.gitgate import PACK_REFS_EVERY, Worktree
    wt = Worktree(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    for i in range(1, PACK_REFS_EVERY + 3):
        wt.keep_reachable("p", i, head)
    loose = sorted(p.name for p in (repo / ".git/refs/autoresearch/p/tried").glob("*"))
    assert loose == [f"{i:04d}" for i in (PACK_REFS_EVERY + 1, PACK_REFS_EVERY + 2)]
    assert f"refs/autoresearch/p/tried/{1:04d}" in (repo / ".git/packed-refs").read_text()
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/autoresearch/p/tried").split()
    assert len(refs) == PACK_REFS_EVERY + 2  # all still there, packed or loose
    # and the commit-graph that keeps the baseline check's walk through the kept commits short
    graph = repo / ".git/objects/info/commit-graph"
    assert graph.is_file() and graph.read_bytes()[:4] == b"CGPH"
    git(repo, "commit-graph", "verify")


def test_the_ledger_is_read_again_when_it_changed_in_place(tmp_path: Path):
    """read_rows skips an unchanged file; an edit of the same size is still seen (its ctime moved)."""
    path = tmp_path / "results.tsv"
    path.write_text("iteration\tval_bpb\tstatus\n1\t1.5\tkeep\n")
    assert ledger.read_rows(path)[0]["metric"] == 1.5
    path.write_text("iteration\tval_bpb\tstatus\n1\t1.4\tkeep\n")
    assert ledger.read_rows(path)[0]["metric"] == 1.4


def test_two_runs_without_a_tag_the_same_day(repo: Path):
    run_cli("run", "--repo", repo, "--agent", "mutate", "--iterations", "1", "--baseline-runs", "1")
    run_cli("run", "--repo", repo, "--agent", "mutate", "--iterations", "1", "--baseline-runs", "1")
    assert len([p for p in (repo / "runs").iterdir() if (p / "results.tsv").exists()]) == 2


# ---------------------------------------------------------------------------
# 10. `harness status` beside a live run


# Every run after the first (the baseline) trains until the test lets it go: a candidate that is
# training for as long as the test looks at it, however slow the machine (no sleep to outlast).
HELD = """time.sleep(SLEEP_S)
if os.path.exists({first!r}):
    _until = time.monotonic() + 120  # a failed test never releases it: end anyway
    while os.path.exists({hold!r}) and time.monotonic() < _until:
        time.sleep(0.05)
else:
    open({first!r}, "w").close()
"""


def test_status_beside_a_live_run_shows_the_candidate_in_flight(tmp_path: Path):
    hold = tmp_path / "hold"  # while it exists, iteration 1's job trains
    hold.touch()
    held = HELD.format(first=str(tmp_path / "baseline-done"), hold=str(hold))
    repo = make_repo(tmp_path / "r", train_source=FAKE_TRAIN.replace("time.sleep(SLEEP_S)\n", held, 1))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([PY, "-m", "harness", "run", "--repo", str(repo), "--tag", "lv", "--agent", "mutate",
                             "--iterations", "1", "--baseline-runs", "1", "--time-budget", "30"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        journal, deadline = repo / "runs/lv/inflight-0a.json", time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if json.loads(journal.read_text()).get("phase") == "train":
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        shown = subprocess.run([PY, "-m", "harness", "status", "lv", "--repo", str(repo), "--width", "100"],
                               env=env, capture_output=True, text=True, timeout=60).stdout
        data = json.loads(subprocess.run([PY, "-m", "harness", "status", "lv", "--repo", str(repo), "--json"],
                                         env=env, capture_output=True, text=True, timeout=60).stdout)
    finally:
        hold.unlink()
        _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert "in flight: iteration 1" in shown and "waiting for --resume" not in shown
    assert "running, training iteration 1" in shown
    assert data["live"] is True and data["in_flight"][0]["iteration"] == 1
    after = json.loads(run_cli("status", "lv", "--repo", repo, "--json").stdout)
    assert after["live"] is False and after["waiting_for_resume"] == []


def test_the_eta_follows_the_lanes_the_cluster_offers(tmp_path: Path):
    """On Ray the lanes follow the cluster's slots: the panel's ETA divides by the live count."""
    import io
    from rich.console import Console
    from harness.cli.display import Display
    from harness.cli.watched import Watched
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    (run_dir / "results.tsv").write_text(
        "iteration\tval_bpb\tstatus\twall_s\n0\t1.0\tkeep\t60\n1\t1.1\tdiscard\t60\n")
    w = Watched(name="", label="mutate", run_dir=run_dir, iterations=11)
    display = Display(Console(file=io.StringIO()), [w], live=False)
    display("start", {"best": 1.0, "iteration": 1, "lanes": 2})
    assert w.eta_s(0.0, False) == pytest.approx(10 * 60 / 2)
    display("event", {"kind": "lanes", "message": "4 lane(s), was 2", "lanes": 4})
    assert w.eta_s(0.0, False) == pytest.approx(10 * 60 / 4)


def test_the_live_panel_cannot_deadlock_with_rich_s_refresh(tmp_path: Path):
    """rich's refresh thread holds the Live's lock while it asks for the panel; an event printed
    meanwhile must not hold the panel's lock while it waits for the Live's (it froze a tmux run)."""
    import io
    import threading
    from rich.console import Console
    from harness.cli.display import Display
    from harness.cli.watched import Watched
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    display = Display(console, [Watched(name="", label="mutate", run_dir=run_dir, iterations=3)], live=True)
    display.__enter__()
    printed = threading.Event()

    def refresh():  # what rich's refresh thread does, slowed down
        with display.live._lock:
            printed.wait(1.0)  # the event below arrives while the Live's lock is held
            display.panel()

    def event():
        display("baseline", {"commit": "a" * 40})
        printed.set()
    threads = [threading.Thread(target=f, daemon=True) for f in (refresh, event)]
    threads[0].start()
    time.sleep(0.2)
    threads[1].start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "the display deadlocked"  # (left hanging, daemons)
    display.__exit__(None, None, None)
    assert "baseline" in console.file.getvalue()
