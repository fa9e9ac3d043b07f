"""The report from ledgers alone: karpathy/autoresearch's five columns, noise-honest verdicts,
convergent findings from real diffs, and the HTML as headless Chromium renders it."""
from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from harness import ledger
from harness.reporting import report
from harness.errors import HarnessError
from harness.ledger import Row
from harness.reporting.report_diff import changed_names, names_at

from conftest import git

FIVE_COLUMNS = """commit\tval_bpb\tmemory_gb\tstatus\tdescription
a1b2c3d\t0.997900\t44.0\tkeep\tbaseline
b2c3d4e\t0.993200\t44.2\tkeep\tincrease LR to 0.04
c3d4e5f\t1.005000\t44.0\tdiscard\tswitch to GeLU activation
d4e5f6g\t0.000000\t0.0\tcrash\tdouble model width (OOM)
"""
CHROMIUM = Path("/usr/bin/chromium")


def write_ledger(path: Path, values: list[tuple[str, float | None]], base: float = 1.0,
                 agent: str = "scripted", train_s: float = 60.0, cost: float | None = 0.02,
                 sigma: float | None = None, model: str = "m") -> Path:
    """A ledger in the harness's schema: a baseline, then (status, value) experiments (each row
    recording the noise floor sigma, when given, as the noise gate does)."""
    best = base
    ledger.append(path, "val_bpb", Row(commit="0" * 12, metric=base, status="keep", description="baseline",
                                       iteration=0, train_s=train_s, wall_s=train_s + 1, agent=agent,
                                       started_at="2026-01-01T00:00:00Z", sigma=sigma))
    for i, (status, value) in enumerate(values, 1):
        ledger.append(path, "val_bpb", Row(
            commit=f"{i:012x}", metric=value, status=status, description=f"try {i}", iteration=i,
            agent=agent, model=model, best_before=best, delta=None if value is None else value - best,
            agent_s=30.0, train_s=train_s if value is not None else 5.0, wall_s=train_s + 40,
            input_tokens=20_000, cached_tokens=5_000, output_tokens=2_000, cost_usd=cost, sigma=sigma))
        if status == "keep":
            best = value
    return path


def ab_dir(root: Path, a: list, b: list, base_b: float = 1.0) -> Path:
    write_ledger(root / "a" / "results.tsv", a)
    write_ledger(root / "b" / "results.tsv", b, base=base_b)
    (root / "ab.json").write_text(json.dumps({"tag": root.name, "schedule": "interleave", "gpus": [],
                                              "baseline_commit": "0" * 40, "arms": {}}))
    return root


def test_karpathy_five_columns_unknown_is_never_zero(tmp_path: Path):
    path = tmp_path / "results.tsv"
    path.write_text(FIVE_COLUMNS)
    built = report.build([path])
    arm = built.summary["arms"][0]
    assert arm["experiments"] == 3 and arm["counts"]["keep"] == 1 and arm["counts"]["crash"] == 1
    assert arm["baseline"] == pytest.approx(0.9979) and arm["best"] == pytest.approx(0.9932)
    assert arm["improvement"] == pytest.approx(0.0047) and arm["acceptance_rate"] == pytest.approx(1 / 3)
    unknown = ["gpu_minutes_discarded_failed", "mean_agent_s", "mean_wall_s", "gpu_duty",
               "input_tokens_per_iteration", "cached_tokens_per_iteration", "output_tokens_per_iteration",
               "cost_usd", "improvement_per_gpu_hour", "improvement_per_1m_tokens", "improvement_per_usd",
               "agent", "model"]
    assert {k: arm[k] for k in unknown} == {k: None for k in unknown}
    md = built.markdown.read_text()
    for label in ("GPU-minutes on discarded and failed runs", "GPU duty", "cost", "improvement per dollar",
                  "input tokens per iteration", "improvement per GPU-hour"):
        line = next(line for line in md.splitlines() if line.startswith(f"| {label}"))
        assert line.endswith("| unknown |"), line
    # The crash's 0.000000 is karpathy/autoresearch's placeholder, not a result.
    assert arm["kept"] == [{"iteration": None, "commit": "b2c3d4e", "metric": pytest.approx(0.9932),
                            "delta": pytest.approx(-0.0047), "improvement": pytest.approx(0.0047),
                            "description": "increase LR to 0.04"}]
    assert "Unknown" in md  # convergent findings need a checkout with the commits
    assert (tmp_path / "report.html").exists() and (tmp_path / "summary.json").exists()


