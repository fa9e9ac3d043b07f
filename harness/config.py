"""Run configuration: CLI flags > [tool.harness] in the research repo > defaults.

Resolved once into a frozen RunConfig; everything downstream reads only that object.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .decide import GateSettings
from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# ---------------------------------------------------------------------------
# Workload settings: these may come from pyproject.toml [tool.harness] or harness.toml.

WORKLOAD_DEFAULTS: dict[str, Any] = {
    "editable": ["train.py"],
    "protected": ["prepare.py"],
    "train_command": "python train.py",
    "metric": "val_bpb",
    "direction": "minimize",
    "time_budget": 300,  # s of training per experiment
    "kill_after": None,  # s, hard deadline; None = 2 * time_budget + 120
    "program": "program.md",
    "max_steps": None,  # HARNESS_MAX_STEPS for the job: step-bounded, bit-identical runs
    "history_rows": 10,  # ledger rows shown to the researcher
    "agent": "mutate",
    "model": None,
    "agent_timeout": 1800,  # s, one researcher invocation
    "stall_after_min": 20,  # min without training output before the job is killed
    "keep_ties": False,
    "seed": 42,
    "gate": "noise",  # strict: any improvement; noise: beyond the measured noise floor
    "baseline_runs": 2,  # baseline trainings; their spread is the first noise estimate
    "confirm": 1,  # extra runs (other seeds) that confirm a win before it is kept
    "min_delta": 0.0,  # smallest improvement worth keeping, metric units
    "z": 2.0,  # standard errors an improvement must exceed under the noise gate
    "sealed": None,  # metric only from prepare.py's sealed result; None = when a protected file can seal
    "policy": True,  # static check of proposed diffs for known cheats (policy.py)
    "health_every": 25,  # iterations between health checkpoints; 0 = none
    "on_unhealthy": "stop",  # stop | continue, when a health checkpoint fails
    "track": None,  # experiment tracker: "mlflow" (or "mlflow:URI"); None = none (harness/track/)
    "track_uri": None,  # the tracker's URI; None = sqlite:///runs/mlflow.db in the research repo
    "track_timeout": 30,  # s the end of a run waits for the tracker to catch up
    "sandbox": "auto",  # auto | bwrap | off: training jobs and evaluations under bubblewrap (executors/sandbox.py)
    "network": False,  # let sandboxed jobs reach the network
    "agent_sandbox": "auto",  # auto | bwrap | off: the researcher's own process under bubblewrap (agents/sandboxed.py)
    "agent_network": True,  # let the sandboxed researcher reach the network (its API); off for a cmd: that needs none
    "evaluate_command": None,  # the metric from this command, run after the job from the baseline's files
    "train_data_command": None,  # writes the training split for the job (HARNESS_OUTPUT_DIR); the data is hidden
    "test_command": None,  # the private test split's figure (evaluate_command's contract); never decides (testsplit.py)
    "test_every": 0,  # keeps between test scorings of the best so far; 0 = at the end of the run only
    "executor": "local",  # where training jobs run: local (this machine's GPUs) | ray (a Ray cluster)
    "ray_address": None,  # the Ray cluster; None = $RAY_ADDRESS, else "auto"
    "job_resources": None,  # Ray resources per job, e.g. {"GPU": 1} (the default) or {"CPU": 1}
    "slots": None,  # jobs at once on the cluster; None = what its resources hold
    "setup_command": None,  # once per Ray node before its first job; `uv run`: the run's env (uv sync --frozen)
    "setup_timeout": 3600,  # s, the setup command's hard limit
    # Bounds per job and per evaluation (executors/limits.py); None = derived from the machine, 0 = none
    "job_memory_mb": None,  # MB of memory; default half of MemTotal
    "job_pids": None,  # processes and threads; default 4096
    "job_disk_mb": None,  # MB each of private /tmp, output folder and worktree may grow; default 1/4 of free disk
    "job_log_mb": None,  # MB of log kept (head and tail); default 64
    "eval_kill_after": None,  # s, an evaluation's hard deadline; None = calibrated on the baseline's evaluation
}

RENAMED = {"stall_after": "stall_after_min"}
TRACKERS = ("mlflow",)
# Researcher settings a repo's file may give too; they join agent_options (the CLI's flags win).
# A file's setting that does not apply to the chosen backend is left out, not an error.
AGENT_FILE_KEYS = {"base_url": "base_url", "agent_executable": "executable", "agent_args": "agent_args"}
EXECUTORS = ("local", "ray")
LIMIT_KEYS = ("job_memory_mb", "job_pids", "job_disk_mb", "job_log_mb", "eval_kill_after")

TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _check_value(key: str, value: Any) -> Any:
    """Validate one setting; return it normalised or raise ConfigError saying how to fix it."""
    def want(cond: bool, what: str) -> None:
        if not cond:
            raise ConfigError(f"config key {key!r} must be {what}, got {value!r}")

    if key in ("editable", "protected"):
        want(isinstance(value, list) and all(isinstance(v, str) and v for v in value),
             "a list of file paths relative to the repo root")
        want(all(not Path(v).is_absolute() and ".." not in Path(v).parts for v in value),
             "paths inside the repo (relative, no '..')")
        if key == "editable":
            want(len(value) > 0, "a non-empty list")
        return list(value)
    if key in ("train_command", "metric", "program", "agent"):
        want(isinstance(value, str) and value.strip() != "", "a non-empty string")
        return value
    if key == "model":
        want(value is None or isinstance(value, str), "a model name")
        return value
    if key == "direction":
        want(value in ("minimize", "maximize"), "'minimize' or 'maximize'")
        return value
    if key in ("time_budget", "kill_after", "agent_timeout", "stall_after_min"):
        if key == "kill_after" and value is None:
            return None
        want(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
             "a positive number of seconds" if key != "stall_after_min" else "a positive number of minutes")
        return float(value)
    if key == "max_steps":
        want(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
             "a number of steps >= 1")
        return value
    if key in ("history_rows", "seed"):
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
             "a non-negative integer")
        return value
    if key == "gate":
        want(value in ("strict", "noise"), "'strict' or 'noise'")
        return value
    if key in ("baseline_runs",):
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1")
        return value
    if key == "confirm":
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 0, "an integer >= 0")
        return value
    if key == "min_delta":
        want(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
             "a non-negative number")
        return float(value)
    if key == "z":
        want(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
             "a positive number of standard errors")
        return float(value)
    if key in ("keep_ties", "policy"):
        want(isinstance(value, bool), "true or false")
        return value
    if key == "sealed":
        want(value is None or isinstance(value, bool), "true or false")
        return value
    if key in ("sandbox", "agent_sandbox"):
        want(value in ("auto", "bwrap", "off"), "'auto', 'bwrap' or 'off'")
        return value
    if key in ("network", "agent_network"):
        want(isinstance(value, bool), "true or false")
        return value
    if key in ("evaluate_command", "train_data_command", "test_command"):
        want(value is None or (isinstance(value, str) and value.strip() != ""), "a command line")
        return value
    if key in ("health_every", "test_every"):
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 0, "a non-negative integer")
        return value
    if key == "track":
        backend = value.partition(":")[0] if isinstance(value, str) else value
        want(value is None or backend in (*TRACKERS, "none"),
             f"one of {', '.join(TRACKERS)} (optionally with :URI, e.g. mlflow:http://127.0.0.1:5000) or none")
        return None if backend == "none" else value
    if key == "track_uri":
        want(value is None or (isinstance(value, str) and value.strip() != ""), "a tracking URI")
        return value
    if key == "track_timeout":
        want(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
             "a non-negative number of seconds")
        return float(value)
    if key in LIMIT_KEYS:
        if key == "eval_kill_after":
            want(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0),
                 "a positive number of seconds")
            return None if value is None else float(value)
        low = 1 if key == "job_log_mb" else 0
        want(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= low),
             f"an integer >= {low}" + (" (0 = no bound)" if low == 0 else ""))
        return value
    if key in ("executor", "ray_address", "job_resources", "slots", "setup_command", "setup_timeout"):
        return _check_executor_value(key, value, want)
    if key == "on_unhealthy":
        want(value in ("stop", "continue"), "'stop' or 'continue'")
        return value
    if key in ("base_url", "agent_executable"):
        want(isinstance(value, str) and value.strip() != "", "a non-empty string")
        return value
    if key == "agent_args":
        want(isinstance(value, list) and all(isinstance(v, str) for v in value), "a list of strings")
        return tuple(value)
    known = sorted([*WORKLOAD_DEFAULTS, *AGENT_FILE_KEYS])
    raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(known)}")


def _check_executor_value(key: str, value: Any, want) -> Any:
    if key == "executor":
        want(value in EXECUTORS, f"one of {', '.join(EXECUTORS)}")
        return value
    if key in ("ray_address", "setup_command"):
        want(value is None or (isinstance(value, str) and value.strip() != ""), "a non-empty string")
        return value
    if key == "job_resources":
        if isinstance(value, str):  # --job-resources '{"GPU": 1}'
            try:
                value = json.loads(value)
            except ValueError:
                want(False, 'a JSON object of resource amounts, e.g. {"GPU": 1} or {"CPU": 1}')
        want(value is None or (isinstance(value, dict) and value and all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            for k, v in value.items())), 'resource amounts > 0 by name, e.g. {"GPU": 1} or {"CPU": 1}')
        return None if value is None else {k: float(v) for k, v in value.items()}
    if key == "slots":
        want(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
             "an integer >= 1")
        return value
    want(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, "a positive number of seconds")
    return float(value)


# Limits of one invocation (CLI only): each must be positive, else the run would start and
# stop at once, or never stop; the message names the flag.
RUN_LIMITS: dict[str, tuple[type, str]] = {
    "hours": (float, "a positive number of hours, e.g. --hours 8"),
    "iterations": (int, "a positive number of iterations, e.g. --iterations 50"),
    "max_tokens": (int, "a positive number of tokens, e.g. --max-tokens 2000000"),
    "max_cost": (float, "a positive amount of USD, e.g. --max-cost 20"),
}
# The researcher's options: (minimum, whether the minimum itself is allowed).
AGENT_LIMITS: dict[str, tuple[float, bool]] = {
    "request_timeout": (0, False), "max_retries": (0, True), "repair_turns": (0, True),
    "temperature": (0, True),
}


def check_limits(overrides: dict[str, Any]) -> None:
    """Refuse a negative or zero limit with a message that names the flag and what to pass."""
    for key, (kind, what) in RUN_LIMITS.items():
        value = overrides.get(key)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or value <= 0 or (kind is int and int(value) != value):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} must be {what}; got {value!r}. Leave it out for no limit.")
    for key, value in (overrides.get("agent_options") or {}).items():
        if key not in AGENT_LIMITS or value is None:
            continue
        low, inclusive = AGENT_LIMITS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (
                value == low and not inclusive):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} must be {'>=' if inclusive else '>'} {low:g}; got {value!r}.")


def read_repo_settings(repo: Path) -> tuple[dict[str, Any], Path | None]:
    """The [tool.harness] table of repo/pyproject.toml, or the whole of repo/harness.toml."""
    harness_toml = repo / "harness.toml"
    pyproject = repo / "pyproject.toml"
    for path, table in ((harness_toml, None), (pyproject, ("tool", "harness"))):
        if not path.exists():
            continue
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}. Fix the file and try again.") from e
        if table:
            for part in table:
                data = data.get(part, {}) if isinstance(data, dict) else {}
            if not data:
                continue
        if "tool" in data and table is None and isinstance(data.get("tool"), dict):
            data = data["tool"].get("harness", data)
        return dict(data), path
    return {}, None


@dataclass(frozen=True)
class RunConfig:
    repo: Path
    tag: str
    editable: tuple[str, ...]
    protected: tuple[str, ...]
    train_command: str
    metric: str
    direction: str
    time_budget: float  # s
    kill_after: float  # s
    program: str
    max_steps: int | None
    history_rows: int
    agent: str
    model: str | None
    agent_timeout: float  # s
    stall_after_min: float
    keep_ties: bool
    seed: int
    gate: str
    baseline_runs: int
    confirm: int
    min_delta: float
    z: float
    hours: float | None = None
    iterations: int | None = None
    from_rev: str = "HEAD"
    rebaseline: bool = False  # --resume --rebaseline: a run whose baseline never succeeded starts again from from_rev
    max_tokens: int | None = None
    max_cost: float | None = None  # USD
    agent_options: dict[str, Any] = field(default_factory=dict)
    config_file: str | None = None
    arm: str = ""  # A/B arm name ("a", "b"); "" for a single run
    run_root: Path | None = None  # where the run's files live; default repo/runs/<tag>
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for this run's training; None = inherited
    sealed: bool | None = None  # see WORKLOAD_DEFAULTS
    policy: bool = True
    health_every: int = 25  # iterations
    on_unhealthy: str = "stop"
    pipeline: bool | None = None  # propose the next candidate while one trains; None = when safe
    gpus: tuple[str, ...] = ()  # one lane per GPU (--gpus 0,1,2,3); () = one lane, inherited GPU
    repeat: int | None = None  # a tournament's repeat of its arm (1, 2, ...); None outside one
    track: str | None = None  # see WORKLOAD_DEFAULTS
    track_uri: str | None = None
    track_timeout: float = 30.0  # s
    sandbox: str = "auto"  # see WORKLOAD_DEFAULTS
    network: bool = False
    agent_sandbox: str = "auto"
    agent_network: bool = True
    evaluate_command: str | None = None
    train_data_command: str | None = None
    test_command: str | None = None
    test_every: int = 0  # keeps
    score_test: bool = False  # internal: this job's model is scored on the test split too (testsplit.py)
    executor: str = "local"  # see WORKLOAD_DEFAULTS (executors/)
    ray_address: str | None = None
    job_resources: dict[str, float] | None = None
    slots: int | None = None
    setup_command: str | None = None
    setup_timeout: float = 3600.0  # s
    job_memory_mb: int | None = None  # see WORKLOAD_DEFAULTS (executors/limits.py)
    job_pids: int | None = None
    job_disk_mb: int | None = None  # MB
    job_log_mb: int | None = None  # MB
    eval_kill_after: float | None = None  # s

    @property
    def branch(self) -> str:
        return f"autoresearch/{self.tag}"

    @property
    def run_dir(self) -> Path:
        return self.run_root if self.run_root is not None else self.repo / "runs" / self.tag

    @property
    def worktree(self) -> Path:
        return self.run_dir / "worktree"

    @property
    def ledger_path(self) -> Path:
        return self.run_dir / "results.tsv"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def gate_settings(self) -> "GateSettings":
        return GateSettings(self.gate, self.direction, self.keep_ties, self.min_delta, self.z)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["repo"] = str(self.repo)
        out["run_root"] = None if self.run_root is None else str(self.run_root)
        return out


def _with_file_agent(file_agent: dict[str, Any], agent: str, cli: dict[str, Any] | None) -> dict[str, Any]:
    """The file's researcher settings that apply to this backend, under the CLI's own."""
    from .agents import BACKEND_OPTIONS, backend_kind
    applies = BACKEND_OPTIONS.get(backend_kind(agent), set())
    return {**{k: v for k, v in file_agent.items() if k in applies}, **(cli or {})}


def resolve(repo: Path, tag: str, overrides: dict[str, Any]) -> RunConfig:
    """Merge defaults, the repo's settings file and CLI overrides (None = not given)."""
    repo = Path(repo).resolve()
    if not TAG_RE.match(tag):
        raise ConfigError(f"tag {tag!r} must be letters, digits, '.', '_' or '-' (at most 63)")
    check_limits(overrides)
    file_settings, path = read_repo_settings(repo)
    for old, new in RENAMED.items():  # settings files written before a key got its unit in its name
        if old in file_settings and new not in file_settings:
            file_settings[new] = file_settings.pop(old)
    merged = dict(WORKLOAD_DEFAULTS)
    file_agent: dict[str, Any] = {}
    for key, value in file_settings.items():
        try:
            checked = _check_value(key, value)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from e
        if key in AGENT_FILE_KEYS:
            file_agent[AGENT_FILE_KEYS[key]] = checked
        else:
            merged[key] = checked
    run_only = {"hours", "iterations", "from_rev", "rebaseline", "max_tokens", "max_cost", "agent_options", "arm", "run_root", "gpu",
                "pipeline", "gpus", "repeat"}
    extra: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in run_only:
            extra[key] = value
        else:
            try:
                merged[key] = _check_value(key, value)
            except ConfigError as e:  # given on the command line: the flag is what to fix
                raise ConfigError(str(e).replace(f"config key {key!r}", flag_of(key), 1)) from None
    if merged["track"] and ":" in merged["track"]:  # --track mlflow:URI
        merged["track"], merged["track_uri"] = merged["track"].split(":", 1)
        if not merged["track_uri"].strip():
            raise ConfigError("--track mlflow: needs a URI after the colon (e.g. mlflow:http://127.0.0.1:5000), "
                              "or plain --track mlflow for sqlite:///runs/mlflow.db")
    if merged["track"] == "mlflow" and importlib.util.find_spec("mlflow") is None:
        raise ConfigError("--track mlflow needs the mlflow package: pip install 'autoresearch-harness[track]' "
                          "(or run without --track; `harness track RUN_DIR` can log the run later)")
    if file_agent:
        extra["agent_options"] = _with_file_agent(file_agent, merged["agent"], extra.get("agent_options"))
    if merged["executor"] == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("--executor ray needs the ray package: pip install 'autoresearch-harness[ray]' "
                          "(or run with --executor local)")
    if merged["kill_after"] is None:
        merged["kill_after"] = 2 * merged["time_budget"] + 120
    for key in ("editable", "protected"):
        merged[key] = tuple(merged[key])
    gpus = tuple(extra.get("gpus") or ())
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"--gpus {','.join(gpus)} lists a GPU twice; one job per GPU, e.g. --gpus 0,1,2,3")
    overlap = set(merged["editable"]) & set(merged["protected"])
    if overlap:
        raise ConfigError(f"files cannot be both editable and protected: {sorted(overlap)}")
    return RunConfig(repo=repo, tag=tag, config_file=str(path) if path else None, **merged, **extra)


