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


def components(games: np.ndarray) -> list[list[int]]:
    """Connected components of the comparison graph (arms joined when compared at least once),
    each in index order, ordered by their first arm."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    n, labels = connected_components(csr_matrix(games > 0), directed=False)
    groups = [sorted(int(i) for i in np.flatnonzero(labels == c)) for c in range(n)]
    return sorted(groups, key=lambda g: g[0])


def fit_logits(score: np.ndarray, games: np.ndarray, l2: float = L2_PENALTY) -> np.ndarray:
    """Log-strengths theta (mean zero) maximising the penalised Bradley-Terry likelihood.

    Each comparison enters as a win row (y=1) weighted by its score and a loss row weighted by
    the rest, and again mirrored (-x, 1-y) so the fit is symmetric and has both classes.
    """
    from sklearn.linear_model import LogisticRegression

    n = score.shape[0]
    xs, ys, ws = [], [], []
    for i in range(n):
        for j in range(i + 1, n):
            g, won = games[i, j], score[i, j]
            if g <= 0:
                continue
            x = np.zeros(n)
            x[i], x[j] = 1.0, -1.0
            for sign, y, w in ((1, 1, won), (1, 0, g - won), (-1, 0, won), (-1, 1, g - won)):
                if w > 0:
                    xs.append(sign * x)
                    ys.append(y)
                    ws.append(w / 2)  # mirrored: every comparison counts once in all
    if not xs:
        return np.zeros(n)
    model = LogisticRegression(fit_intercept=False, C=1.0 / l2, solver="lbfgs", max_iter=1000, tol=1e-8)
    model.fit(np.asarray(xs), np.asarray(ys), sample_weight=np.asarray(ws))
    theta = model.coef_[0]
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


def interval(samples: np.ndarray, level: float) -> tuple[float, float] | None:
    """The percentile interval of one arm's draws; None when too few draws could rate it."""
    valid = samples[~np.isnan(samples)]
    if len(samples) == 0 or len(valid) < MIN_VALID_DRAWS * len(samples):
        return None
    lo, hi = np.percentile(valid, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)
