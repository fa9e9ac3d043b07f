"""`harness elo`: the Bradley-Terry fit on simulated tournaments written as real results.tsv files
(known strengths), ties from the noise floor, the comparison graph, cost normalisation, karpathy
files, and the CLI on run folders that the harness itself made."""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

from harness.reporting import elo, elo_render
from harness.reporting.elo_data import EloInputError
from harness.errors import HarnessError
from harness.ledger import columns
from fakes.elo_sim import SimArm, commit_of, tournament, true_elo, write_ledger
from fakes.helpers import harness

from conftest import make_repo

FOUR = [SimArm("control", "mutate", None, 0.0), SimArm("small", "codex", "gpt-5.4-mini", 0.5, 2000, 0.001),
        SimArm("big", "codex", "gpt-5.4", 1.0, 10000, 0.01), SimArm("weak", "cmd", "m", -0.6, 500)]


def analyze(paths, **settings) -> dict:
    return elo.analyze([Path(p) for p in paths], elo.Settings(**settings))


def by_arm(result: dict) -> dict[str, dict]:
    return {a["arm"]: a for a in result["arms"]}


# ---------------------------------------------------------------------------
# The fit on simulated tournaments


def test_fit_recovers_order_and_anchored_values(tmp_path: Path):
    tournament(tmp_path, FOUR, workloads=3, repeats=8, seed=1)
    result = analyze([tmp_path], draws=300, level=0.99)  # calibration: the coverage test below
    arms = by_arm(result)
    assert len(result["tasks"]) == 24 and len(result["components"]) == 1
    assert result["components"][0]["anchor"] == "control"  # the mutate control arm
    assert arms["control"]["elo"] == pytest.approx(1000.0) and arms["control"]["ci"] == [1000.0, 1000.0]
    ranked = sorted(arms, key=lambda a: -arms[a]["elo"])
    assert ranked == ["big", "small", "control", "weak"]
    truth = true_elo(FOUR, "control")
    for name, arm in arms.items():
        lo, hi = arm["ci"]
        assert lo <= truth[name] <= hi, (name, arm["ci"], truth[name])
        assert arm["wins"] + arm["losses"] + arm["ties"] == arm["games"] == 3 * 24
    assert arms["big"]["win_rate"] > arms["small"]["win_rate"] > arms["weak"]["win_rate"]
    # Head to head: each pair met in all 24 tasks; the two sides' records mirror; they add up to the arm's.
    pairs = {(p["arm"], p["opponent"]): p for p in result["pairwise"]}
    assert len(pairs) == 12
    for (a, b), p in pairs.items():
        assert p["wins"] + p["losses"] + p["ties"] == 24
        assert (pairs[b, a]["wins"], pairs[b, a]["losses"], pairs[b, a]["ties"]) == (p["losses"], p["wins"], p["ties"])
    for name, arm in arms.items():
        assert sum(p["wins"] for (a, _), p in pairs.items() if a == name) == arm["wins"]
    assert pairs["big", "weak"]["wins"] > pairs["big", "weak"]["losses"]
    big_weak = pairs["big", "weak"]
    section = elo_render.markdown(result).split("## Head to head", 1)[1].split("##", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith("| big |"))
    assert f"{big_weak['wins']}-{big_weak['losses']}-{big_weak['ties']}" in row


def test_intervals_cover_the_true_differences(tmp_path: Path):
    """Across many simulated tournaments, 90% intervals cover the true Elo about 90% of the time."""
    arms = [SimArm("control", "mutate", None, 0.0), SimArm("good", "codex", "g", 0.6),
            SimArm("bad", "cmd", "b", -0.4), SimArm("twin", "claude", "c", 0.0)]
    truth = true_elo(arms, "control")
    covered = total = 0
    for s in range(16):
        root = tmp_path / f"t{s}"
        tournament(root, arms, workloads=2, repeats=6, seed=100 + s)
        for arm in analyze([root], draws=100, level=0.9, points=(1.0,))["arms"]:
            if arm["arm"] != "control":
                lo, hi = arm["ci"]
                covered += lo <= truth[arm["arm"]] <= hi
                total += 1
    assert 0.75 <= covered / total <= 0.99, covered / total


def test_identical_arms_get_an_interval_that_includes_zero(tmp_path: Path):
    arms = [SimArm("one", "codex", "gpt-5.4", 0.3), SimArm("two", "claude", "opus", 0.3),
            SimArm("other", "cmd", "x", -0.5)]
    tournament(tmp_path, arms, workloads=2, repeats=8, seed=7)
    result = analyze([tmp_path], draws=300)
    assert result["components"][0]["anchor"] == "one"  # no mutate arm: the first
    lo, hi = by_arm(result)["two"]["ci"]
    assert lo < 1000 < hi