def test_a_relative_results_tsv_names_its_arm_and_plots_only_what_it_has(tmp_path: Path):
    """`harness report results.tsv` inside a run folder, as a user types it: the arm is named by
    its folder, and a five-column ledger (no wall time, tokens nor cost) gets no empty plots."""
    import os
    import sys

    from conftest import ROOT

    folder = tmp_path / "mar5"
    folder.mkdir()
    (folder / "results.tsv").write_text(FIVE_COLUMNS)
    out = subprocess.run([sys.executable, "-m", "harness", "report", "results.tsv"], cwd=folder, text=True,
                         capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    md = (folder / "report.md").read_text()
    assert "|  | mar5 |" in md and "### mar5" in md
    assert not re.search(r"^#+ *$", md, re.M) and "|  |  |" not in md  # no blank heading or header
    assert sorted(p.name for p in (folder / "plots").iterdir()) == ["experiments.png"]
    for what in ("wall time", "tokens", "cost"):
        assert f"No plot of the best against {what}: no ledger records it." in md
    assert "best_vs_" not in md and "best_vs_" not in (folder / "report.html").read_text()


def test_verdict_is_honest_about_noise(tmp_path: Path):
    good = [("keep", 0.95), ("keep", 0.9), ("keep", 0.85), ("discard", 0.9), ("keep", 0.8)]
    bad = [("discard", 1.1), ("crash", None), ("discard", 1.05), ("discard", 1.2), ("invalid", None)]
    clear = report.build([ab_dir(tmp_path / "clear", good, bad)]).summary["verdict"]
    assert clear["winner"] == "a" and clear["acceptance_ci95"][0] > 0
    # The same gap, but the baselines disagree by more than it: that is noise.
    noisy = report.build([ab_dir(tmp_path / "noisy", good, [("discard", 1.4)] * 5, base_b=1.3)])
    assert noisy.summary["verdict"]["winner"] is None
    assert "No clear winner" in noisy.markdown.read_text()
    # A small sample: the acceptance interval straddles zero.
    few = report.build([ab_dir(tmp_path / "few", [("keep", 0.9), ("discard", 1.0)], [("discard", 1.1)])])
    v = few.summary["verdict"]
    assert v["winner"] is None and v["acceptance_ci95"][0] <= 0 <= v["acceptance_ci95"][1]
    # The bootstrap is seeded: the same ledgers give the same interval.
    again = report.build([tmp_path / "few"]).summary["verdict"]
    assert again["acceptance_ci95"] == v["acceptance_ci95"]


def test_figures_and_mid_run(tmp_path: Path):
    root = tmp_path / "mid"
    write_ledger(root / "a" / "results.tsv", [("keep", 0.9), ("crash", None), ("discard", 1.1)], cost=None)
    built = report.build([root])  # b has not measured its baseline yet
    (arm,) = built.summary["arms"]
    assert arm["gpu_minutes_discarded_failed"] == pytest.approx((5 + 60) / 60)
    assert arm["gpu_duty"] == pytest.approx((60 * 3 + 5) / (61 + 100 * 3))
    assert arm["cost_usd"] is None and arm["improvement_per_usd"] is None  # unknown, not zero
    assert arm["improvement_per_1m_tokens"] == pytest.approx(0.1 / (3 * 22_000 / 1e6))
    assert arm["mean_agent_s"] == 30.0 and arm["input_tokens_per_iteration"] == 20_000
    assert built.summary["verdict"]["text"] == ["One run only: nothing to compare."]
    with pytest.raises(HarnessError, match="no results.tsv"):
        report.build([tmp_path / "nothing-here"])


def test_names_at_maps_changed_lines_to_globals_and_functions():
    source = "LR = 0.1  # rate\nclass Net:\n    def forward(self, x):\n        return x * 2\n\n" \
             "def train():\n    pass\nimport os\n"
    assert names_at(source, {1}) == ({"LR"}, set())
    assert names_at(source, {4}) == (set(), {"Net.forward"})
    assert names_at(source, {7, 8}) == (set(), {"train", "(module level)"})
    assert names_at("def broken(:\n", {1}) is None


def test_convergent_findings_from_real_diffs(tmp_path: Path):
    repo = tmp_path / "r"
    repo.mkdir()
    base = "LR = 0.1\nWIDTH = 64\n\n\ndef loss(x):\n    return x\n\n\ndef other():\n    return 1\n"
    (repo / "train.py").write_text(base)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    root = git(repo, "rev-parse", "HEAD")
    kept = {}
    for arm, text in (("a", base.replace("LR = 0.1", "LR = 0.2").replace("return x\n", "return x * 2\n")),
                      ("b", base.replace("LR = 0.1", "LR = 0.05").replace("WIDTH = 64", "WIDTH = 128")
                       .replace("return x\n", "return -x\n").replace("return 1", "return 2"))):
        git(repo, "checkout", "-q", "-B", arm, root)
        (repo / "train.py").write_text(text)
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", arm)
        kept[arm] = git(repo, "rev-parse", "HEAD")
    assert changed_names(repo, [(root, kept["b"])], ("train.py",)) == {
        "hyperparameters": ["LR", "WIDTH"], "code": ["loss", "other"]}
    assert changed_names(repo, [(None, "f" * 40)], ("train.py",)) is None
    run = tmp_path / "runs" / "cv"
    for arm in "ab":
        write_ledger(run / arm / "results.tsv", [("keep", 0.9)])
        text = (run / arm / "results.tsv").read_text().replace(f"{1:012x}", kept[arm][:12])
        (run / arm / "results.tsv").write_text(text)  # no parent column value: diffed against commit^
        (run / arm / "run.json").write_text(json.dumps({"config": {"editable": ["train.py"],
                                                                   "repo": str(repo)}}))
        shutil.copytree(repo / ".git", run / arm / "worktree" / ".git")
    conv = report.build([run]).summary["convergent"]
    assert conv["hyperparameters"] == ["LR"] and conv["code"] == ["loss"]
    assert conv["per_arm"]["b"]["hyperparameters"] == ["LR", "WIDTH"]


def test_html_renders_its_plots_in_headless_chromium(tmp_path: Path):
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing: install it with `apt-get install -y chromium` "
                    "to check the HTML report as a browser renders it")
    good = [("keep", 0.95), ("discard", 0.97), ("keep", 0.9), ("crash", None), ("keep", 0.85)]
    bad = [("discard", 1.1), ("keep", 0.98), ("discard", 1.05), ("timeout", None), ("discard", 1.2)]
    built = report.build([ab_dir(tmp_path / "run", good, bad)])
    text = built.html.read_text()
    assert not re.search(r'(src|href)\s*=\s*"(?!data:)', text)  # self-contained: no external URL
    png = tmp_path / "shot.png"
    subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
                    "--virtual-time-budget=10000",  # the shot once every image is loaded and painted
                    # the whole page: its height grows with the ledgers' paths it names (a long temporary
                    # folder wraps them onto more lines), and a shot 2400 high cut the last plot off
                    "--window-size=1200,6000", built.html.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    import numpy as np
    from matplotlib import image

    pixels = (image.imread(png)[:, :, :3] * 255).round().astype(int)
    inked = np.flatnonzero((pixels.std(axis=2) > 10).any(axis=1))
    assert inked.max() < pixels.shape[0] - 200, "the page is taller than the shot: raise --window-size"
    assert pixels.std() > 10  # not a blank page
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colours) > 200  # antialiased plot lines and markers, not only text

    def near(rgb: str) -> int:
        target = np.array([int(rgb[i:i + 2], 16) for i in (1, 3, 5)])
        return int((np.abs(pixels - target).max(axis=2) < 30).sum())

    assert near("#1f77b4") > 500 and near("#e377c2") > 500  # both arms' best-so-far lines
    assert near("#2ca02c") > 100  # kept experiments' markers


