"""A simulator of tournaments that writes real results.tsv files (the ledger's own row format).

Arms have known strengths s (natural log-odds). On every task each arm's final improvement is
a monotone function of s + Gumbel noise, so P(i beats j) = 1 / (1 + exp(-(s_i - s_j))): the
Bradley-Terry model holds exactly and the true Elo difference is (s_i - s_j) * 400 / ln 10.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from harness import ledger
from harness.ledger import Row

TRAIN_S = 60.0  # every arm trains as long per iteration: the GPU budget is shared alike
ELO_PER_LOGIT = 400 / math.log(10)


@dataclass(frozen=True)
class SimArm:
    name: str
    agent: str
    model: str | None
    strength: float  # log-odds
    tokens_per_iteration: int = 0
    usd_per_1k_tokens: float = 0.0


def commit_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def write_ledger(path: Path, *, arm: str | None, agent: str, model: str | None, baseline_commit: str,
                 baseline: float, values: list[tuple[str, float]], tokens_per_row: int = 0,
                 usd_per_row: float = 0.0, baseline_repeats: tuple[float, ...] = (), repeat: int | None = None,
                 metric: str = "val_bpb", direction: str = "minimize", train_s: float = TRAIN_S) -> Path:
    """One run's ledger (baseline, its repeats, then (status, value) experiments) and its run.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [Row(commit=baseline_commit, metric=baseline, status="keep", description="baseline", iteration=0,
                arm=arm or "", agent=agent, model=model or "", train_s=train_s, wall_s=train_s + 5,
                input_tokens=0, cached_tokens=0, output_tokens=0, cost_usd=0.0, seed=repeat,
                runs=1 + len(baseline_repeats), started_at=f"2026-01-01T00:00:{(repeat or 0):02d}Z")]
    for k, v in enumerate(baseline_repeats, 1):
        rows.append(Row(commit=baseline_commit, metric=v, status="repeat", description="repeat of iteration 0",
                        iteration=0, arm=arm or "", agent=agent, model=model or "", train_s=train_s,
                        wall_s=train_s, candidate=0, seed=k))
    for i, (status, value) in enumerate(values, 1):
        rows.append(Row(commit=commit_of(f"{path}{i}"), metric=value, status=status, description=f"edit {i}",
                        iteration=i, arm=arm or "", agent=agent, model=model or "", train_s=train_s,
                        wall_s=train_s + 10, input_tokens=tokens_per_row * 4 // 5, cached_tokens=0,
                        output_tokens=tokens_per_row - tokens_per_row * 4 // 5, cost_usd=usd_per_row))
    lines = ["\t".join(ledger.columns(metric))] + ["\t".join(r.cells()) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    manifest = {"agent": agent, "model": model, "config": {"direction": direction, "arm": arm,
                                                            "repo": f"/repos/{baseline_commit[:4]}"}}
    if repeat is not None:
        manifest["repeat"] = repeat
    (path.parent / "run.json").write_text(json.dumps(manifest))
    return path


def trajectory(baseline: float, final: float, iterations: int) -> list[tuple[str, float]]:
    """Keeps that reach final by the last iteration, with discards (worse values) in between."""
    out = []
    for i in range(1, iterations + 1):
        if i % 2 == 0 or i == iterations:
            out.append(("keep", baseline - (baseline - final) * i / iterations))
        else:
            out.append(("discard", baseline + 0.01 * i))
    return out


def tournament(root: Path, arms: list[SimArm], workloads: int, repeats: int, seed: int,
               iterations: int = 4, task_length: dict[int, float] | None = None,
               explicit_repeat: bool = True) -> list[Path]:
    """Every arm on every (workload, repeat); workload w's tokens are scaled by task_length[w]."""
    rng = random.Random(seed)
    paths = []
    for w in range(workloads):
        commit = commit_of(f"workload {w} {seed}")
        base, scale = 1.0 + w, 0.1 * (w + 1)  # workloads differ in level and scale of the metric
        for r in range(1, repeats + 1):
            for arm in arms:
                u = arm.strength - math.log(-math.log(rng.random()))  # + Gumbel(0, 1)
                final = base - scale / (1 + math.exp(-u))
                tokens = round(arm.tokens_per_iteration * (task_length or {}).get(w, 1.0))
                paths.append(write_ledger(
                    root / f"w{w}" / f"r{r}" / arm.name / "results.tsv", arm=arm.name, agent=arm.agent,
                    model=arm.model, baseline_commit=commit, baseline=base,
                    values=trajectory(base, final, iterations), tokens_per_row=tokens,
                    usd_per_row=tokens / 1000 * arm.usd_per_1k_tokens,
                    repeat=r if explicit_repeat else None))
    return paths


def true_elo(arms: list[SimArm], anchor: str) -> dict[str, float]:
    ref = next(a.strength for a in arms if a.name == anchor)
    return {a.name: 1000 + ELO_PER_LOGIT * (a.strength - ref) for a in arms}