def test_an_arm_that_always_wins_gets_a_finite_elo(tmp_path: Path):
    arms = FOUR[:2] + [SimArm("oracle", "codex", "o", 40.0)]
    tournament(tmp_path, arms, workloads=2, repeats=4, seed=3)
    result = analyze([tmp_path], draws=200)
    oracle = by_arm(result)["oracle"]
    assert oracle["losses"] == 0 and oracle["win_rate"] == 1.0
    assert math.isfinite(oracle["elo"]) and oracle["elo"] > by_arm(result)["small"]["elo"] + 200
    assert all(math.isfinite(x) for x in oracle["ci"])
    json.dumps(result, allow_nan=False)


# ---------------------------------------------------------------------------
# Ties, the graph, cost


def two_arm_task(root: Path, gaps: list[float], with_repeats: bool) -> None:
    """Tasks where arm `y` beats `x` by gap; the baselines are repeated (sigma ~0.01) or not."""
    for t, gap in enumerate(gaps):
        commit = commit_of(f"tie {t}")
        for arm, final in (("x", 0.90), ("y", 0.90 - gap)):
            write_ledger(root / f"t{t}" / arm / "results.tsv", arm=arm, agent="codex", model=arm,
                         baseline_commit=commit, baseline=1.0, values=[("keep", final)],
                         baseline_repeats=(1.01, 0.99, 1.015) if with_repeats else ())


def test_gaps_within_the_noise_floor_are_ties(tmp_path: Path):
    two_arm_task(tmp_path / "noisy", [0.002, 0.003, 0.001], with_repeats=True)
    result = analyze([tmp_path / "noisy"], draws=100)
    sigma = statistics.stdev([1.0, 1.01, 0.99, 1.015])  # the baseline and its repeats
    assert all(t["sigma"] == pytest.approx(sigma) for t in result["tasks"])
    y = by_arm(result)["y"]
    assert (y["wins"], y["losses"], y["ties"]) == (0, 0, 3) and y["win_rate"] == 0.5
    assert y["elo"] == pytest.approx(1000, abs=1e-6)
    # The same gaps without a measured noise floor are wins; a gap beyond the floor is a win too.
    two_arm_task(tmp_path / "exact", [0.002, 0.003, 0.001], with_repeats=False)
    y = by_arm(analyze([tmp_path / "exact"], draws=100))["y"]
    assert (y["wins"], y["losses"], y["ties"]) == (3, 0, 0) and y["elo"] > 1000
    two_arm_task(tmp_path / "clear", [0.05, 0.002], with_repeats=True)
    y = by_arm(analyze([tmp_path / "clear"], draws=100))["y"]
    assert (y["wins"], y["ties"]) == (1, 1)


def test_a_disconnected_graph_is_reported_and_each_part_fitted_alone(tmp_path: Path):
    tournament(tmp_path / "left", FOUR[:2], workloads=1, repeats=3, seed=1)
    tournament(tmp_path / "right", [SimArm("p", "claude", "p", 0.0), SimArm("q", "claude", "q", 1.0)],
               workloads=1, repeats=3, seed=2)
    result = analyze([tmp_path / "left", tmp_path / "right"], draws=100)
    groups = result["components"]
    assert [g["arms"] for g in groups] == [["control", "small"], ["p", "q"]]
    assert [g["anchor"] for g in groups] == ["control", "p"]
    arms = by_arm(result)
    assert arms["control"]["elo"] == pytest.approx(1000) and arms["p"]["elo"] == pytest.approx(1000)
    assert arms["q"]["component"] == 1 and arms["small"]["component"] == 0
    assert any("not connected" in n and "{p, q}" in n for n in result["notes"])
    text = elo_render.markdown(result)
    assert "## Group 1: Ratings (anchor: control = 1000)" in text and "## Group 2: Ratings" in text


def ledger_with_tokens(path: Path, arm: str, commit: str, final: float, tokens: int) -> None:
    write_ledger(path, arm=arm, agent="codex", model=arm, baseline_commit=commit, baseline=1.0,
                 values=[("keep", final)], tokens_per_row=tokens)


