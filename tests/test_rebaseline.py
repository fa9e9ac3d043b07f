"""A failed baseline has a way out: the message names the commit it trained, where the fix goes and
the exact command; `--resume --rebaseline` trains the baseline again from the user's fixed HEAD with
the settings as they are now (a metric's name corrected included), and only while none succeeded."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from harness.ledger import events
from harness import ledger
from harness.cli import main

from conftest import git, make_repo

BROKEN = 'raise SystemExit("CUDA is not available on this machine")\n'
OTHER_NAME = 'print("---")\nprint("val_loss: 0.900000")\nprint("peak_vram_mb: 1.0")\n'
FIXED = 'print("---")\nprint("val_bpb: 0.800000")\nprint("peak_vram_mb: 1.0")\n'


def harness(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def commit(repo: Path, name: str, text: str, message: str) -> str:
    (repo / name).write_text(text)
    git(repo, "commit", "-qam", message)
    return git(repo, "rev-parse", "HEAD")


def test_a_failed_baseline_is_fixed_in_the_checkout_then_rebaselined(tmp_path):
    repo = make_repo(tmp_path / "r", train_source=BROKEN)
    first = git(repo, "rev-parse", "HEAD")
    failed = harness("run", "--repo", repo, "--tag", "n", "--agent", "mutate", "--iterations", 1, "--baseline-runs", 1)
    assert failed.exit_code != 0
    flat = " ".join(failed.output.split())
    assert f"It trained commit {first[:12]}" in flat and f"in your checkout {repo}" in flat
    assert "harness run --tag n --resume --rebaseline" in flat and "CUDA is not available" in flat
    # fixed in the user's checkout, but with the metric under another name: --resume alone retrains the
    # old commit; --rebaseline trains the new one and says the metric is the thing to set
    fixed = commit(repo, "train.py", OTHER_NAME, "train on the CPU")
    again = harness("run", "--repo", repo, "--tag", "n", "--agent", "mutate", "--iterations", 1, "--resume")
    assert again.exit_code != 0 and f"It trained commit {first[:12]}" in " ".join(again.output.split())
    renamed = harness("run", "--repo", repo, "--tag", "n", "--agent", "mutate", "--iterations", 1,
                      "--resume", "--rebaseline")
    assert renamed.exit_code != 0
    flat = " ".join(renamed.output.split())
    assert f"It trained commit {fixed[:12]}" in flat and "set `metric` in [tool.harness]" in flat
    settings = (repo / "harness.toml").read_text().replace('metric = "val_bpb"', 'metric = "val_loss"')
    commit(repo, "harness.toml", settings, "the metric's name")
    final = commit(repo, "train.py", OTHER_NAME.replace("0.900000", "0.700000"), "a better start")
    ok = harness("run", "--repo", repo, "--tag", "n", "--agent", "mutate", "--iterations", 1,
                 "--resume", "--rebaseline")
    assert ok.exit_code == 0, ok.output
    path = repo / "runs" / "n" / "results.tsv"
    rows = ledger.read_rows(path)
    keeps = [r for r in rows if r["status"] == "keep"]
    assert keeps[0]["commit"] == final[:12] and keeps[0]["metric"] == 0.7 and keeps[0]["description"] == "baseline"
    assert [r["status"] for r in rows[:3]] == ["crash", "crash", "crash"]  # the failed attempts stay, unused
    assert ledger.metric_name(path) == "val_loss"  # the header names the metric the run now uses
    assert path.read_bytes() == ledger.ledgerguard.shadow_path(path).read_bytes()  # its own copy agrees
    assert git(repo, "rev-parse", "autoresearch/n").startswith(keeps[-1]["commit"])
    kinds = [e["kind"] for e in events.read(repo / "runs" / "n")[0]]
    assert kinds.count("rebaseline") == 2
    refused = harness("run", "--repo", repo, "--tag", "n", "--agent", "mutate", "--iterations", 1,
                      "--resume", "--rebaseline")
    assert refused.exit_code != 0 and "only restarts one that failed" in refused.output
    alone = harness("run", "--repo", repo, "--tag", "m", "--agent", "mutate", "--rebaseline")
    assert alone.exit_code != 0 and "use it with --resume" in alone.output


def test_bad_flags_are_named_as_flags(tmp_path):
    repo = make_repo(tmp_path / "r")
    steps = harness("run", "--repo", repo, "--tag", "z", "--agent", "mutate", "--max-steps", 0)
    assert steps.exit_code != 0 and "--max-steps must be a positive number of steps, got 0" in steps.output
    assert "config key" not in steps.output
    repeats = harness("ab", "--repo", repo, "--model-a", "a", "--model-b", "b", "--repeats", 0)
    assert repeats.exit_code == 2 and "--repeats" in repeats.output and "x>=1" in repeats.output


def test_the_users_signing_and_hooks_do_not_run_on_the_harness_commits(tmp_path):
    """commit.gpgsign with a gpg that fails, and a pre-commit hook that refuses every commit: the
    user's own commits need them, the harness's never run them (gitgate/plain.settings)."""
    repo = make_repo(tmp_path / "r")
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'pre-commit: refused' >&2\nexit 1\n")
    hook.chmod(0o755)
    git(repo, "config", "commit.gpgsign", "true")
    git(repo, "config", "gpg.program", "false")
    (repo / "notes.txt").write_text("x\n")
    git(repo, "add", "notes.txt")
    refused = __import__("subprocess").run(["git", "-C", str(repo), "commit", "-qm", "notes"], capture_output=True,
                                           text=True, timeout=60)
    assert refused.returncode != 0  # the user's settings hold for the user's own commits
    git(repo, "reset", "-q")
    (repo / "notes.txt").unlink()
    night = harness("run", "--repo", repo, "--tag", "s", "--agent", "mutate", "--iterations", 3, "--baseline-runs", 1)
    assert night.exit_code == 0, night.output
    rows = ledger.read_rows(repo / "runs" / "s" / "results.tsv")
    assert len(rows) == 4 and all(r["status"] in ("keep", "discard") for r in rows), [r["description"] for r in rows]
    assert git(repo, "rev-list", "--count", "refs/autoresearch/s/tried/0001") != ""  # the candidates were committed
