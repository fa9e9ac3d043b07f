"""A tournament through the CLI: three arms, two repeats, two research repos, then `harness elo`
on the folders. Every unit of a task starts from the same baseline commit; the arms' ratings
come out in the order of what their researchers really do."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from harness import ledger
from harness.cli import main

from conftest import make_repo

AGENT = r'''
import json, re, sys
from pathlib import Path
train = Path(sys.argv[1]) / "train.py"
source = train.read_text()
value = float(re.search(r"^VALUE = (\S+)", source, re.M).group(1)) + float(sys.argv[2])
train.write_text(re.sub(r"^VALUE = \S+", f"VALUE = {value!r}", source, count=1, flags=re.M))
print(json.dumps({"description": f"VALUE {value:.3f}", "input_tokens": 100, "output_tokens": 10}))
'''
ARMS = {"good": -0.05, "meh": -0.01, "bad": 0.05}


def test_three_arms_two_repeats_two_workloads_then_elo(tmp_path: Path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    repos = [make_repo(tmp_path / "one"), make_repo(tmp_path / "two", extra="# another workload\n")]
    arms = [f"--arm={name}=cmd:{sys.executable} {script} {{workdir}} {delta}" for name, delta in ARMS.items()]
    runner = CliRunner()
    result = runner.invoke(main, ["ab", "--repo", str(repos[0]), "--workload", str(repos[1]), "--tag", "t",
                                  *arms, "--repeats", "2", "--iterations", "2", "--baseline-runs", "1",
                                  "--gate", "strict"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "harness elo" in result.stderr
    for repo in repos:
        run_dir = repo / "runs" / "t"
        setup = json.loads((run_dir / "ab.json").read_text())
        units = sorted(setup["arms"])
        assert units == sorted(f"{a}-r{k}" for a in ARMS for k in (1, 2))
        baselines = set()
        for unit in units:
            rows = ledger.read_rows(run_dir / unit / "results.tsv")
            assert [r["iteration"] for r in rows] == [0, 1, 2]
            assert {r["arm"] for r in rows} == {unit.rsplit("-r", 1)[0]}
            baselines.add(rows[0]["commit"])
            manifest = json.loads((run_dir / unit / "run.json").read_text())
            assert manifest["config"]["repeat"] == int(unit.rsplit("-r", 1)[1])
        assert len(baselines) == 1  # every unit of the workload from the same baseline commit
        seeds = {setup["arms"][u]["seed"] for u in units}
        assert len(seeds) == 2  # the repeats differ in their seeds, the arms of a repeat do not
    rated = runner.invoke(main, ["elo", *(str(r / "runs" / "t") for r in repos), "--json", "--bootstrap", "50",
                                 "--budget", "tokens"], catch_exceptions=False)
    assert rated.exit_code == 0, rated.output
    data = json.loads(rated.stdout)
    assert len(data["tasks"]) == 4  # two workloads x two repeats
    elo = {a["arm"]: a["elo"] for a in data["arms"]}
    assert elo["good"] > elo["meh"] > elo["bad"], elo
    # The repeats agree: every pair in the same order in all four tasks, each arm's spread per workload.
    consistency = data["consistency"]
    assert sorted((p["tasks"], p["rate"]) for p in consistency["pairs"]) == [(4, 1.0)] * 3
    assert consistency["gap"] == 0 and len(consistency["spread"]) == 6  # 3 arms x 2 workloads
    # The report pools each arm's two repeats: one column per arm, the arms compared, not repeats.
    summary = json.loads((repos[0] / "runs" / "t" / "summary.json").read_text())
    assert sorted(p["label"] for p in summary["pooled"]) == ["bad", "good", "meh"]
    assert summary["verdict"]["ranked"][0] == "good"
