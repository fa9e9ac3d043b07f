"""The settings schema (harness/config/: its __init__ and schema.py): one declaration per setting, and what is
derived from it stays equal to it: validation, the resume check, `harness init`'s comments, the docs."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness import config
from harness.ledger import events
from harness.cli import main as cli_main
from harness.config import SETTINGS, RunConfig
from harness.config import resume
from harness.config.resume import compare_resume
from harness.config.load import resolve
from harness.errors import ConfigError

from conftest import ROOT, make_repo
from fakes.helpers import harness

sys.path.insert(0, str(ROOT / "scripts"))
import settings_table  # noqa: E402


def test_the_docs_table_is_what_the_schema_produces():
    text = (ROOT / "docs/configuration.md").read_text()
    table = text.split(settings_table.BEGIN, 1)[1].split(settings_table.END, 1)[0]
    assert table == config.settings_table(), "docs/configuration.md is stale: python scripts/settings_table.py"
    done = subprocess.run([sys.executable, str(ROOT / "scripts/settings_table.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for name, s in config.ALL_SETTINGS.items():  # every setting has its row
        assert (f"| `{name}`" in table) if s.where == "file" else (f"`{s.flag}`" in table), name


def test_each_field_is_declared_with_the_type_its_kind_checks():
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    for name, s in SETTINGS.items():
        assert fields[name].type == s.kind.annotation, name
        assert s.check(s.default) == (s.kind.check(s.default)), name  # every default passes its own check
        assert s.help and (s.default is not None or s.none), name


def test_every_declared_flag_is_a_flag_of_harness_run_and_sets_that_setting():
    params = {p.name: p for p in cli_main.commands["run"].params}
    opts = {o: p for p in params.values() for o in [*p.opts, *p.secondary_opts]}
    for name, s in config.ALL_SETTINGS.items():
        if not s.flag:
            assert name not in params, f"{name} has a flag in the CLI; declare it"
            continue
        for flag in s.flag.split(" ")[0].split("/"):
            assert flag in opts, (name, flag)
        param = opts[s.flag.split(" ")[0].split("/")[0]]
        assert param.name in (name, s.option), (name, param.name)


def test_resume_compares_every_setting_by_its_field_name():
    names = set(RunConfig(repo=Path("/r"), tag="t").to_json())
    assert set(resume.MEASURED) | set(resume.LIMITS) <= names
    assert "stall_after_min" in resume.LIMITS  # once listed as "stall_after": a change was never seen
    assert not set(resume.MEASURED) & set(resume.LIMITS)


def test_a_changed_stall_after_is_reported_on_resume(repo: Path):
    old = resolve(repo, "t", {"stall_after_min": 20}).to_json()
    refused, changed = compare_resume(old, resolve(repo, "t", {"stall_after_min": 5}))
    assert refused == [] and changed == ["stall_after_min 20.0 -> 5.0"]
    # and end to end: the event of the resume names it
    args = ["run", "--repo", str(repo), "--tag", "s", "--agent", "mutate", "--baseline-runs", "1"]
    assert harness([*args, "--iterations", "1", "--stall-after", "20"]).exit_code == 0
    again = harness([*args, "--iterations", "2", "--stall-after", "5", "--resume"])
    assert again.exit_code == 0, again.output
    happened = [e for e in events.read(repo / "runs/s")[0] if e["kind"] == "resume_settings"]
    assert happened and "stall_after_min 20.0 -> 5.0" in happened[0]["message"]


@pytest.mark.parametrize("line,says", [
    ("z = 0", "config key 'z' must be a positive number of standard errors, got 0"),
    ("stall_after_min = -1", "config key 'stall_after_min' must be a positive number of minutes, got -1"),
    ('gate = "loose"', "config key 'gate' must be 'strict' or 'noise', got 'loose'"),
    ("job_pids = 1.5", "config key 'job_pids' must be an integer >= 0 (0 = no bound), got 1.5"),
    ("keep_ties = 1", "config key 'keep_ties' must be true or false, got 1"),
    ("agent_args = [1]", "config key 'agent_args' must be a list of strings, got [1]"),
    ("hours = 3", "config key 'hours' is given on the command line only (--hours)"),
    ("time_budgt = 3", "unknown config key 'time_budgt' (did you mean 'time_budget'?)"),
    ("stall_after = 3", "config key 'stall_after' is the old name of 'stall_after_min'"),
])
def test_a_bad_value_in_the_file_names_the_file_the_key_the_value_and_what_is_allowed(tmp_path, line, says):
    extra = line + "\n" + ("stall_after_min = 4\n" if line.startswith("stall_after =") else "")
    repo = make_repo(tmp_path / "r", extra=extra)
    with pytest.raises(ConfigError) as e:
        resolve(repo, "t", {})
    assert str(e.value).startswith(f"{repo / 'harness.toml'}: ") and says in str(e.value)


def test_the_old_name_of_a_setting_still_works_and_flags_are_named_as_flags(tmp_path):
    repo = make_repo(tmp_path / "r", extra="stall_after = 3\n")
    assert resolve(repo, "t", {}).stall_after_min == 3.0
    with pytest.raises(ConfigError, match=r"^--stall-after must be a positive number of minutes, got 0$"):
        resolve(repo, "t", {"stall_after_min": 0})
    with pytest.raises(ConfigError, match=r"^--iterations must be a positive number of iterations, got 0\. Leave"):
        resolve(repo, "t", {"iterations": 0})
    with pytest.raises(ConfigError, match=r"config key 'editable' must be paths inside the repo \(relative"):
        resolve(repo, "t", {"editable": ["../x.py"]})
    with pytest.raises(ConfigError, match="unknown config key 'no_such'"):
        resolve(repo, "t", {"no_such": 1})
    cfg = resolve(repo, "t", {"gpus": ["0", "1"], "job_resources": '{"CPU": 2}'})
    assert cfg.gpus == ("0", "1") and cfg.job_resources == {"CPU": 2.0} and cfg.editable == ("train.py",)


def test_init_writes_each_setting_with_its_help_from_the_schema(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text("print('hi')\n")
    assert harness(["init", "--repo", str(plain)]).exit_code == 0
    text = (plain / "harness.toml").read_text()
    written = tomllib.loads(text)
    for key in written:
        line = next(line for line in text.splitlines() if line.startswith(f"{key} = "))
        assert line.endswith(f"  # {config.ALL_SETTINGS[key].help}"), line
    assert written["train_command"] == "python train.py" and "docs/configuration.md" in text
    example = tmp_path / "example"
    assert harness(["init", "--example", str(example)]).exit_code == 0
    text = (example / "harness.toml").read_text()
    assert f"  # {SETTINGS['evaluate_command'].help}" in text
    cfg = resolve(example, "t", {})
    assert cfg.evaluate_command == "python prepare.py --evaluate" and json.dumps(cfg.to_json())
