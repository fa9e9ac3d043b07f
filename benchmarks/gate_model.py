"""Variants of the noise gate's rule in a fast model of the loop (no git, no subprocesses).

gate_simulation.py measures the real loop, but at about 25 s per world it cannot compare many
rules over many worlds. This model replays the same worlds (gate_simulation.effects) with
the loop's bookkeeping: K baseline runs, sigma pooled over every repeat of identical code
(decide.pooled_sigma), a best that is the mean of its runs, a health re-run of the best
every 25 iterations, every run counted as GPU time. Printed per variant, mean over worlds:
false keeps, missed real improvements, the true final quality, training runs, and true
improvement per GPU-hour relative to strict.

    python benchmarks/gate_model.py [--worlds 100]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
from dataclasses import dataclass

from common import ROOT  # noqa: F401  (puts the repo root on sys.path)
from gate_simulation import effects

from harness.driver.decide import pooled_sigma  # noqa: E402

HEALTH_EVERY = 25


@dataclass(frozen=True)
class Rule:
    gate: str = "noise"
    z: float = 2.0
    first: float | None = None  # standard errors a first run needs to be confirmed (default z)
    clear: float | None = None  # standard errors above which a first run is kept unconfirmed
    confirm: int = 1  # extra runs for a win
    fold_health: bool = True  # health re-runs of the best count in its value (the harness does)
    unselected_sigma: bool = False  # a candidate's first (selected) run left out of sigma
    baseline_runs: int = 2
    cap: int | None = None  # sequential: up to this many extra runs, one at a time, while borderline
    drop: float = 0.0  # sequential: standard errors under which a borderline candidate is dropped
    prior_sd: float | None = None  # a normal prior on a change's true gain, in noise-floor sigmas


def score(rule: Rule, best: float, values: list[float], sigma: float, n_best: int) -> float:
    """Standard errors by which the mean of values beats best; under a prior (mean zero, sd
    prior_sd sigmas) the posterior mean of the gain over its posterior sd instead."""
    se2 = sigma * sigma * (1 / len(values) + 1 / n_best)
    gain = best - statistics.fmean(values)
    if rule.prior_sd is None:
        return gain / math.sqrt(se2)
    tau2 = (rule.prior_sd * sigma) ** 2
    shrink = tau2 / (tau2 + se2)
    return shrink * gain / math.sqrt(shrink * se2)


def sequential(rule: Rule, best: float, values: list[float], true: float, sigma: float, n_best: int,
               sd: float, rng: random.Random) -> tuple[bool, int]:
    """Extra runs one at a time while the candidate is borderline (between drop and z), up to cap:
    (kept, extra runs). A win needs at least one confirmation (the winner's curse)."""
    extra = 0
    while extra < rule.cap:
        values.append(true + rng.gauss(0, sd))
        extra += 1
        t = score(rule, best, values, sigma, n_best)
        if t < rule.drop:
            return False, extra
        if t > rule.z:
            return True, extra
    return False, extra


def play(rule: Rule, world: list[float], sd: float, rng: random.Random) -> dict[str, float]:
    """One night under rule; world holds each proposal's true effect (negative = better)."""
    groups: dict[int, list[float]] = {0: [1.0 + rng.gauss(0, sd) for _ in range(rule.baseline_runs)]}
    best_true, best_runs, best_key = 1.0, list(groups[0]), 0
    runs, kept = rule.baseline_runs, []
    for i, effect in enumerate(world, 1):
        sigma = pooled_sigma(groups.values())
        true = best_true + effect
        best = statistics.fmean(best_runs)
        values = [true + rng.gauss(0, sd)]
        runs += 1
        if rule.gate == "strict" or not sigma:
            keep = values[0] < best
        else:
            t = (best - values[0]) / (sigma * math.sqrt(1 + 1 / len(best_runs)))
            keep = False
            if rule.clear is not None and t > rule.clear:
                keep = True
            elif t > (rule.z if rule.first is None else rule.first):
                if rule.cap is None:
                    values += [true + rng.gauss(0, sd) for _ in range(rule.confirm)]
                    runs += rule.confirm
                    keep = score(rule, best, values, sigma, len(best_runs)) > rule.z
                else:
                    keep, extra = sequential(rule, best, values, true, sigma, len(best_runs), sd, rng)
                    runs += extra
                groups[i] = values[1:] if rule.unselected_sigma else list(values)
        if keep:
            kept.append(i)
            best_true, best_runs, best_key = true, list(values), i
        if i % HEALTH_EVERY == 0 and i < len(world):
            rerun = best_true + rng.gauss(0, sd)
            runs += 1
            group = groups.setdefault(best_key, list(best_runs[1:] if rule.unselected_sigma and best_key else best_runs))
            group.append(rerun)
            if rule.fold_health and rule.gate == "noise":
                best_runs.append(rerun)
    return {"false_keeps": sum(1 for i in kept if world[i - 1] >= 0),
            "missed_real": sum(1 for i, e in enumerate(world, 1) if e < 0 and i not in kept),
            "true_final": best_true, "runs": runs, "gain_per_run": (1.0 - best_true) / runs}


VARIANTS = {
    "strict": Rule(gate="strict", baseline_runs=1),
    "noise (the harness's rule)": Rule(),
    "noise, health re-runs not counted": Rule(fold_health=False),
    "noise, clear wins (> z+2) unconfirmed": Rule(clear=4.0),
    "noise, first bar 1, 1 confirmation": Rule(first=1.0),
    "noise, first bar 1, 3 confirmations": Rule(first=1.0, confirm=3),
    "noise, unselected runs for sigma": Rule(unselected_sigma=True),
    "noise, 3 baseline runs": Rule(baseline_runs=3),
    "noise, z 1.5": Rule(z=1.5),
    "noise, z 1": Rule(z=1.0),
    # issue 24: confirmation runs spent sequentially on borderline candidates, and a prior
    "sequential: bar 1, cap 3, drop 0": Rule(first=1.0, cap=3),
    "sequential: bar 1.5, cap 2, drop 0.5": Rule(first=1.5, cap=2, drop=0.5),
    "sequential: bar 1, cap 4, drop 0.5, z 1.75": Rule(first=1.0, cap=4, drop=0.5, z=1.75),
    "sequential: bar 1.5, cap 3, drop 1, z 1.5": Rule(first=1.5, cap=3, drop=1.0, z=1.5),
    "prior sd 3 sigma (z 2)": Rule(prior_sd=3.0),
    "prior sd 3 sigma, z 1.5": Rule(prior_sd=3.0, z=1.5),
    "prior sd 3, sequential bar 1, cap 3, z 1.5": Rule(prior_sd=3.0, first=1.0, cap=3, z=1.5),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, default=100)
    parser.add_argument("--proposals", type=int, default=300)
    parser.add_argument("--noise", type=float, default=0.005)
    parser.add_argument("--only", nargs="+", default=None, metavar="WORD",
                        help="the variants whose name has one of these words (strict is always run first)")
    args = parser.parse_args()
    worlds = [[e * args.noise for e in effects(args.proposals, seed)] for seed in range(args.worlds)]
    print(f"{args.worlds} worlds of {args.proposals} proposals (gate_simulation's default world), noise sd {args.noise}")
    print(f"{'variant':46}{'false keeps':>12}{'missed real':>12}{'true final':>11}{'runs':>7}"
          f"{'gain/GPU-h vs strict':>22}{'strict/false keeps':>20}")
    base = None
    chosen = {name: rule for name, rule in VARIANTS.items()
              if name == "strict" or args.only is None or any(w in name for w in args.only)}
    for name, rule in chosen.items():
        nights = [play(rule, w, args.noise, random.Random(1000 * seed + 7)) for seed, w in enumerate(worlds)]
        mean = {k: statistics.fmean(n[k] for n in nights) for k in nights[0]}
        base = base or mean
        print(f"{name:46}{mean['false_keeps']:>12.1f}{mean['missed_real']:>12.2f}{mean['true_final']:>11.4f}"
              f"{mean['runs']:>7.0f}{mean['gain_per_run'] / base['gain_per_run']:>21.3f}x"
              f"{base['false_keeps'] / max(mean['false_keeps'], 1e-9):>19.1f}x", flush=True)


if __name__ == "__main__":
    main()
