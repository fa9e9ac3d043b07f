"""Coverage of `harness elo`'s intervals on simulated tournaments with known strengths.

Each replication draws the arms' true strengths (log-odds, sd TRUE_SD), then plays every
(workload, repeat) task as elo_sim does: each arm's final improvement is a monotone function of
its strength plus Gumbel noise, so P(i beats j) is exactly Bradley-Terry's and the true Elo of
every arm over the anchor (arm 0) is known. The outcomes go through the project's own fit
(elo.fit_component and elo.intervals, what `harness elo` runs on the ledgers; a suite test checks
that the two agree), once per interval method, on the same tournaments. Printed per grid cell
(arms x workloads x repeats): the share of arms whose stated 90% and 95% intervals cover their
true Elo, and the intervals' mean width, for each method side by side; then per method and level
the cells within +-3 points of nominal, the mean coverage, the worst miss and the mean width.

Methods: "before", the posterior as it was (each task's pairs weighed by 2 / its arms, the
normal prior alone); "after", `harness elo`'s default (each task's pairs weighed as its ranking
warrants, elo_fit.ranking_weight; Jeffreys' prior); with --bootstrap also the percentile
bootstrap over tasks (the method before that; slow).

    python benchmarks/elo_coverage.py                    # the grid, 600 replications a two-arm cell
    python benchmarks/elo_coverage.py --reps 100 --arms 2 --workloads 1 --repeats 2   # one cell
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from common import ROOT  # noqa: F401  (puts the repo root on sys.path)

from harness.reporting import elo  # noqa: E402

TRUE_SD = 1.0  # log-odds: the spread of the arms' true strengths (about 174 Elo)
LEVELS = (0.90, 0.95)
TARGET = 0.03  # a cell is calibrated when its coverage is within this of nominal
BOOTSTRAP_DRAWS = 200  # per fit of the bootstrap: its percentiles are stable to a point
POSTERIOR_DRAWS = 1000
METHODS = {"before": elo.Settings(interval="posterior", draws=POSTERIOR_DRAWS, weigh="2/A", jeffreys=False),
           "after": elo.Settings(interval="posterior", draws=POSTERIOR_DRAWS)}
BOOTSTRAP = {"bootstrap": elo.Settings(interval="bootstrap", draws=BOOTSTRAP_DRAWS)}
GRID = {"arms": (2, 4, 6), "workloads": (1, 3, 8, 24), "repeats": (1, 3, 5)}


def simulate(n_arms: int, workloads: int, repeats: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(true strengths, u): u[t, a] is arm a's latent result on task t (higher = better), tasks
    ordered workload by workload, repeat by repeat."""
    strengths = rng.normal(0.0, TRUE_SD, n_arms)
    u = strengths + rng.gumbel(0.0, 1.0, (workloads * repeats, n_arms))
    return strengths, u


