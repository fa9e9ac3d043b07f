"""Run configuration: CLI flags > [tool.harness] in the research repo > defaults.

Resolved once into a frozen RunConfig; everything downstream reads only that object.

Every setting is declared once, on its RunConfig field (`declare`: default, kind of value with its
bounds or choices, help, flag, how a resume treats a change; the machinery and why it is not pydantic:
schema.py). From that one table come the validation of the repo's file and of the flags (load.py:
`resolve`, `read_repo_settings`), the resume-time check (resume.py: `compare_resume`), the comments
`harness init` writes (`toml_lines`) and the docs' table (docs/configuration.md, `settings_table`;
scripts/settings_table.py rewrites it).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import schema
from ..driver.decide import GateSettings
from .schema import CLI, RECORDED, REFUSED, Choice, Flag, Number, Resources, Setting, Strings, Text, Tracker
from .schema import declare as _declare

TRACKERS = ("mlflow",)
EXECUTORS = ("local", "ray")
SANDBOXES = ("auto", "bwrap", "off")
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def declare(default: Any, kind: Any, help: str, flag: str | bool | None = True, **rest: Any) -> Any:
    """A RunConfig field that is a setting. flag: True = `--` and the name with dashes; a string: that
    flag; None: none (a settings file's key only)."""
    return _declare(default, kind, help, flag=flag, **rest)


SECONDS = dict(gt=0, unit="seconds")


@dataclass(frozen=True)
class RunConfig:
    repo: Path
    tag: str
    # --- What is measured, and how it is judged (a change refuses a --resume)
    editable: tuple[str, ...] = declare(("train.py",), Strings(paths=True, nonempty=True),
                                        "the only files the researcher may change", None, resume=REFUSED)
    protected: tuple[str, ...] = declare(("prepare.py",), Strings(paths=True),
                                         "checked by hash around every job; never changed", None, resume=REFUSED)
    train_command: str = declare("python train.py", Text(), "the training job, run in the run's worktree", None,
                                 resume=REFUSED)
    metric: str = declare("val_bpb", Text(), "the result's name (`val_bpb: 1.23` after a `---` line)", None,
                          resume=REFUSED)
    direction: str = declare("minimize", Choice(options=("minimize", "maximize")), "which way is better", None,
                             resume=REFUSED)
    time_budget: float = declare(300.0, Number(**SECONDS), "s of training per experiment (HARNESS_TIME_BUDGET)",
                                 resume=REFUSED)
    kill_after: float | None = declare(None, Number(none=True, **SECONDS), "s, hard deadline per training job",
                                       none="2 x time_budget + 120", resume=RECORDED)
    program: str = declare("program.md", Text(), "what the researcher reads every iteration", None)
    max_steps: int | None = declare(None, Number(ge=1, integer=True, unit="steps", none=True),
                                    "each job stops after N steps (HARNESS_MAX_STEPS): step-bounded, bit-identical "
                                    "runs", none="none", resume=REFUSED)
    history_rows: int = declare(10, Number(ge=0, integer=True), "ledger rows shown to the researcher", None,
                                resume=RECORDED)
    agent: str = declare("mutate", Text(), "the researcher: mutate (offline), openai, codex, claude, gemini, "
                         "cmd:TEMPLATE")
    model: str | None = declare(None, Text(describe="a model name", empty=True, none=True),
                                "the researcher's model or alias (models.toml)", none="the backend's own")
    agent_timeout: float = declare(1800.0, Number(**SECONDS), "s, hard limit per researcher call", resume=RECORDED)
    stall_after_min: float = declare(20.0, Number(gt=0, unit="minutes"),
                                     "min without training output before the job is killed", "--stall-after",
                                     resume=RECORDED, aliases=("stall_after",))
    keep_ties: bool = declare(False, Flag(), "keep a candidate that equals the best", "--keep-ties/--no-keep-ties",
                              resume=REFUSED)
    seed: int = declare(42, Number(ge=0, integer=True), "seed of training and of the mutate researcher")
    gate: str = declare("noise", Choice(options=("strict", "noise")),
                        "the keep rule: strict (any improvement) or noise (beyond the measured noise floor)",
                        resume=REFUSED)
    baseline_runs: int = declare(2, Number(ge=1, integer=True),
                                 "baseline trainings; their spread is the first noise estimate")
    confirm: int = declare(1, Number(ge=0, integer=True),
                           "extra runs (other seeds) that confirm a win before it is kept", resume=REFUSED)
    min_delta: float = declare(0.0, Number(ge=0), "smallest improvement worth keeping, in metric units",
                               resume=REFUSED)
    z: float = declare(2.0, Number(gt=0, unit="standard errors"),
                       "standard errors an improvement must exceed under the noise gate", resume=REFUSED)
    sealed: bool | None = declare(None, Flag(none=True), "the metric only from the protected code's sealed result",
                                  None, none="when a protected file can seal", resume=REFUSED)
    policy: bool = declare(True, Flag(), "the static check of proposed diffs for known cheats (policy.py)", None,
                           resume=REFUSED)
    # --- Health checkpoints (health.py)
    health_every: int = declare(25, Number(ge=0, integer=True, zero="none"),
                                "iterations between health checkpoints", resume=RECORDED)
    on_unhealthy: str = declare("stop", Choice(options=("stop", "continue")), "what a failed health checkpoint does",
                                resume=RECORDED)
    # --- Limits and pacing of one invocation (command line only; a change on --resume is recorded)
    hours: float | None = declare(None, Number(gt=0, unit="hours", none=True), "the run stops after this long",
                                  where=CLI, none="no limit", resume=RECORDED, hint="Leave it out for no limit.")
    iterations: int | None = declare(None, Number(ge=1, integer=True, unit="iterations", none=True),
                                     "the run stops after this many proposals", where=CLI, none="no limit",
                                     resume=RECORDED, hint="Leave it out for no limit.")
    from_rev: str = declare("HEAD", Text(), "the commit a new run starts from", "--from", where=CLI)
    rebaseline: bool = False  # --resume --rebaseline: a run whose baseline never succeeded starts again from from_rev
    max_tokens: int | None = declare(None, Number(ge=1, integer=True, unit="tokens", none=True),
                                     "the run stops before its tokens would pass this", where=CLI, none="no limit",
                                     resume=RECORDED, hint="Leave it out for no limit.")
    max_cost: float | None = declare(None, Number(gt=0, noun="amount", unit="USD", none=True),
                                     "the run stops before its cost would pass this", where=CLI, none="no limit",
                                     resume=RECORDED, hint="Leave it out for no limit.")
    agent_options: dict[str, Any] = field(default_factory=dict)
    config_file: str | None = None
    arm: str = ""  # A/B arm name ("a", "b"); "" for a single run
    run_root: Path | None = None  # where the run's files live; default repo/runs/<tag>
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for this run's training; None = inherited
    pipeline: bool | None = declare(None, Flag(none=True), "propose the next candidate while one trains",
                                    "--pipeline/--no-pipeline", where=CLI, none="on for remote researchers",
                                    resume=RECORDED)
    gpus: tuple[str, ...] = declare((), Strings(), "one lane per GPU (CUDA_VISIBLE_DEVICES of each), e.g. 0,1,2,3",
                                    where=CLI, none="one lane, the GPUs inherited", resume=RECORDED)
    repeat: int | None = None  # a tournament's repeat of its arm (1, 2, ...); None outside one
    # --- Tracking (docs/tracking.md)
    track: str | None = declare(None, Tracker(backends=TRACKERS, none=True),
                                "the experiment tracker: mlflow, or mlflow:URI", none="none")
    track_uri: str | None = declare(None, Text(describe="a tracking URI", none=True), "the tracker's URI", None,
                                    none="sqlite:///runs/mlflow.db in the research repo")
    track_timeout: float = declare(30.0, Number(ge=0, unit="seconds"),
                                   "s the end of a run waits for the tracker to catch up", None)
    # --- Confinement (docs/robustness.md)
    sandbox: str = declare("auto", Choice(options=SANDBOXES),
                           "training jobs and evaluations under bubblewrap (executors/sandbox.py)")
    network: bool = declare(False, Flag(), "sandboxed jobs may reach the network", "--network/--no-network")
    warm_start: bool = declare(True, Flag(), "a sandboxed `python SCRIPT` job is handed to an interpreter the slot "
                               "started, imports done, while the previous job trained (executors/warm.py)",
                               "--warm-start/--no-warm-start")
    data_paths: tuple[str, ...] = declare((), Strings(), "folders outside the repo the sandboxed job may read, "
                                          "read-only (~ expands): e.g. the data prepare.py cached in your home",
                                          None, resume=RECORDED)
    agent_sandbox: str = declare("auto", Choice(options=SANDBOXES),
                                 "the researcher's own process under bubblewrap (agents/sandboxed.py)")
    agent_network: bool = declare(True, Flag(), "the sandboxed researcher may reach the network (its API); "
                                  "off for a cmd: that needs none", "--agent-network on|off")
    # --- The evaluation and the private test split (docs/robustness.md, docs/report.md)
    evaluate_command: str | None = declare(None, Text(describe="a command line", none=True),
                                           "the metric from this command, run after the job from the baseline's "
                                           "files", None, none="the job's printed result")
    train_data_command: str | None = declare(None, Text(describe="a command line", none=True),
                                             "writes the training split for the job (HARNESS_OUTPUT_DIR); the "
                                             "data is hidden", None, none="none")
    test_command: str | None = declare(None, Text(describe="a command line", none=True),
                                       "the private test split's figure (evaluate_command's contract); never "
                                       "decides (workload/testsplit.py)", None, none="none")
    test_every: int = declare(0, Number(ge=0, integer=True, zero="at the end of the run only"),
                              "keeps between test scorings of the best so far", resume=RECORDED)
    score_test: bool = False  # internal: this job's model is scored on the test split too (workload/testsplit.py)
    # --- Where jobs run (docs/cluster.md)
    executor: str = declare("local", Choice(options=EXECUTORS),
                            "where training jobs run: this machine (local) or a Ray cluster (ray)")
    ray_address: str | None = declare(None, Text(none=True), "the Ray cluster", none="$RAY_ADDRESS, else auto")
    job_resources: dict[str, float] | None = declare(None, Resources(none=True), "Ray resources of one job",
                                                     "--job-resources", none='{"GPU": 1}')
    slots: int | None = declare(None, Number(ge=1, integer=True, none=True), "jobs at once on the cluster",
                                none="what its resources hold, live")
    setup_command: str | None = declare(None, Text(none=True), "once per Ray node before its first job; `uv run`: "
                                        "the run's env (uv sync --frozen)", None, none="none")
    setup_timeout: float = declare(3600.0, Number(**SECONDS), "s, the setup command's hard limit", None)
    # --- Bounds per job and per evaluation (executors/limits.py)
    job_memory_mb: int | None = declare(None, Number(ge=0, integer=True, zero="no bound", none=True),
                                        "MB of memory per job", none="half of MemTotal", resume=RECORDED)
    job_pids: int | None = declare(None, Number(ge=0, integer=True, zero="no bound", none=True),
                                   "processes and threads per job", none="4096", resume=RECORDED)
    job_disk_mb: int | None = declare(None, Number(ge=0, integer=True, zero="no bound", none=True),
                                      "MB each of a job's private /tmp, output folder and worktree may grow",
                                      none="1/4 of the free disk, at most 50 GB", resume=RECORDED)
    job_log_mb: int | None = declare(None, Number(ge=1, integer=True, none=True),
                                     "MB of a job's log kept (head and tail)", none="128", resume=RECORDED)
    eval_kill_after: float | None = declare(None, Number(none=True, **SECONDS), "s, an evaluation's hard deadline",
                                            none="calibrated on the baseline's evaluation", resume=RECORDED)

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




# Researcher settings a repo's file may give too; they join agent_options (the CLI's flags win).
# A file's setting that does not apply to the chosen backend is left out, not an error.
AGENT_SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("base_url", None, Text(), "the researcher's server: openai's client URL, codex's provider, claude's "
            "ANTHROPIC_BASE_URL, gemini's GOOGLE_GEMINI_BASE_URL", flag="--base-url", none="the backend's own",
            option="base_url"),
    Setting("agent_executable", None, Text(), "codex/claude/gemini: the CLI to run (a path or a name on PATH)",
            flag="--agent-executable", none="the backend's own", option="executable"),
    Setting("agent_args", None, Strings(), "arguments passed through to the researcher CLI",
            flag="--agent-arg (repeatable)", none="none", option="agent_args"),
)}