def test_cost_is_normalised_per_task_so_a_long_task_does_not_dominate(tmp_path: Path):
    # x is cheap on the long task, y on the short one: per task they cost the same on average.
    for name, x_tok, y_tok in (("long", 1_000_000, 2_000_000), ("short", 20_000, 10_000)):
        commit = commit_of(name)
        ledger_with_tokens(tmp_path / name / "x" / "results.tsv", "x", commit, 0.9, x_tok)
        ledger_with_tokens(tmp_path / name / "y" / "results.tsv", "y", commit, 0.8, y_tok)
    arms = by_arm(analyze([tmp_path], draws=0))
    assert arms["x"]["tokens_per_task"] == pytest.approx(arms["y"]["tokens_per_task"])
    assert arms["x"]["tokens_per_task"] == pytest.approx((1_500_000 + 15_000) / 2)


def test_doubling_one_tasks_tokens_changes_no_elo_per_token_ranking(tmp_path: Path):
    results = []
    for k, length in enumerate((1.0, 2.0)):
        root = tmp_path / f"v{k}"
        tournament(root, FOUR, workloads=2, repeats=3, seed=5, task_length={1: length})
        results.append(by_arm(analyze([root], draws=0)))
    plain, doubled = results
    assert doubled["big"]["tokens_per_task"] != pytest.approx(plain["big"]["tokens_per_task"])

    def ranking(arms):
        return sorted((a for a in arms if arms[a]["elo_per_1k_tokens"] is not None),
                      key=lambda a: arms[a]["elo_per_1k_tokens"])
    assert ranking(plain) == ranking(doubled) and len(ranking(plain)) == 3
    for a in plain:
        assert doubled[a]["elo"] == pytest.approx(plain[a]["elo"])
        share = plain[a]["tokens_per_task"] / plain["big"]["tokens_per_task"]
        assert doubled[a]["tokens_per_task"] / doubled["big"]["tokens_per_task"] == pytest.approx(share)


def test_marginal_gain_table_is_ordered_by_cost(tmp_path: Path):
    tournament(tmp_path, FOUR, workloads=2, repeats=6, seed=11)
    result = analyze([tmp_path], draws=100)
    arms = by_arm(result)
    steps = result["marginal"]
    assert [s["arm"] for s in steps] == ["control", "weak", "small", "big"]  # by tokens per task
    assert steps[0]["vs"] is None and steps[2]["vs"] == "weak"
    d_tok = arms["small"]["tokens_per_task"] - arms["weak"]["tokens_per_task"]
    assert steps[2]["d_tokens"] == pytest.approx(d_tok)
    assert steps[2]["d_elo_per_1k_tokens"] == pytest.approx((arms["small"]["elo"] - arms["weak"]["elo"]) / d_tok * 1000)
    assert arms["big"]["elo_per_1k_tokens"] == pytest.approx((arms["big"]["elo"] - 1000) / 40.0)
    assert arms["control"]["elo_per_1k_tokens"] is None  # it spent no tokens
    text = elo_render.markdown(result)
    assert "Cost and marginal gain (cheapest in dollars first" in text  # every arm's dollars are known
    assert "| small | $0.0080 | 8.0k |" in text and "vs weak" in text
    # Per dollar only where the cost is known and not trivial: big spends $0.40 a task, small under a cent.
    assert arms["big"]["elo_per_usd"] == pytest.approx((arms["big"]["elo"] - 1000) / 0.4)
    assert (arms["small"]["elo_per_usd"], arms["small"]["elo_per_usd_note"]) == (None, "under $0.01/task")
    assert (arms["control"]["elo_per_usd"], arms["control"]["elo_per_usd_note"]) == (None, "the anchor")
    assert steps[3]["d_usd"] == pytest.approx(0.4 - 0.008)
    assert steps[3]["d_elo_per_usd"] == pytest.approx((arms["big"]["elo"] - arms["small"]["elo"]) / 0.392)
    assert steps[2]["d_elo_per_usd"] is None and steps[2]["d_elo_per_usd_note"] == "under $0.01/task more"
    row = next(line for line in text.splitlines() if line.startswith("| small | $0.0080"))
    assert "| under $0.01/task |" in row


