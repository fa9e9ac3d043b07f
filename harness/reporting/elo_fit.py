"""The Bradley-Terry fit on the Elo scale, its bootstrap over tasks, and the comparison graph.

Outcomes come in per task as two A x A matrices: games[i, j] = games[j, i], the comparisons of
i and j, and score[i, j], i's wins over j (a tie counts 0.5), so score[i, j] + score[j, i] =
games[i, j]. A Bradley-Terry model says
P(i beats j) = 1 / (1 + exp(-(theta_i - theta_j))): a logistic regression without intercept
on rows x = e_i - e_j, fitted by Newton's method (with a small L2 penalty so that an arm that
always wins gets a large but finite rating). Ratings are shown on the Elo scale
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
    each in index order, ordered by their first arm. A search over the few arms of a tournament
    (scipy's csgraph would cost more to import than the search takes)."""
    joined = (games > 0) | (games.T > 0)
    seen: set[int] = set()
    groups = []
    for start in range(len(games)):
        if start in seen:
            continue
        group, frontier = {start}, [start]
        while frontier:
            new = {int(j) for i in frontier for j in np.flatnonzero(joined[i])} - group
            group |= new
            frontier = list(new)
        seen |= group
        groups.append(sorted(group))
    return groups


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


def _log_jeffreys(z: np.ndarray, pairs: tuple[np.ndarray, ...], anchor: int) -> np.ndarray:
    """Half the log-determinant of the games' Fisher information at each row of z (n x A): the
    log of Jeffreys' prior. The information is the comparison graph's Laplacian with edge
    weights games * p * (1 - p); with the anchor's row and column removed its determinant is
    the same whichever arm is removed (the matrix-tree theorem) and positive on a connected graph."""
    i, j, g, _ = pairs
    x = z[:, i] - z[:, j]
    w = g * np.exp(-np.logaddexp(0, x) - np.logaddexp(0, -x))  # games * p * (1 - p), n x pairs, no overflow
    incidence = np.zeros((len(i), z.shape[1]))
    incidence[np.arange(len(i)), i] = 1
    incidence[np.arange(len(i)), j] = -1
    keep = [k for k in range(z.shape[1]) if k != anchor]
    b = incidence[:, keep]
    info = np.einsum("pa,np,pb->nab", b, w, b)
    sign, logdet = np.linalg.slogdet(info)
    return np.where(sign > 0, 0.5 * logdet, -np.inf)


