"""The Bradley-Terry fit on the Elo scale, its bootstrap over tasks, and the comparison graph.

Outcomes come in per task as two A x A matrices: games[i, j] = games[j, i], the comparisons of
i and j, and score[i, j], i's wins over j (a tie counts 0.5), so score[i, j] + score[j, i] =
games[i, j]. A Bradley-Terry model says
P(i beats j) = 1 / (1 + exp(-(theta_i - theta_j))): a logistic regression without intercept
on rows x = e_i - e_j, which scikit-learn fits (L-BFGS, with a small L2 penalty so that an arm
that always wins gets a large but finite rating). Ratings are shown on the Elo scale
(400 / ln 10 per unit of log-odds), the anchor arm at 1000. All functions are pure.
"""
from __future__ import annotations

import math

import numpy as np

ELO_PER_LOGIT = 400 / math.log(10)
ANCHOR_ELO = 1000.0
L2_PENALTY = 0.1  # prior precision on each log-strength: a prior sd of ~550 Elo, small next to data
MIN_VALID_DRAWS = 0.5  # an interval needs at least this share of bootstrap draws to define the arm
NEWTON_STEPS = 100  # the fit's iterations at most (it converges in under 20)
NEWTON_TOL = 1e-10  # log-odds: a step this small is converged
PROPOSAL_WIDEN = 2.0  # the posterior sampler's proposal: this many times the Laplace covariance
PROPOSALS_PER_DRAW = 4  # proposals drawn per posterior draw kept (importance resampling)