def test_the_verdict_never_names_a_winner_the_elo_does_not(tmp_path: Path):
    """Arm a improved more and kept more, but only after ten times the GPU time; at the GPU time both
    spent, b was better. The Elo says b; so the verdict must not name a."""
    from harness.ledger import Row
    run_dir = tmp_path / "runs" / "ab"

    def write(arm: str, model: str, rows: list[tuple[str, float, float]]) -> None:
        path = run_dir / arm / "results.tsv"
        for i, (status, value, train_s) in enumerate(rows):
            ledger.append(path, "val_bpb", Row(commit=f"{arm if i else 'c'}{i:011d}", metric=value, status=status,
                                               description="baseline" if i == 0 else f"try {i}", iteration=i,
                                               agent="x", model=model, train_s=train_s, wall_s=train_s,
                                               agent_s=None if i == 0 else 1.0, input_tokens=10, output_tokens=1))
    write("a", "model-a", [("keep", 1.0, 10), ("keep", 0.65, 100), ("keep", 0.3, 100)])
    write("b", "model-b", [("keep", 1.0, 10), ("keep", 0.85, 10), ("discard", 0.9, 10), ("discard", 0.95, 10),
                           ("discard", 0.99, 10)])
    (run_dir / "ab.json").write_text(json.dumps({"arms": {"a": {"agent": "x", "model": "model-a"},
                                                          "b": {"agent": "x", "model": "model-b"}}}))
    built = report.build([run_dir])
    verdict = built.summary["verdict"]
    elo = {a["arm"]: a["elo"] for a in built.summary["elo"]["arms"]}
    assert elo["x:model-b"] > elo["x:model-a"]
    assert verdict["winner"] is None and verdict.get("elo_disagrees")
    assert any(t.startswith("Elo across tasks") for t in verdict["text"])