def outcomes(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fit's input (T x A x A scores and games): within a task every pair meets once."""
    t, a = u.shape
    scores = (u[:, :, None] > u[:, None, :]).astype(float)
    games = np.ones((t, a, a)) - np.eye(a)
    return scores, games


def true_elo(strengths: np.ndarray) -> np.ndarray:
    return elo.elo_fit.ANCHOR_ELO + elo.elo_fit.ELO_PER_LOGIT * (strengths - strengths[0])


def draws_of(u: np.ndarray, settings: elo.Settings) -> np.ndarray | None:
    """The draws (anchor arm 0) from elo.fit_component, the code `harness elo` runs; None: no interval."""
    scores, games = outcomes(u)
    return elo.fit_component(list(range(u.shape[1])), 0, scores, games, settings)[1]


def cell(n_arms: int, workloads: int, repeats: int, reps: int, seed: int = 0,
         methods: dict[str, elo.Settings] = METHODS) -> dict[str, dict[str, float | None]]:
    """Coverage, its standard error and the mean width per method and level over reps
    replications (None: no interval). All methods see the same tournaments."""
    rng = np.random.default_rng(seed)
    hits = {(m, lv): [] for m in methods for lv in LEVELS}
    widths = {(m, lv): [] for m in methods for lv in LEVELS}
    for r in range(reps):
        strengths, u = simulate(n_arms, workloads, repeats, rng)
        truth = true_elo(strengths)
        for m, base in methods.items():
            draws = draws_of(u, elo.Settings(interval=base.interval, draws=base.draws, seed=r, weigh=base.weigh,
                                             jeffreys=base.jeffreys))
            for lv in LEVELS:
                for k, ci in enumerate(elo.intervals(draws, lv, n_arms)[1:], 1):
                    if ci is not None:
                        hits[m, lv].append(ci[0] <= truth[k] <= ci[1])
                        widths[m, lv].append(ci[1] - ci[0])
    out = {}
    for m in methods:
        for lv in LEVELS:
            h = hits[m, lv]
            # The standard error counts replications, not arms: one tournament's arms share an anchor.
            out[f"{m} {lv:.0%}"] = {"coverage": float(np.mean(h)) if h else None,
                                    "se": math.sqrt(lv * (1 - lv) / reps) if h else None,
                                    "width": float(np.mean(widths[m, lv])) if h else None}
    return out


def _cells(result: dict[str, dict[str, float | None]]) -> str:
    out = []
    for v in result.values():
        out.append("no interval" if v["coverage"] is None else f"{v['coverage']:6.1%} {v['width']:5.0f}")
    return " ".join(f"{c:>13}" for c in out)


def summary(results: list[dict[str, dict[str, float | None]]], key: str, level: float) -> dict[str, float]:
    """Over the cells with an interval: cells within TARGET of nominal, mean coverage, worst miss, mean width."""
    cov = [r[key]["coverage"] for r in results if r[key]["coverage"] is not None]
    wid = [r[key]["width"] for r in results if r[key]["coverage"] is not None]
    miss = [c - level for c in cov]
    worst = max(miss, key=abs) if miss else 0.0
    return {"cells": len(cov), "within": sum(abs(m) <= TARGET + 1e-12 for m in miss),
            "mean": float(np.mean(cov)) if cov else math.nan, "worst": worst,
            "width": float(np.mean(wid)) if wid else math.nan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=600,
                        help="replications of a two-arm cell (more arms: reps * 3 / (arms + 1))")
    parser.add_argument("--bootstrap", action="store_true", help="also the bootstrap over tasks (slow)")
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=sorted(METHODS),
                        help="which posteriors to measure (a cell re-measured with more replications: after)")
    for key, values in GRID.items():
        parser.add_argument(f"--{key}", type=int, nargs="+", default=list(values))
    args = parser.parse_args()
    methods = {**{k: v for k, v in METHODS.items() if k in args.methods}, **(BOOTSTRAP if args.bootstrap else {})}
    print(f"true strengths ~ N(0, {TRUE_SD:g}) log-odds; {args.reps} replications a two-arm cell; coverage of the "
          f"true Elo over the anchor, and mean width (Elo). before: posterior, pairs weighed 2 / arms, normal "
          f"prior; after: posterior, each task weighed as its ranking warrants, Jeffreys' prior ({POSTERIOR_DRAWS} draws)"
          + (f"; bootstrap over tasks ({BOOTSTRAP_DRAWS} draws)" if args.bootstrap else ""))
    keys = [f"{m} {lv:.0%}" for m in methods for lv in LEVELS]
    print(f"{'arms':>4} {'workloads':>9} {'repeats':>7} {'tasks':>5} {'reps':>4} "
          + " ".join(f"{k:>13}" for k in keys) + "  (+-se at 90%)")
    t0 = time.monotonic()
    results = []
    for a in args.arms:
        for w in args.workloads:
            for r in args.repeats:
                # More arms give more intervals a replication (correlated through the anchor): fewer reps.
                reps = math.ceil(args.reps * 3 / (a + 1))
                result = cell(a, w, r, reps, seed=1000 * a + 10 * w + r, methods=methods)
                results.append(result)
                se = result[keys[0]]["se"]
                print(f"{a:>4} {w:>9} {r:>7} {w * r:>5} {reps:>4} {_cells(result)}"
                      + (f"  {se:.1%}" if se is not None else ""), flush=True)
    print(f"\nover the cells with an interval, within +-{TARGET:.0%} of nominal, mean coverage, worst miss, "
          f"mean width:")
    for key in keys:
        level = float(key.split()[-1].rstrip("%")) / 100
        s = summary(results, key, level)
        print(f"  {key:<15} {s['within']:>2} of {s['cells']} cells   mean {s['mean']:.1%}   worst {s['worst']:+.1%}"
              f"   width {s['width']:.0f}")
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