def components(games: np.ndarray) -> list[list[int]]:
    """Connected components of the comparison graph (arms joined when compared at least once),
    each in index order, ordered by their first arm."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    n, labels = connected_components(csr_matrix(games > 0), directed=False)
    groups = [sorted(int(i) for i in np.flatnonzero(labels == c)) for c in range(n)]
    return sorted(groups, key=lambda g: g[0])


def _pairs(score: np.ndarray, games: np.ndarray) -> tuple[np.ndarray, ...]:
    """(i, j, games, i's score) of every pair i < j that met."""
    i, j = np.triu_indices(score.shape[0], 1)
    met = games[i, j] > 0
    return i[met], j[met], games[i, j][met], score[i, j][met]


def _objective(theta: np.ndarray, pairs: tuple[np.ndarray, ...], l2: float) -> float:
    """The negative penalised log-likelihood: each comparison a win (score) and a loss (the rest)."""
    i, j, g, s = pairs
    d = theta[i] - theta[j]
    return float(np.sum(s * np.logaddexp(0, -d) + (g - s) * np.logaddexp(0, d)) + 0.5 * l2 * theta @ theta)


def _hessian(theta: np.ndarray, pairs: tuple[np.ndarray, ...], l2: float) -> np.ndarray:
    """The objective's Hessian: the games' Fisher information plus the prior's precision."""
    i, j, g, _ = pairs
    p = 1 / (1 + np.exp(-(theta[i] - theta[j])))
    w = g * p * (1 - p)
    h = l2 * np.eye(len(theta))
    np.add.at(h, (i, i), w)
    np.add.at(h, (j, j), w)
    np.add.at(h, (i, j), -w)
    np.add.at(h, (j, i), -w)
    return h


def fit_logits(score: np.ndarray, games: np.ndarray, l2: float = L2_PENALTY) -> np.ndarray:
    """Log-strengths theta (mean zero) maximising the penalised Bradley-Terry likelihood.

    A logistic regression without intercept on rows e_i - e_j (a tie is half a win, half a loss),
    solved by Newton's method with step halving: the objective is strictly convex (the penalty),
    so a few steps reach the optimum whatever the start.
    """
    pairs = _pairs(score, games)
    theta = np.zeros(score.shape[0])
    if not len(pairs[2]):
        return theta
    i, j, g, s = pairs
    current = _objective(theta, pairs, l2)
    for _ in range(NEWTON_STEPS):
        r = g / (1 + np.exp(-(theta[i] - theta[j]))) - s  # d objective / d (theta_i - theta_j)
        grad = l2 * theta
        np.add.at(grad, i, r)
        np.add.at(grad, j, -r)
        step = np.linalg.solve(_hessian(theta, pairs, l2), grad)
        while True:
            trial = theta - step
            value = _objective(trial, pairs, l2)
            if value <= current or np.abs(step).max() < NEWTON_TOL:
                break
            step /= 2
        theta, current = trial, value
        if np.abs(step).max() < NEWTON_TOL:
            break
    return theta - theta.mean()


def to_elo(theta: np.ndarray, anchor: int) -> np.ndarray:
    return ANCHOR_ELO + ELO_PER_LOGIT * (theta - theta[anchor])


def fit_elo(score: np.ndarray, games: np.ndarray, anchor: int, l2: float = L2_PENALTY) -> np.ndarray:
    """Elo ratings of every arm, the anchor at 1000; NaN for an arm without any comparison."""
    elo = to_elo(fit_logits(score, games, l2), anchor)
    played = games.sum(axis=1) > 0
    if not played[anchor]:
        return np.full(len(elo), np.nan)
    return np.where(played, elo, np.nan)


def bootstrap_elo(scores: np.ndarray, games: np.ndarray, anchor: int, draws: int, seed: int,
                  l2: float = L2_PENALTY) -> np.ndarray:
    """draws x A Elo ratings, each fitted on tasks resampled with replacement.

    scores and games are T x A x A (one matrix per task): outcomes within a task are correlated
    (one night, one baseline), so the task is the unit that is resampled. A draw in which an
    arm (or the anchor) was never compared leaves NaN for it.
    """
    rng = np.random.default_rng(seed)
    t = scores.shape[0]
    out = np.empty((draws, scores.shape[1]))
    if t == 1:  # every resample of one task is that task (one A/B): one fit says it all
        out[:] = fit_elo(scores[0], games[0], anchor, l2)
        return out
    for d in range(draws):
        counts = np.bincount(rng.integers(0, t, t), minlength=t).astype(float)
        out[d] = fit_elo(np.tensordot(counts, scores, axes=1), np.tensordot(counts, games, axes=1), anchor, l2)
    return out


def posterior_elo(score: np.ndarray, games: np.ndarray, anchor: int, draws: int, seed: int,
                  l2: float = L2_PENALTY) -> np.ndarray:
    """draws x A Elo ratings from the Bradley-Terry posterior, the penalty as its normal prior.

    Sampling-importance-resampling: proposals from a normal at the fit with PROPOSAL_WIDEN times
    its Laplace covariance (the inverse Hessian), reweighted by the exact posterior over the
    proposal's density, then resampled. The posterior is skewed where an arm won (nearly) always;
    the reweighting follows the skew that the normal alone would miss. An arm never compared
    (or an anchor never compared) is NaN, as in fit_elo.
    """
    pairs = _pairs(score, games)
    theta = fit_logits(score, games, l2)
    cov = np.linalg.inv(_hessian(theta, pairs, l2)) * PROPOSAL_WIDEN
    rng = np.random.default_rng(seed)
    n = draws * PROPOSALS_PER_DRAW
    z = rng.multivariate_normal(theta, cov, n, method="cholesky")
    i, j, g, s = pairs
    d = z[:, i] - z[:, j]
    log_post = -(np.sum(s * np.logaddexp(0, -d) + (g - s) * np.logaddexp(0, d), axis=1)
                 + 0.5 * l2 * np.sum(z * z, axis=1))
    dev = z - theta
    log_q = -0.5 * np.einsum("nk,kl,nl->n", dev, np.linalg.inv(cov), dev)
    w = np.exp(log_post - log_q - np.max(log_post - log_q))
    picked = z[rng.choice(n, draws, p=w / w.sum())]
    played = games.sum(axis=1) > 0
    if not played[anchor]:
        return np.full((draws, len(theta)), np.nan)
    elo = ANCHOR_ELO + ELO_PER_LOGIT * (picked - picked[:, [anchor]])
    return np.where(played, elo, np.nan)


def interval(samples: np.ndarray, level: float) -> tuple[float, float] | None:
    """The percentile interval of one arm's draws; None when too few draws could rate it."""
    valid = samples[~np.isnan(samples)]
    if len(samples) == 0 or len(valid) < MIN_VALID_DRAWS * len(samples):
        return None
    lo, hi = np.percentile(valid, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)
