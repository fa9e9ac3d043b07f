"""The comparison report: per-arm figures, kept changes, convergent findings and a verdict.

Everything is recomputed from the ledgers (results.tsv) alone, so `harness report` works at any
time, mid-run included, and on karpathy/autoresearch's five-column results.tsv. A figure that
the ledger cannot support is None ("unknown"), never zero. Rendering lives in report_render.py;
docs/report.md explains every figure.
"""
from __future__ import annotations

import json
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..executors import sandbox
from ..driver import decide
from ..ledger import events
from .. import ledger
from ..agents import spend
from . import figures
from ..errors import HarnessError
from ..gitgate import run_git
from .report_diff import changed_names
from ..workload import testsplit
from . import repeats, report_verdict

FAILED = ("crash", "timeout", "invalid")
SHOWN_STATUSES = ("keep", "discard", "crash", "timeout", "invalid")
BOOTSTRAP_DRAWS = 10_000
BOOTSTRAP_SEED = 0
GIT_TIMEOUT_S = 30


@dataclass
class ArmData:
    label: str
    ledger: Path
    rows: list[dict[str, Any]]
    columns: tuple[str, ...]  # the ledger's header: what it can and cannot tell
    metric: str = "metric"
    direction: str = "minimize"
    agent: str | None = None
    model: str | None = None
    editable: tuple[str, ...] = ()
    git_dir: Path | None = None  # a checkout in which the kept commits can be diffed
    sandbox: str | None = None  # what ran the jobs (run.json): bwrap, off; None = not recorded
    arm: str = ""  # the A/B arm's name (a, b) when it came from an A/B run
    group: str | None = None  # a tournament arm's name when this ledger is one of its repeats


