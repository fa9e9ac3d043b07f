"""Coverage of `harness elo`'s intervals on simulated tournaments with known strengths.

Each replication draws the arms' true strengths (log-odds, sd TRUE_SD), then plays every
(workload, repeat) task as elo_sim does: each arm's final improvement is a monotone function of
its strength plus Gumbel noise, so P(i beats j) is exactly Bradley-Terry's and the true Elo of
every arm over the anchor (arm 0) is known. The outcomes go through the project's own fit
(elo.fit_component and elo.intervals, what `harness elo` runs on the ledgers; a suite test checks
that the two agree), once per interval method. Printed per grid cell (arms x workloads x repeats): the share of
arms whose stated 90% and 95% intervals cover their true Elo, and the intervals' mean width,
before (the bootstrap over tasks) and after (the Bradley-Terry posterior), side by side.

    python benchmarks/elo_coverage.py                    # the grid, 100 replications a cell
    python benchmarks/elo_coverage.py --reps 20 --arms 2 --workloads 1 --repeats 2   # one cell
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from common import ROOT  # noqa: F401  (puts the repo root on sys.path)

from harness import elo  # noqa: E402

TRUE_SD = 1.0  # log-odds: the spread of the arms' true strengths (about 174 Elo)
LEVELS = (0.90, 0.95)
BOOTSTRAP_DRAWS = 200  # per fit of the "before" method: its percentiles are stable to a point
POSTERIOR_DRAWS = 1000
METHODS = {"before": elo.Settings(interval="bootstrap", draws=BOOTSTRAP_DRAWS),
           "after": elo.Settings(interval="posterior", draws=POSTERIOR_DRAWS)}
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


def cell(n_arms: int, workloads: int, repeats: int, reps: int, seed: int = 0) -> dict[str, dict[str, float | None]]:
    """Coverage and mean width per method and level over reps replications (None: no interval)."""
    rng = np.random.default_rng(seed)
    hits = {(m, lv): [] for m in METHODS for lv in LEVELS}
    widths = {(m, lv): [] for m in METHODS for lv in LEVELS}
    for r in range(reps):
        strengths, u = simulate(n_arms, workloads, repeats, rng)
        truth = true_elo(strengths)
        for m, base in METHODS.items():
            draws = draws_of(u, elo.Settings(interval=base.interval, draws=base.draws, seed=r))
            for lv in LEVELS:
                for k, ci in enumerate(elo.intervals(draws, lv, n_arms)[1:], 1):
                    if ci is not None:
                        hits[m, lv].append(ci[0] <= truth[k] <= ci[1])
                        widths[m, lv].append(ci[1] - ci[0])
    return {f"{m} {lv:.0%}": {"coverage": float(np.mean(hits[m, lv])) if hits[m, lv] else None,
                              "width": float(np.mean(widths[m, lv])) if widths[m, lv] else None}
            for m in METHODS for lv in LEVELS}


def _cells(text: dict[str, dict[str, float | None]]) -> str:
    out = []
    for key, v in text.items():
        out.append("   no interval" if v["coverage"] is None else f"{v['coverage']:6.1%} {v['width']:6.0f}")
    return " ".join(f"{c:>14}" for c in out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=100, help="replications per cell (arms x workloads x repeats)")
    for key, values in GRID.items():
        parser.add_argument(f"--{key}", type=int, nargs="+", default=list(values))
    args = parser.parse_args()
    print(f"true strengths ~ N(0, {TRUE_SD:g}) log-odds; {args.reps} replications a cell; coverage of the "
          f"true Elo over the anchor, and mean width (Elo); before: bootstrap over tasks ({BOOTSTRAP_DRAWS} "
          f"draws), after: Bradley-Terry posterior ({POSTERIOR_DRAWS} draws)")
    head = " ".join(f"{k:>14}" for k in (f"{m} {lv:.0%}" for m in METHODS for lv in LEVELS))
    print(f"{'arms':>4} {'workloads':>9} {'repeats':>7} {'tasks':>5} {head}")
    t0 = time.monotonic()
    misses = {lv: [] for lv in LEVELS}
    for a in args.arms:
        for w in args.workloads:
            for r in args.repeats:
                reps = math.ceil(args.reps * 3 / (a - 1 + 2))  # fewer arms, fewer intervals each: more reps
                result = cell(a, w, r, reps, seed=1000 * a + 10 * w + r)
                for lv in LEVELS:
                    c = result[f"after {lv:.0%}"]["coverage"]
                    if c is not None:
                        misses[lv].append(abs(c - lv))
                print(f"{a:>4} {w:>9} {r:>7} {w * r:>5} {_cells(result)}", flush=True)
    for lv in LEVELS:
        if misses[lv]:
            print(f"after, {lv:.0%}: worst cell {max(misses[lv]):.1%} from nominal, mean {np.mean(misses[lv]):.1%}")
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