def tournament_dir(root: Path, units: dict[tuple[str, int], list], agent: str = "cmd") -> Path:
    """A tournament's folder as `harness ab --arm ... --repeats R` leaves it: one unit per
    (arm, repeat) with its ledger and run.json, and ab.json naming each unit's arm and repeat."""
    arms = {}
    for (arm, k), values in units.items():
        unit = f"{arm}-r{k}"
        write_ledger(root / unit / "results.tsv", values, agent=agent)
        (root / unit / "run.json").write_text(json.dumps({"config": {"arm": arm, "repeat": k}}))
        arms[unit] = {"arm": arm, "repeat": k, "agent": agent, "researcher": agent, "model": None}
    (root / "ab.json").write_text(json.dumps({"tag": root.name, "schedule": "interleave", "gpus": [],
                                              "baseline_commit": "0" * 40, "repeats": 2, "arms": arms}))
    return root


def test_a_tournament_verdict_pools_repeats_and_compares_arms_only(tmp_path: Path):
    good = [("keep", 0.97), ("keep", 0.94), ("discard", 1.0), ("keep", 0.91), ("keep", 0.88), ("keep", 0.85)]
    meh = [("keep", 0.99), ("discard", 1.01), ("discard", 1.02), ("discard", 1.0), ("discard", 1.03), ("discard", 1.1)]
    run = tournament_dir(tmp_path / "t", {("good", 1): good, ("good", 2): good[:-1] + [("keep", 0.86)],
                                          ("meh", 1): meh, ("meh", 2): meh})
    built = report.build([run])
    v = built.summary["verdict"]
    assert v["ranked"] == ["good", "meh"]  # arms, never good-r1 against good-r2
    assert not v["mixed_scaffolds"] and "mixes scaffolds" not in built.markdown.read_text()
    assert v["winner"] == "good" and v["intervals"]["improvement"][0] > 0
    (table,) = [line for line in built.markdown.read_text().splitlines() if line.startswith("|  |")]
    assert table == "|  | good | meh |"  # one column per arm, not per repeat
    pooled = {p["label"]: p for p in built.summary["pooled"]}
    assert pooled["good"]["repeats"] == 2 and pooled["good"]["experiments"] == 12
    assert pooled["good"]["improvement"] == pytest.approx((0.15 + 0.14) / 2)
    assert pooled["meh"]["acceptance_rate"] == pytest.approx(2 / 12)