def test_cli_cost_table_is_ordered_by_dollars_with_per_dollar_figures_only_where_they_mean_something(
        tmp_path: Path):
    """A long-winded cheap model (most tokens, fewest dollars) comes first; a model that spends a
    fraction of a cent gets no Elo/$ (it said -30806), an unpriced one sends the order to tokens."""
    commit = commit_of("dollars")
    arms = {"chatty": ("m-cheap", 0.95, 50_000, 0.02), "terse": ("m-dear", 0.93, 5_000, 0.50),
            "frugal": ("m-tiny", 0.97, 20_000, 0.0001)}
    for t in range(3):
        for arm, (model, final, tokens, usd) in arms.items():
            write_ledger(tmp_path / "d" / f"r{t}" / arm / "results.tsv", arm=arm, agent="codex", model=model,
                         baseline_commit=commit, baseline=1.0, repeat=t + 1, tokens_per_row=tokens,
                         usd_per_row=usd, values=[("discard", 1.01), ("keep", final + 0.001 * t)])
    result = harness(["elo", tmp_path / "d", "--anchor", "frugal", "--bootstrap", 100])
    assert result.exit_code == 0, result.output
    section = result.stdout.split("## Cost and marginal gain", 1)[1].split("##", 1)[0]
    assert section.startswith(" (cheapest in dollars first;")
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| arm")]
    assert [r.split(" | ")[0][2:] for r in rows] == ["frugal", "chatty", "terse"]  # $0.0002, $0.04, $1.00 a task
    assert [r.split(" | ")[2] for r in rows] == ["40.0k", "100.0k", "10.0k"]  # not the tokens' order
    cells = {r.split(" | ")[0][2:]: r.split(" | ")[5] for r in rows}
    assert cells["frugal"] == "the anchor"
    assert cells["chatty"].startswith("+") and cells["terse"].startswith("+")  # both beat the anchor
    assert "+Elo for +$" in section and "vs frugal" in rows[1]
    data = json.loads(harness(["elo", tmp_path / "d", "--anchor", "chatty", "--bootstrap", 0, "--json"]).stdout)
    frugal = by_arm(data)["frugal"]
    assert frugal["elo"] < 1000 and frugal["elo_per_usd"] is None and frugal["elo_per_usd_note"] == "under $0.01/task"
    assert data["components"][0]["cost_order"] == "usd"
    # An arm whose dollars are unknown (an unpriced model): ordered by tokens, and the heading says why.
    write_ledger(tmp_path / "d" / "r0" / "local" / "results.tsv", arm="local", agent="openai", model="q",
                 baseline_commit=commit, baseline=1.0, repeat=1, tokens_per_row=1000, usd_per_row=None,
                 values=[("keep", 0.99)])
    result = harness(["elo", tmp_path / "d", "--bootstrap", 0])
    assert "(fewest tokens first: the dollars of local are unknown;" in result.stdout
    assert "| local | unknown | " in result.stdout and "| cost unknown |" in result.stdout


# ---------------------------------------------------------------------------
# Inputs