# ---------------------------------------------------------------------------
# Resume: the new settings against the run's manifest (run.json)

# Settings that change what a row measures or how it is judged: a resumed run that changed one
# would mix two experiments in one ledger, so the resume is refused.
MEASURED = ("editable", "protected", "train_command", "metric", "direction", "time_budget", "max_steps",
            "gate", "min_delta", "z", "keep_ties", "confirm", "sealed", "policy")
# Limits and pacing: they may change between sessions; the change is recorded as an event.
LIMITS = ("hours", "iterations", "max_tokens", "max_cost", "kill_after", "agent_timeout", "stall_after",
          "health_every", "on_unhealthy", "history_rows", "pipeline", "gpus", "test_every", *LIMIT_KEYS)
FLAGS = {"time_budget": "--time-budget", "max_steps": "--max-steps", "min_delta": "--min-delta",
         "keep_ties": "--keep-ties/--no-keep-ties"}


def flag_of(key: str) -> str:
    """The `harness run` flag that sets a config key."""
    return FLAGS.get(key, "--" + {"stall_after_min": "stall_after"}.get(key, key).replace("_", "-"))


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return list(old) == list(new)
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        return float(old) == float(new)
    return old == new


def compare_resume(old: dict[str, Any], cfg: RunConfig) -> tuple[list[str], list[str]]:
    """(refusals, limit changes) of a resume: each names the setting, its old and new value.
    old is the manifest's "config"; keys it lacks (older manifests) are not compared."""
    new = cfg.to_json()
    refused, changed = [], []
    for keys, out in ((MEASURED, refused), (LIMITS, changed)):
        for key in keys:
            if key in old and not _same(old[key], new.get(key)):
                out.append(f"{key} {old[key]!r} -> {new.get(key)!r}")
    return refused, changed


def refusal_message(tag: str, refused: list[str]) -> str:
    names = [r.split(" ", 1)[0] for r in refused]
    flags = ", ".join(FLAGS.get(n, "--" + n.replace("_", "-")) if n not in ("editable", "protected",
                      "train_command", "metric", "direction", "sealed", "policy") else n for n in names)
    return (f"run {tag} was measured with other settings ({'; '.join(refused)}): resuming would mix two "
            f"experiments in one ledger. Resume with the run's own values ({flags}; see runs/{tag}/run.json), "
            f"or start a new run with another --tag.")


def with_run_settings(run_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """For --resume: the measured settings not given on the command line are the run's own (from
    run.json), so a resume needs no flags repeated and never changes them by accident."""
    try:
        old = json.loads((Path(run_dir) / "run.json").read_text()).get("config", {})
    except (OSError, ValueError):
        return overrides
    out = dict(overrides)
    for key in MEASURED:
        if out.get(key) is None and key in old and key not in ("editable", "protected") and old[key] is not None:
            out[key] = old[key]
    return out