def test_a_big_improvement_gap_is_a_winner_and_a_skip_is_not_a_rejection(tmp_path: Path):
    """About 90 noise-floor sigmas apart; most of a's proposals were skips (code already tried)."""
    a = [("keep", 0.9775), ("skip", None), ("skip", None), ("keep", 0.955), ("skip", None), ("skip", None),
         ("keep", 0.9325), ("skip", None), ("skip", None), ("keep", 0.91), ("skip", None), ("skip", None)]
    b = [("keep", 0.999)] + [("discard", 1.002)] * 11
    root = tmp_path / "ab"
    write_ledger(root / "a" / "results.tsv", a, sigma=0.001, model="big")
    write_ledger(root / "b" / "results.tsv", b, sigma=0.001, model="small")
    (root / "ab.json").write_text(json.dumps({"tag": "ab", "arms": {}}))
    built = report.build([root])
    v = built.summary["verdict"]
    assert v["improvement_gap"] / 0.001 > 85
    arm_a = next(f for f in built.summary["arms"] if f["label"] == "a")
    assert arm_a["acceptance_rate"] == 1.0  # 4 keeps of 4 judged proposals; the 8 skips were never judged
    assert v["winner"] == "a", v["text"]
    assert v["intervals"]["improvement"][0] > 0 and v["better"]["improvement"] == "a"
    text = "\n".join(v["text"])
    assert "interval" in text and "No clear winner" not in text
    for figure in ("improvement_per_gpu_hour", "improvement_per_1m_tokens", "improvement_per_usd"):
        lo, hi = v["intervals"][figure]
        assert lo > 0 and v["better"][figure] == "a"  # named better only where the interval excludes zero
    # One A/B is one task: its Elo has no interval, and says so, rather than a zero-width one.
    md = built.markdown.read_text()
    assert not re.search(r"\[([+-]?[\d.]+), \1\]", md), "a zero-width interval"
    assert "one task: no interval" in md
    assert any(t.startswith("Elo across tasks") and "one task: no interval" in t for t in v["text"])


def test_a_tournament_whose_repeats_disagree_says_so(tmp_path: Path):
    def night(final: float) -> list:
        return [("discard", 1.01), ("keep", final), ("discard", 1.02)]

    run = tournament_dir(tmp_path / "t", {("wild", 1): night(0.70), ("wild", 2): night(0.999),
                                          ("steady", 1): night(0.81), ("steady", 2): night(0.79)})
    built = report.build([run])
    arms = built.summary["consistency"]["arms"]
    assert arms["wild"]["spread"]["min"] == pytest.approx(0.001) and arms["wild"]["spread"]["max"] == pytest.approx(0.3)
    assert arms["steady"]["spread"]["sd"] == pytest.approx(statistics.stdev([0.19, 0.21]))
    text = built.summary["verdict"]["text"]
    (line,) = [t for t in text if "disagree with each other" in t]
    assert line.startswith("wild's 2 repeats")  # 0.3 apart, while the arms' means are 0.0495 apart
    md = built.markdown.read_text()
    assert "## Consistency of repeats" in md and "same order across repeats" in md
    pair = built.summary["elo"]["consistency"]["pairs"][0]
    assert pair["tasks"] == 2 and pair["rate"] == 0.5  # wild won one repeat and lost the other


def test_a_night_and_its_live_display_read_the_headline_without_pandas(tmp_path: Path):
    """The live display reads the headline after every row of a night (figures.headline, plain
    Python over the rows): the supervisor of a whole run, summary included, never imports pandas
    (a frame per row was 6.5 ms at 21 rows, the import a quarter of a second); the figures are
    the ones `harness status` prints from the same ledger."""
    import sys

    from conftest import make_repo
    repo = make_repo(tmp_path / "research")
    code = ("import atexit, sys\natexit.register(lambda: print('PANDAS', 'pandas' in sys.modules))\n"
            "from harness.entry import main\nsys.argv = ['harness'] + sys.argv[1:]\nmain()\n")
    done = subprocess.run([sys.executable, "-c", code, "run", "--repo", str(repo), "--tag", "n", "--agent", "mutate",
                           "--iterations", "3", "--baseline-runs", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "PANDAS False" in done.stdout, done.stdout[-2000:]
    assert "experiments" in done.stdout + done.stderr  # the run's summary was printed
    from harness.reporting import figures
    rows = ledger.read_rows(repo / "runs" / "n" / "results.tsv")
    head = figures.headline(rows, "val_bpb")
    assert head.experiments == 3 and head.baseline == rows[0]["metric"]
    # the report's DataFrame mask is the same rule
    flags = figures.experiment_flags(rows)
    assert list(figures.experiment_mask(figures.frame(rows))) == flags and flags[0] is False and sum(flags) == 3