def posterior_elo(score: np.ndarray, games: np.ndarray, anchor: int, draws: int, seed: int,
                  l2: float = L2_PENALTY, jeffreys: bool = True) -> np.ndarray:
    """draws x A Elo ratings from the Bradley-Terry posterior.

    The prior is Jeffreys' (the square root of the determinant of the games' Fisher
    information) times the fit's small normal penalty; without jeffreys the normal alone.
    Jeffreys' prior is what makes the intervals calibrated with few tasks (docs/elo.md: the
    normal's sd of 550 Elo, far wider than any real spread of researchers, leaves a unanimous
    record's upper tail too long and the lower too short: 83-86% coverage at 90% with 3-5 tasks).
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
    played = games.sum(axis=1) > 0
    if jeffreys and len(i) and played.sum() > 1:
        members = np.flatnonzero(played)  # the information of the arms that played (a connected component)
        local = {int(a): k for k, a in enumerate(members)}
        sub = (np.array([local[int(x)] for x in i]), np.array([local[int(x)] for x in j]), g, s)
        log_post = log_post + _log_jeffreys(z[:, members], sub, local.get(anchor, 0))
    dev = z - theta
    log_q = -0.5 * np.einsum("nk,kl,nl->n", dev, np.linalg.inv(cov), dev)
    w = np.exp(log_post - log_q - np.max(log_post - log_q))
    picked = z[rng.choice(n, draws, p=w / w.sum())]
    if not played[anchor]:
        return np.full((draws, len(theta)), np.nan)
    elo = ANCHOR_ELO + ELO_PER_LOGIT * (picked - picked[:, [anchor]])
    return np.where(played, elo, np.nan)


def ranking_weight(theta: np.ndarray) -> float:
    """The weight that gives one task's pairs the curvature its ranking warrants, at strengths theta.

    A task ranks its m arms from one result each (a latent strength plus Gumbel noise: the
    Plackett-Luce model, whose pairs are exactly Bradley-Terry's). Treated as independent games,
    its pairs' log-likelihood has curvature H (the Laplacian with weights p (1 - p)); but pairs that
    share an arm are correlated, so the score's variance is J, not H. The weight is 1 / the largest
    ratio of J to H over the directions of the log-strengths' differences: 3 / (m + 1) where the
    arms are alike (every direction's: a rank's variance (m^2 - 1) / 12 against (m - 1) / 4),
    rising to 1 as they draw apart (a sure pair carries no noise to share), clipped to that range.
    J is exact: pairs without a common arm are independent, and
    P(a > b > c) = e^a / (e^a + e^b + e^c) * e^b / (e^b + e^c) gives every pair of pairs that shares one.
    """
    m = len(theta)
    if m < 3:
        return 1.0
    e = np.exp(theta - theta.max())
    pairs = [(a, b) for a in range(m) for b in range(a + 1, m)]
    p = {(a, b): e[a] / (e[a] + e[b]) for a, b in pairs}
    x = np.zeros((len(pairs), m))  # each pair's direction e_a - e_b
    for k, (a, b) in enumerate(pairs):
        x[k, a], x[k, b] = 1.0, -1.0
    cov = np.diag([p[q] * (1 - p[q]) for q in pairs])
    orders: dict[tuple[int, ...], float] = {}

    def order(a: int, b: int, c: int) -> float:  # P(a > b > c)
        key = (a, b, c)
        if key not in orders:
            orders[key] = e[a] / (e[a] + e[b] + e[c]) * e[b] / (e[b] + e[c])
        return orders[key]

    for k, (a, b) in enumerate(pairs):
        for l, (c, d) in enumerate(pairs):
            if l <= k or not {a, b} & {c, d}:
                continue
            trio = sorted({a, b, c, d})
            both = 0.0  # P(a beats b and c beats d): over the orders of the three arms
            for first in trio:
                for second in trio:
                    if second == first:
                        continue
                    third = next(t for t in trio if t not in (first, second))
                    rank = {first: 0, second: 1, third: 2}
                    if rank[a] < rank[b] and rank[c] < rank[d]:
                        both += order(first, second, third)
            cov[k, l] = cov[l, k] = both - p[a, b] * p[c, d]
    h = x.T @ (np.diag(cov)[:, None] * x)
    j = x.T @ cov @ x
    # On the log-strengths' differences (an orthonormal basis of the vectors summing to zero):
    # the largest ratio of J to H over all directions, so that no difference is given more
    # weight than its ranking warrants (the mean ratio, trace(H^+ J) / (m - 1), left some too narrow).
    basis = np.linalg.svd(np.eye(m) - 1 / m)[0][:, : m - 1]
    hh, jj = basis.T @ h @ basis, basis.T @ j @ basis
    try:
        chol = np.linalg.cholesky(hh)
    except np.linalg.LinAlgError:  # a sure ranking: no pair carries noise
        return 1.0
    inv = np.linalg.inv(chol)
    ratio = float(np.linalg.eigvalsh(inv @ jj @ inv.T).max())
    # Clipped to [3 / (m + 1), 1]: the weight for alike arms at the least (a close cluster among far
    # arms can ask for a little less; the benchmark measured the clipped weight).
    return float(np.clip(1 / ratio, 3 / (m + 1), 1.0)) if ratio > 0 else 1.0


def interval(samples: np.ndarray, level: float) -> tuple[float, float] | None:
    """The percentile interval of one arm's draws; None when too few draws could rate it."""
    valid = samples[~np.isnan(samples)]
    if len(samples) == 0 or len(valid) < MIN_VALID_DRAWS * len(samples):
        return None
    lo, hi = np.percentile(valid, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)