def karpathy_tsv(path: Path, rows: list[tuple[str, float, str]]) -> None:
    path.parent.mkdir(parents=True)
    lines = ["commit\tval_bpb\tmemory_gb\tstatus\tdescription"]
    lines += [f"{c}\t{v:.6f}\t44.0\t{s}\t{'baseline' if i == 0 else 'try ' + str(i)}" for i, (c, v, s) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")


def test_five_column_karpathy_files_are_compared_by_experiments(tmp_path: Path):
    karpathy_tsv(tmp_path / "alpha" / "results.tsv",
                 [("a1b2c3d", 0.9979, "keep"), ("b2c3d4e", 0.9932, "keep"), ("c3d4e5f", 0.0, "crash")])
    karpathy_tsv(tmp_path / "beta" / "results.tsv",
                 [("a1b2c3d", 0.9980, "keep"), ("d4e5f6a", 1.0010, "discard"), ("e5f6a7b", 0.9990, "keep")])
    result = analyze([tmp_path / "alpha", tmp_path / "beta" / "results.tsv"], draws=50)
    arms = by_arm(result)
    assert set(arms) == {"alpha", "beta"} and len(result["tasks"]) == 1
    assert result["tasks"][0]["budget"] == "iterations"
    assert arms["alpha"]["wins"] == 1 and arms["alpha"]["elo"] > arms["beta"]["elo"]
    assert any("same number of experiments" in n for n in result["notes"])


def test_bad_inputs_get_clear_errors(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(EloInputError, match="no results.tsv"):
        analyze([tmp_path / "empty"])
    tournament(tmp_path / "t", FOUR[:2], workloads=1, repeats=2, seed=1)
    with pytest.raises(EloInputError, match="--anchor 'nobody'.*control, small"):
        analyze([tmp_path / "t"], anchor="nobody")
    with pytest.raises(EloInputError, match="unknown budget"):
        analyze([tmp_path / "t"], budget="minutes")
    commit = commit_of("dir")
    write_ledger(tmp_path / "d" / "x" / "results.tsv", arm="x", agent="codex", model="x", baseline_commit=commit,
                 baseline=1.0, values=[], direction="minimize")
    write_ledger(tmp_path / "d" / "y" / "results.tsv", arm="y", agent="codex", model="y", baseline_commit=commit,
                 baseline=1.0, values=[], direction="maximize")
    with pytest.raises(EloInputError, match="one direction"):
        analyze([tmp_path / "d"])
    assert issubclass(EloInputError, HarnessError)


def test_anchor_option_and_budget_points(tmp_path: Path):
    tournament(tmp_path, FOUR, workloads=1, repeats=6, seed=2)
    result = analyze([tmp_path], draws=50, anchor="big")
    assert by_arm(result)["big"]["elo"] == pytest.approx(1000)
    # At a quarter of the budget nobody has kept anything yet (the first keep is at iteration 2).
    assert set(result["by_budget"]) == {"0.25", "0.5", "0.75", "1"}
    assert all(v == pytest.approx(1000) for v in result["by_budget"]["0.25"].values())
    assert result["by_budget"]["1"]["small"] == pytest.approx(by_arm(result)["small"]["elo"])


# ---------------------------------------------------------------------------
# The CLI on run folders the harness made


TENFOLD_AGENT = (
    "import json, re\n"
    "src = open('train.py').read()\n"
    "value = float(re.search(r'^VALUE = ([0-9.e-]+)', src, re.M).group(1))\n"
    "open('train.py', 'w').write(re.sub(r'^VALUE = .*$', f'VALUE = {value / 10}', src, count=1, flags=re.M))\n"
    "print(json.dumps({'input_tokens': 1000, 'cached_tokens': 0, 'output_tokens': 200, 'cost_usd': 0.01,\n"
    "                  'description': f'VALUE to {value / 10}'}))\n")


@pytest.fixture
def tenfold(tmp_path: Path) -> str:
    script = tmp_path / "tenfold.py"
    script.write_text(TENFOLD_AGENT)
    return f"cmd:{sys.executable} {script}"


def test_cli_elo_on_separate_harness_runs_of_one_workload(tmp_path: Path, tenfold: str):
    repo = make_repo(tmp_path / "research")
    for tag, agent, seed in (("m1", "mutate", 1), ("c1", tenfold, 1), ("m2", "mutate", 2), ("c2", tenfold, 2)):
        model = ["--model", "m1"] if agent != "mutate" else []
        result = harness(["run", "--repo", repo, "--tag", tag, "--agent", agent, *model, "--seed", seed,
                          "--iterations", 3])
        assert result.exit_code == 0, result.output
    out = tmp_path / "elo"
    result = harness(["elo", repo / "runs", "--budget", "tokens", "--bootstrap", 50, "--json", "--out", out])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stdout is the data alone; progress went to stderr
    assert "ledgers" in result.stderr and "wrote" in result.stderr
    assert sorted(a["arm"] for a in data["arms"]) == ["cmd:m1", "mutate"]
    assert data["components"][0]["anchor"] == "mutate"  # the control arm, though not the first found
    assert [t["repeat"] for t in data["tasks"]] == [1, 2]  # the first run of each arm meets the first
    assert [sorted(Path(b["ledger"]).parent.name for b in t["best"].values()) for t in data["tasks"]] == \
        [["c1", "m1"], ["c2", "m2"]]
    arms = by_arm(data)
    assert arms["mutate"]["elo"] == pytest.approx(1000) and arms["cmd:m1"]["elo"] > 1000
    assert arms["cmd:m1"]["wins"] == 2 and arms["cmd:m1"]["tokens_per_task"] == pytest.approx(3600)
    assert [t["best"]["cmd:m1"]["value"] for t in data["tasks"]] == [pytest.approx(0.001)] * 2
    assert json.loads((out / "elo.json").read_text()) == data
    assert (out / "elo.md").read_text().startswith("# Elo of 2 arms over 2 tasks")
    assert (out / "best_so_far.png").read_bytes()[:4] == b"\x89PNG" and (out / "elo_vs_tokens.png").exists()
    # Two runs of one researcher are repeats, not rivals ...
    result = harness(["elo", repo / "runs" / "m1", repo / "runs" / "m2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [a["arm"] for a in data["arms"]] == ["mutate"] and data["arms"][0]["elo"] is None
    assert any("2 task(s) have one arm only" in n for n in data["notes"])
    # ... unless each run folder is its own arm.
    result = harness(["elo", repo / "runs" / "m1", repo / "runs" / "m2", "--arm-by", "folder", "--json"])
    data = json.loads(result.stdout)
    assert [a["arm"] for a in data["arms"]] == ["m1", "m2"] and len(data["tasks"]) == 1
    assert by_arm(data)["m1"]["games"] == 1 and by_arm(data)["m1"]["elo"] == pytest.approx(1000)
    # The default budget (GPU-hours) and the markdown on stdout.
    result = harness(["elo", repo / "runs" / "m1", repo / "runs" / "c1" / "results.tsv", "--bootstrap", 20])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Elo of 2 arms over 1 tasks")
    assert "| cmd:m1 | cmd | m1 | 1 | 1-0-0 | 100% |" in result.stdout


def test_cli_elo_on_an_ab_folder(tmp_path: Path, tenfold: str):
    repo = make_repo(tmp_path / "research")
    result = harness(["ab", "--repo", repo, "--tag", "night", "--agent-a", "mutate", "--agent-b", tenfold,
                      "--model-b", "m1", "--iterations", 2])
    assert result.exit_code == 0, result.output
    result = harness(["elo", repo / "runs" / "night", "--bootstrap", 20, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [a["arm"] for a in data["arms"]] == ["mutate", "cmd:m1"] and len(data["tasks"]) == 1
    assert by_arm(data)["cmd:m1"]["wins"] == 1
    # The A/B's own report carries the same ratings, in markdown and in HTML.
    run_dir = repo / "runs" / "night"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [a["elo"] for a in summary["elo"]["arms"]] == pytest.approx([a["elo"] for a in data["arms"]], abs=1e-6)
    md = (run_dir / "report.md").read_text()
    assert "## Elo across tasks" in md and "| cmd:m1 | cmd | m1 | 1 | 1-0-0 | 100% |" in md
    assert "<h2>Elo across tasks</h2>" in (run_dir / "report.html").read_text()
    result = harness(["elo", repo / "runs" / "night", "--anchor", "nobody"])
    assert result.exit_code == 1 and "the arms are: mutate, cmd:m1" in result.output


def test_maximized_metrics_and_unknown_costs(tmp_path: Path):
    commit = commit_of("accuracy")
    for arm, final, usd in (("x", 0.70, 0.02), ("y", 0.80, None)):
        write_ledger(tmp_path / arm / "results.tsv", arm=arm, agent="openai", model=arm, baseline_commit=commit,
                     baseline=0.5, values=[("keep", final)], tokens_per_row=1000, usd_per_row=usd,
                     metric="accuracy", direction="maximize")
    result = analyze([tmp_path], draws=0)
    arms = by_arm(result)
    assert arms["y"]["wins"] == 1 and arms["y"]["elo"] > arms["x"]["elo"]  # higher is better here
    assert arms["x"]["usd_per_task"] == pytest.approx(0.02)
    assert arms["y"]["usd_per_task"] is None and arms["y"]["elo_per_usd"] is None  # an unpriced model
    assert "| y | unknown | 1.0k |" in elo_render.markdown(result)


def test_arm_and_task_identity_rules(tmp_path: Path):
    commit = commit_of("ids")

    def put(folder: str, arm: str | None, model: str, final: float, repeat: int | None = None) -> None:
        write_ledger(tmp_path / folder / "results.tsv", arm=arm, agent="codex", model=model, baseline_commit=commit,
                     baseline=1.0, values=[("keep", final)], repeat=repeat)

    put("t1/fast", "fast", "gpt-5.4-mini", 0.9)  # one arm name for two different models
    put("t2/fast", "fast", "gpt-5.4", 0.8)
    put("plain", None, "gpt-5.4", 0.85)  # no arm name: agent:model
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "results.tsv").write_text("\t".join(columns("val_bpb")) + "\n")  # no baseline yet
    result = analyze([tmp_path], draws=0)
    assert [a["arm"] for a in result["arms"]] == ["codex:gpt-5.4", "fast (codex:gpt-5.4-mini)", "fast (codex:gpt-5.4)"]
    assert any("fresh" in n and "no measured baseline" in n for n in result["notes"])
    # Two ledgers that claim the same arm and repeat of one workload are refused.
    put("t3/fast", "fast", "gpt-5.4", 0.7, repeat=1)
    put("t4/fast", "fast", "gpt-5.4", 0.6, repeat=1)
    with pytest.raises(EloInputError, match="both arm fast"):
        analyze([tmp_path / "t3", tmp_path / "t4"])


# ---------------------------------------------------------------------------
# Calibrated intervals (benchmarks/elo_coverage.py) and the consistency of repeats


def coverage_benchmark():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import elo_coverage

    return elo_coverage


def test_the_coverage_benchmarks_smallest_configuration_is_what_harness_elo_runs(tmp_path: Path):
    """The benchmark fits arrays, `harness elo` ledgers: the same tournament gives the same intervals."""
    import numpy as np

    bench = coverage_benchmark()
    strengths, u = bench.simulate(2, 1, 2, np.random.default_rng(3))  # 2 arms, 1 workload, 2 repeats
    commit = commit_of("coverage")
    for t in range(u.shape[0]):
        for a in range(u.shape[1]):
            final = 1.0 - 0.1 / (1 + math.exp(-u[t, a]))  # better with u, as the benchmark's outcomes say
            write_ledger(tmp_path / f"r{t + 1}" / f"arm{a}" / "results.tsv", arm=f"arm{a}", agent="codex",
                         model=f"m{a}", baseline_commit=commit, baseline=1.0, repeat=t + 1,
                         values=[("discard", 1.01), ("keep", final)])
    default = elo.Settings()
    after = bench.METHODS["after"]
    assert (after.interval, after.weigh, after.jeffreys) == (default.interval, default.weigh, default.jeffreys)
    for name, method in {**bench.METHODS, **bench.BOOTSTRAP}.items():
        settings = dict(interval=method.interval, weigh=method.weigh, jeffreys=method.jeffreys)
        result = analyze([tmp_path], draws=300, level=0.9, points=(1.0,), **settings)
        assert [a["arm"] for a in result["arms"]] == ["arm0", "arm1"] and len(result["tasks"]) == 2
        draws = bench.draws_of(u, elo.Settings(draws=300, seed=0, **settings))
        expected = elo.intervals(draws, 0.9, 2)
        assert by_arm(result)["arm1"]["ci"] == pytest.approx(list(expected[1])), name
    cell = bench.cell(2, 1, 2, reps=10)
    assert set(cell) == {"before 90%", "before 95%", "after 90%", "after 95%"}
    assert all(0 <= v["coverage"] <= 1 and v["width"] > 0 and v["se"] > 0 for v in cell.values())
    assert cell["after 90%"]["width"] < cell["after 95%"]["width"]
    assert bench.cell(2, 1, 1, reps=3)["after 90%"] == {"coverage": None, "se": None, "width": None}  # one task
    s = bench.summary([cell, bench.cell(2, 1, 1, reps=3)], "after 90%", 0.9)
    assert s["cells"] == 1 and s["mean"] == cell["after 90%"]["coverage"]
    assert s["within"] == (abs(cell["after 90%"]["coverage"] - 0.9) <= bench.TARGET)


def test_one_task_says_no_interval_instead_of_a_zero_width_one(tmp_path: Path):
    tournament(tmp_path, FOUR[:2], workloads=1, repeats=1, seed=5)
    result = analyze([tmp_path], draws=200)
    assert [a["ci"] for a in result["arms"]] == [None, None]
    assert any(n.startswith(elo.ONE_TASK) for n in result["notes"])
    md = elo_render.markdown(result)
    ratings = md.split("## Ratings", 1)[1].split("##", 1)[0]
    assert ratings.count(elo.ONE_TASK) == 2


def test_consistency_of_repeats_per_pair_and_arm(tmp_path: Path):
    arms = [SimArm("control", "mutate", None, 0.0), SimArm("strong", "codex", "s", 3.0),
            SimArm("coin", "claude", "c", 0.0)]
    tournament(tmp_path, arms, workloads=1, repeats=6, seed=11)
    result = analyze([tmp_path], draws=100, points=(1.0,))
    c = result["consistency"]
    pairs = {frozenset((p["arm"], p["opponent"])): p for p in result["pairwise"]}
    for rate in c["pairs"]:
        p = pairs[frozenset((rate["arm"], rate["opponent"]))]
        assert rate["tasks"] == 6
        assert rate["rate"] == pytest.approx((max(p["wins"], p["losses"]) + p["ties"] / 2) / 6)
    assert c["most"] == "strong" and c["gap"] == pytest.approx(c["per_arm"]["strong"] - c["per_arm"][c["least"]])
    assert {s["arm"] for s in c["spread"]} == {"control", "strong", "coin"}
    assert all(s["repeats"] == 6 and s["min"] <= s["mean"] <= s["max"] for s in c["spread"])
    assert "## Consistency of repeats" in elo_render.markdown(result)


def test_two_arm_posterior_is_jeffreys_beta_posterior_on_the_win_rate():
    """With two arms the posterior's prior is Jeffreys' Beta(1/2, 1/2) on P(win) (times the fit's
    small normal): k wins of n give Beta(k + 1/2, n - k + 1/2) but for that normal, the binomial
    interval with the best coverage. The draws match that density, integrated on a grid."""
    import numpy as np

    from harness.reporting import elo_fit

    d = np.linspace(-30, 30, 600001)  # arm 0's log-odds over the anchor
    p_grid = 1 / (1 + np.exp(-d))
    for k, n in ((3, 3), (4, 5), (10, 24)):
        score = np.array([[0.0, k], [n - k, 0.0]])
        games = np.array([[0.0, n], [n, 0.0]])
        draws = elo_fit.posterior_elo(score, games, 1, 8000, seed=1)[:, 0]
        p = 1 / (1 + 10 ** (-(draws - 1000) / 400))  # arm 0's chance to beat the anchor
        # Beta(k + 1/2, n - k + 1/2) in d, times the normal prior on d = theta_0 - theta_1: N(0, 2 / l2).
        log = (k + 0.5) * np.log(p_grid) + (n - k + 0.5) * np.log1p(-p_grid) - d * d * elo_fit.L2_PENALTY / 4
        cdf = np.cumsum(np.exp(log - log.max()))
        cdf /= cdf[-1]
        for q in (0.05, 0.5, 0.95):
            assert np.quantile(p, q) == pytest.approx(p_grid[np.searchsorted(cdf, q)], abs=0.015), (k, n, q)
        plain = elo_fit.posterior_elo(score, games, 1, 8000, seed=1, jeffreys=False)[:, 0]
        if k == n:  # the normal prior alone leaves a unanimous record's lower end too high
            assert np.quantile(plain, 0.05) > np.quantile(draws, 0.05) + 50


def test_cli_elo_starts_without_the_run_machinery_scipy_or_matplotlib(tmp_path: Path):
    """`harness elo` took 33 s of CPU for six ledgers: a plain run imports neither the driver's
    machinery (lazy in cli/), nor scipy, nor matplotlib (only --out draws plots);
    benchmarks/elo_speed.py times it."""
    import subprocess

    tournament(tmp_path / "t", FOUR[:2], workloads=1, repeats=3, seed=4)
    probe = ("import sys\nfrom harness.cli import main\n"
             f"main(['elo', {str(tmp_path / 't')!r}, '--bootstrap', '50'], standalone_mode=False)\n"
             "heavy = ('scipy', 'matplotlib', 'sklearn', 'harness.driver.step', 'harness.executors', 'harness.agents.openai_api', "
             "'harness.agents.process', 'harness.agents.sandboxed', 'harness.agents.codex')\n"
             "print('LOADED', sorted(m for m in heavy if m in sys.modules))\n")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert run.returncode == 0, run.stderr
    assert "# Elo of 2 arms over 3 tasks" in run.stdout
    assert run.stdout.strip().splitlines()[-1] == "LOADED []"


def test_ranking_weight_is_what_a_ranking_of_the_arms_warrants():
    """A task's pairs come from one ranking (a strength plus Gumbel noise per arm): the weight is
    3 / (m + 1) for alike arms, 1 for two arms or arms far apart, and matches the score's
    variance simulated from rankings."""
    import numpy as np

    from harness.reporting import elo_fit

    for m in (2, 3, 4, 6):
        assert elo_fit.ranking_weight(np.zeros(m)) == pytest.approx(3 / (m + 1) if m > 2 else 1.0)
    assert elo_fit.ranking_weight(np.array([0.0, 10.0, 20.0, 30.0])) == pytest.approx(1.0, abs=1e-3)
    theta = np.array([0.0, 1.5, 3.0, -2.0, 4.5])
    rng = np.random.default_rng(5)
    u = theta + rng.gumbel(size=(200_000, len(theta)))
    score = np.zeros_like(u)
    h = np.zeros((len(theta), len(theta)))
    for a in range(len(theta)):
        for b in range(a + 1, len(theta)):
            p = 1 / (1 + np.exp(theta[b] - theta[a]))
            y = (u[:, a] > u[:, b]) - p
            score[:, a] += y
            score[:, b] -= y
            h[[a, b], [a, b]] += p * (1 - p)
            h[a, b] -= p * (1 - p)
            h[b, a] -= p * (1 - p)
    j = np.cov(score.T)
    basis = np.linalg.svd(np.eye(len(theta)) - 1 / len(theta))[0][:, :-1]
    inv = np.linalg.inv(np.linalg.cholesky(basis.T @ h @ basis))
    simulated = 1 / np.linalg.eigvalsh(inv @ basis.T @ j @ basis @ inv.T).max()
    assert elo_fit.ranking_weight(theta) == pytest.approx(simulated, rel=0.02)
    assert 3 / 6 < elo_fit.ranking_weight(theta) < 1
    # Never below the weight for alike arms (a close cluster among far ones can ask for less).
    assert elo_fit.ranking_weight(np.array([0.0, 0.2, 0.3, 2.5, -2.0])) == pytest.approx(3 / 6)