@dataclass
class Report:
    out_dir: Path
    summary: dict[str, Any]
    markdown: Path
    html: Path
    json: Path
    plots: dict[str, Path] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Finding the ledgers


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _git_toplevel(path: Path) -> Path | None:
    try:
        out = run_git(["-C", str(path), "rev-parse", "--show-toplevel"], timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def load_arm(label: str, path: Path, setup: dict[str, Any] | None = None) -> ArmData:
    """One ledger and what its run folder says about it (run.json, the worktree)."""
    rows = ledger.read_rows(path)
    for r in rows:  # karpathy/autoresearch logs a crash as 0.000000: a placeholder, not a figure
        if r.get("status") in FAILED and not r.get("metric"):
            r["metric"] = None
            r["memory_gb"] = r.get("memory_gb") or None
    header = path.read_text(encoding="utf-8").split("\n", 1)[0].split("\t") if path.exists() else []
    manifest = _read_json(path.parent / "run.json")
    cfg = manifest.get("config", {})
    arm = ArmData(label, path, rows, tuple(header), metric=ledger.metric_name(path) or "metric",
                  direction=cfg.get("direction", "minimize"),
                  editable=tuple(cfg.get("editable") or ()))
    researched = [r for r in rows[1:] if r.get("agent") or r.get("model")]
    setup = setup or {}
    arm.agent = (setup.get("researcher") or manifest.get("agent")
                 or (researched[0].get("agent") if researched else None))
    arm.model = (setup.get("model") or manifest.get("model")
                 or (researched[0].get("model") if researched else None) or None)
    arm.sandbox = manifest.get("sandbox")
    if cfg.get("repeat") and cfg.get("arm"):  # one repeat of a tournament's arm: pooled with the others
        arm.group = str(cfg["arm"])
    if arm.sandbox == "bwrap" and manifest.get("sandbox_caps"):  # what the job held, read inside it
        arm.sandbox = f"bwrap ({sandbox.caps_line(manifest['sandbox_caps'])})"
    worktree = path.parent / "worktree"
    arm.git_dir = worktree if (worktree / ".git").exists() else _git_toplevel(path.parent)
    if not arm.editable and arm.git_dir is not None and (arm.git_dir / "train.py").exists():
        arm.editable = ("train.py",)  # karpathy/autoresearch's one editable file
    return arm


def name_by_model(arms: list[ArmData], is_ab: list[bool]) -> None:
    """A/B arms are labelled by what they ran, `gpt-5.4 (codex)`, not by a/b; the arm's name
    is kept in front only where two arms would read the same."""
    names = {id(a): f"{a.model or 'no model'} ({a.agent or 'unknown agent'})" for a, ab in zip(arms, is_ab) if ab}
    values = list(names.values())
    for arm in arms:
        if id(arm) in names:
            name = names[id(arm)]
            arm.arm = arm.label
            arm.label = name if values.count(name) == 1 else f"{arm.label}: {name}"


def find_arms(paths: list[Path]) -> tuple[list[ArmData], dict[str, Any] | None]:
    """Arms from run folders, A/B folders (a/ and b/) or results.tsv files; and the A/B setup."""
    found: list[tuple[str, Path, Path, dict[str, Any] | None]] = []  # (label, ledger, input, setup)
    ab_setup = None
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            # its run folder's name; a relative `results.tsv` has no parent name, its folder has one
            label = path.resolve().parent.name if path.name == "results.tsv" else path.stem
            found.append((label, path, path, None))
        elif (path / "ab.json").exists() or any((path / a / "results.tsv").exists() for a in ("a", "b")):
            setup = _read_json(path / "ab.json")
            ab_setup = ab_setup or setup
            names = sorted(setup.get("arms", {})) or ["a", "b"]
            for name in names:
                if (path / name / "results.tsv").exists():
                    found.append((name, path / name / "results.tsv", path, setup.get("arms", {}).get(name)))
        elif (path / "results.tsv").exists():
            found.append((path.resolve().name, path / "results.tsv", path, None))
        else:
            raise HarnessError(f"{path}: no results.tsv there (nor a/ and b/ of an A/B run). Pass a run "
                               f"folder such as runs/<tag>, or a results.tsv file.")
    labels = [f[0] for f in found]
    arms = []
    for label, ledger_path, source, setup in found:
        if labels.count(label) > 1:
            label = f"{Path(source).resolve().name}/{label}"
        arms.append(load_arm(label, ledger_path, setup))
    name_by_model(arms, [f[3] is not None for f in found])
    if not arms:
        raise HarnessError("no ledgers with rows yet: the runs have not measured a baseline.")
    return arms, ab_setup


# ---------------------------------------------------------------------------
# Figures


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def better(direction: str, value: float, best: float) -> bool:
    return value > best if direction == "maximize" else value < best


value_of = figures.value_of


def experiments_of(arm: ArmData) -> list[dict[str, Any]]:
    """Every candidate after the baseline (figures.experiments: no baseline attempts, no
    `budget` rows, no `repeat` rows)."""
    return figures.experiments(arm.rows)


def wasted_train_s(df) -> float:
    """Training seconds of every run (repeats included) of candidates that were not kept: a
    repeat is judged with its candidate, and the baseline's repeats are the baseline's."""
    later = df.iloc[1:]
    decided = later[later["status"].ne("repeat")].drop_duplicates("iteration", keep="last")
    judged = later["candidate"].map(decided.set_index("iteration")["status"]).where(later["candidate"].ne(0), "keep")
    status = judged.where(later["status"].eq("repeat"), later["status"])
    return float(later.loc[status.ne("keep"), "train_s"].sum())


def kept_changes(arm: ArmData) -> list[dict[str, Any]]:
    out, best = [], figures.headline(arm.rows, arm.metric, arm.direction).baseline
    for r in experiments_of(arm):
        value = value_of(r)
        if r.get("status") != "keep" or value is None:
            continue
        delta = r.get("delta") if r.get("delta") is not None else (None if best is None else value - best)
        out.append({"iteration": r.get("iteration"), "commit": r.get("commit"), "metric": value,
                    "delta": delta,  # the ledger's: value - best before (negative = lower)
                    "improvement": None if delta is None else (delta if arm.direction == "maximize" else -delta),
                    "description": r.get("description") or ""})
        best = value
    return out


def arm_figures(arm: ArmData) -> dict[str, Any]:
    """Every per-arm figure of the report; None where the ledger cannot tell."""
    has = set(arm.columns).__contains__
    df = figures.frame(arm.rows)
    exp = df[figures.experiment_mask(df)]
    by_status = exp["status"].value_counts()
    counts = {s: int(by_status.get(s, 0)) for s in SHOWN_STATUSES}
    if by_status.get("skip", 0):
        counts["skip"] = int(by_status["skip"])
    head = figures.headline(arm.rows, arm.metric, arm.direction)  # the one definition of these figures
    improvement = head.improvement
    sigmas = df["sigma"].dropna()
    not_repeat = df[df["status"].ne("repeat")]  # a repeat's wall time is inside its candidate's
    train_s = float(df["train_s"].sum()) if has("train_s") else None
    wall_s = float(not_repeat["wall_s"].sum()) if has("wall_s") else None
    researched = exp[exp["agent_s"].notna()]
    called = df[df["agent_s"].notna() & df["status"].ne("repeat")] if has("agent_s") else researched
    unknown_calls = spend.unknown_calls(arm.rows) if has("input_tokens") else 0
    billed = called[called["input_tokens"].notna() | called["output_tokens"].notna()] \
        if has("input_tokens") and has("output_tokens") else called  # a killed call's cost is not known
    # every researcher call's cost, a call that came back after a stop (a `stopped` row) included
    cost = (float(billed["cost_usd"].sum()) if has("cost_usd") and len(called)
            and billed["cost_usd"].notna().all() else None)  # with unknown calls: what it cost at least
    tokens = (float(df["input_tokens"].sum() + df["output_tokens"].sum())
              if has("input_tokens") and has("output_tokens") else None)

    def mean(column) -> float | None:
        """The column's mean over the rows that have it; None when the ledger lacks it or no row has it."""
        return figures.known(column.mean()) if has(column.name) else None

    def per_iteration(key: str) -> float | None:
        return float(exp[key].sum()) / len(exp) if has(key) and len(exp) else None

    return {
        "label": arm.label, "arm": arm.arm, "ledger": str(arm.ledger), "agent": arm.agent, "model": arm.model,
        "metric": arm.metric, "direction": arm.direction,
        "experiments": len(exp), "counts": counts,
        "acceptance_rate": report_verdict.acceptance(counts),
        "baseline": head.baseline, "best": head.best, "best_commit": head.best_commit,
        "improvement": improvement, "improvement_pct": head.improvement_pct,
        "failed_baselines": head.failed_baselines,
        "noise_sigma": float(sigmas.iloc[-1]) if len(sigmas) else None,
        "repeat_runs": head.repeats,
        "gpu_minutes_discarded_failed": wasted_train_s(df) / 60 if has("train_s") else None,
        "train_s": train_s, "wall_s": wall_s,
        "mean_agent_s": mean(researched["agent_s"]),
        "mean_wall_s": mean(exp["wall_s"]),
        "gpu_duty": _ratio(train_s, wall_s),
        "input_tokens_per_iteration": per_iteration("input_tokens"),
        "cached_tokens_per_iteration": per_iteration("cached_tokens"),
        "output_tokens_per_iteration": per_iteration("output_tokens"),
        "tokens": tokens, "cost_usd": cost,
        # where the cost came from (price table or the researcher's own figure), from run.json
        "cost_source": (_read_json(arm.ledger.parent / "run.json").get("researcher") or {}).get("cost_source"),
        "unknown_usage_calls": spend.unknown_calls(arm.rows) if has("input_tokens") else None,
        "improvement_per_gpu_hour": _ratio(improvement, None if train_s is None else train_s / 3600),
        "improvement_per_1m_tokens": _ratio(improvement, None if tokens is None else tokens / 1e6),
        "improvement_per_usd": None if unknown_calls else _ratio(improvement, cost),  # on a lower bound: none
        "cost_text": None if not has("cost_usd") else figures.cost_text(cost, unknown_calls),
        "kept": kept_changes(arm),
        # results taken from stdout rather than a verified seal (foreign workloads); None = not recorded
        "unsealed_runs": int(df["sealed"].eq("no").sum()) if has("sealed") else None,
        "sandbox": arm.sandbox,  # bwrap or off (run.json), None = not recorded
        "events": events.read(arm.ledger.parent)[0],  # ledger restores, health warnings, drift, ...
    }


def progress_series(arm: ArmData) -> dict[str, list[float | None]]:
    """Best-so-far after each row, against cumulative wall hours, tokens and cost (None = unknown)."""
    has = set(arm.columns).__contains__
    df = figures.frame(arm.rows)
    kept = figures.values(df).where(df["status"].eq("keep"))
    best = (kept.cummax() if arm.direction == "maximize" else kept.cummin()).ffill()
    unknown = [None] * len(df)
    counted = df["status"].ne("repeat")  # a repeat's wall time is inside its candidate's
    wall = ((df["wall_s"].fillna(0) / 3600).where(counted, 0).cumsum().where(counted.cummax())
            if has("wall_s") else unknown)
    tokens = ((df["input_tokens"].fillna(0) + df["output_tokens"].fillna(0)) / 1e6).cumsum() \
        if has("input_tokens") and has("output_tokens") else unknown
    cost = unknown
    if has("cost_usd"):  # unknown from the first researched row without a cost on
        priced = ~(df["agent_s"].notna() & df["cost_usd"].isna()  # a killed call (no usage) hides no cost
                   & (df["input_tokens"].notna() | df["output_tokens"].notna()))
        cost = df["cost_usd"].fillna(0).cumsum().where(priced.astype(int).cummin().astype(bool))
    return {key: [figures.known(v) for v in series]
            for key, series in (("best", best), ("wall_h", wall), ("tokens_m", tokens), ("cost_usd", cost))}


# ---------------------------------------------------------------------------
# Convergent findings and the verdict


def convergent(arms: list[ArmData]) -> dict[str, Any]:
    """Hyperparameters and code areas changed in kept commits by every arm (from the diffs)."""
    per_arm: dict[str, dict[str, list[str]] | None] = {}
    for arm in arms:
        kept = [r for r in experiments_of(arm) if r.get("status") == "keep" and r.get("commit")]
        per_arm[arm.label] = None if arm.git_dir is None else changed_names(
            arm.git_dir, [(r.get("parent") or None, r["commit"]) for r in kept], arm.editable)
    known = [v for v in per_arm.values() if v is not None]
    both = {k: sorted(set.intersection(*(set(v[k]) for v in known))) if len(known) >= 2 and len(known) == len(arms)
            else None for k in ("hyperparameters", "code")}
    return {**both, "per_arm": per_arm}


# ---------------------------------------------------------------------------
# The whole report


def summarize(paths: list[Path]) -> tuple[dict[str, Any], list[ArmData]]:
    arms, setup = find_arms(paths)
    figs = [arm_figures(a) for a in arms]
    groups = report_verdict.group_units([a.group or a.label for a in arms])
    pooled = [report_verdict.pooled(arm_label(arms[g[0]], figs[g[0]]), [figs[i] for i in g]) for g in groups]
    samples = [[unit_sample(arms[i], figs[i], figs) for i in g] for g in groups]
    summary = {
        "metric": figs[0]["metric"], "direction": figs[0]["direction"],
        "inputs": [str(p) for p in paths], "ab": setup,
        "arms": figs, "pooled": pooled, "convergent": convergent(arms),
        "verdict": report_verdict.verdict(pooled, samples),
    }
    summary["consistency"] = repeats.for_report(pooled, figs, summary["convergent"]["per_arm"])
    summary["verdict"]["text"] += summary["consistency"]["disagree"]
    for a, f in zip(arms, figs):  # the private test split beside the validation figures (workload/testsplit.py)
        f["test_split"] = testsplit.for_report(a.ledger.parent, a.rows, a.metric, a.direction,
                                               _read_json(a.ledger.parent / "run.json").get("config", {}),
                                               f["noise_sigma"])
    summary["verdict"]["text"] += testsplit.warnings([(f["label"], f["test_split"]) for f in figs])
    if len(arms) > 1:
        from . import elo

        summary["elo"] = elo.report_section(paths)  # Bradley-Terry across the runs' tasks
        ledgers = {p["label"]: [arms[i].ledger for i in g] for p, g in zip(pooled, groups)}
        report_verdict.agree_with_elo(summary["verdict"], summary["elo"], ledgers)
    return summary, arms


def arm_label(arm: ArmData, fig: dict[str, Any]) -> str:
    """A pooled arm's label: its name; the A/B's positional a and b by what they ran, as name_by_model."""
    if arm.group is None:
        return fig["label"]
    if arm.group in ("a", "b"):
        return f"{fig['model'] or 'no model'} ({fig['agent'] or 'unknown agent'})"
    return arm.group


def unit_sample(arm: ArmData, fig: dict[str, Any], figs: list[dict[str, Any]]) -> report_verdict.UnitSample:
    """The verdict's bootstrap input for one ledger; its noise floor: the sigma the gate recorded, else
    its repeats of identical code, else the spread of all the compared baselines (the same code)."""
    sigma = fig["noise_sigma"] or decide.pooled_sigma(decide.repeat_groups(arm.rows))
    baselines = [f["baseline"] for f in figs if f["baseline"] is not None]
    if sigma is None and len(baselines) > 1:
        sigma = statistics.stdev(baselines)
    return report_verdict.unit_sample(arm.rows, arm.direction, arm.columns, sigma)


def default_out(paths: list[Path]) -> Path:
    if len(paths) != 1:
        raise HarnessError("several runs compared: pass --out DIR to say where the report goes.")
    path = Path(paths[0])
    return path.parent if path.is_file() else path


def build(paths: list[Path], out: Path | None = None) -> Report:
    """Write report.md, report.html (self-contained) and summary.json; return where they are."""
    from . import report_render

    paths = [Path(p) for p in paths]
    summary, arms = summarize(paths)
    out_dir = Path(out) if out is not None else default_out(paths)
    out_dir.mkdir(parents=True, exist_ok=True)
    series = {a.label: progress_series(a) for a in arms}
    try:
        plots = report_render.plots(summary, arms, series)
    except ImportError:  # matplotlib is an extra: the figures and tables do not need it
        plots = {}
        summary["notes"] = ["No plots: install matplotlib (pip install 'autoresearch-harness[report]')."]
    plot_paths = {}
    (out_dir / "plots").mkdir(exist_ok=True)
    for name, png in plots.items():
        plot_paths[name] = out_dir / "plots" / f"{name}.png"
        plot_paths[name].write_bytes(png)
    md = out_dir / "report.md"
    md.write_text(report_render.markdown(summary, {k: f"plots/{k}.png" for k in plots}))
    html = out_dir / "report.html"
    html.write_text(report_render.html(summary, plots))
    js = out_dir / "summary.json"
    js.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return Report(out_dir, summary, md, html, js, plot_paths)