def _settings() -> dict[str, Setting]:
    out = schema.from_fields(dataclasses.fields(RunConfig))
    for name, s in out.items():
        if s.flag is True:
            out[name] = dataclasses.replace(s, flag="--" + name.replace("_", "-"))
    return out


SETTINGS: dict[str, Setting] = _settings()  # RunConfig's settings, by field name
ALL_SETTINGS: dict[str, Setting] = {**SETTINGS, **AGENT_SETTINGS}  # the docs' table
FILE_KEYS = {n: s for n, s in ALL_SETTINGS.items() if s.where == schema.FILE}
ALIASES = {a: s.name for s in ALL_SETTINGS.values() for a in s.aliases}

# Derived, for callers of the earlier tables:
WORKLOAD_DEFAULTS: dict[str, Any] = {n: s.default for n, s in SETTINGS.items() if s.where == schema.FILE}
RENAMED = ALIASES
AGENT_FILE_KEYS = {n: s.option for n, s in AGENT_SETTINGS.items()}
LIMIT_KEYS = ("job_memory_mb", "job_pids", "job_disk_mb", "job_log_mb", "eval_kill_after")
RUN_LIMITS = tuple(n for n, s in SETTINGS.items() if s.hint)  # hours, iterations, max_tokens, max_cost
# RunConfig fields that are no setting: what the CLI or the A/B launcher passes through as it is.
INTERNAL = ("rebaseline", "agent_options", "arm", "run_root", "gpu", "repeat", "score_test")


def toml_lines(values: dict[str, Any]) -> str:
    """Settings-file lines for these values, each with its help as a comment (`harness init`)."""
    return schema.toml_lines(ALL_SETTINGS, values)


def settings_table() -> str:
    """The markdown table of every setting (docs/configuration.md holds it; a test keeps it equal)."""
    return schema.markdown_table(ALL_SETTINGS)
