"""The scaling law L(N, D) = E + A / N^alpha + B / D^beta, fitted as Hoffmann et al. 2022 (Chinchilla, approach 3)
did: the parameters (log A, log B, log E, alpha, beta), the Huber loss (delta 1e-3) of the residuals between
log L and the log of the prediction (a log-sum-exp of the three terms), minimised by L-BFGS-B (scipy.optimize)
from every start of a grid, the best kept.

The intervals come from a bootstrap over runs, not points: a run's points share its initialisation and data order
(a WSD trunk's branches share its stable phase too), so its noise moves them together, and resampling points
would count one run's luck as many independent draws. Each resample draws whole lineages (`groups`) with
replacement, holding at least three sizes, and is refitted from fresh starts drawn from the grid (a refit started
from the full fit stays near it and narrows the intervals). A prediction's interval adds a new run's own noise: the run-to-run
spread of log loss measured on repeats (the same size and duration on another data order), as a normal draw per
resample. A fit with a parameter at the bound of its search is degenerate: the points do not determine it, so it
gets no intervals at all. Pure NumPy and SciPy: no TensorFlow.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

HUBER_DELTA = 1e-3
NAMES = ("E", "A", "alpha", "B", "beta")
# Starts: Hoffmann et al.'s grid, thinned (theirs has 4,500 starts, a minute of fitting here; these 72 found the
# same optimum on every ladder and synthetic law tried).
GRID = {"a": (0.0, 8.0, 16.0), "b": (0.0, 8.0, 16.0), "e": (-1.0, 0.5), "alpha": (0.3, 0.9), "beta": (0.3, 0.9)}
BOUNDS = [(-10.0, 60.0), (-10.0, 60.0), (-5.0, 5.0), (0.0, 4.0), (0.0, 4.0)]  # a, b, e, alpha, beta
THETA_NAMES = ("A", "B", "E", "alpha", "beta")  # theta's order, by the parameter each holds
# A bootstrap refit starts from 8 of the grid's starts drawn at random (the fit from all 72): a third or more of
# the starts reach the best optimum of a resample, so 8 miss it rarely, and a refit costs a ninth of the fit.
RESAMPLE_STARTS = 8
MIN_SIZES = 3  # a bootstrap resample holds points of at least this many sizes N (see fit)


def law(theta, n, d):
    """theta = (a, b, e, alpha, beta) -> L(N, D)."""
    a, b, e, alpha, beta = theta
    return np.exp(e) + np.exp(a) / np.power(n, alpha) + np.exp(b) / np.power(d, beta)


def _objective(theta, log_n, log_d, log_l):
    """Huber loss of the log residuals, and its gradient, both over delta squared: unscaled, a gradient of a few
    delta is under L-BFGS-B's tolerance (1e-5) and each start stops where it happens to be; scaled, a third of
    the grid's starts reach the same optimum. (Few NumPy calls: a fit makes tens of thousands of them.)"""
    a, b, e, alpha, beta = theta
    terms = np.empty((3, len(log_n)))
    terms[0] = a - alpha * log_n
    terms[1] = b - beta * log_d
    terms[2] = e
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    total = weights.sum(axis=0)
    residual = top + np.log(total) - log_l
    size = np.abs(residual)
    small = size <= HUBER_DELTA
    loss = np.where(small, 0.5 * residual * residual, HUBER_DELTA * (size - 0.5 * HUBER_DELTA)).sum()
    slope = np.where(small, residual, HUBER_DELTA * np.sign(residual)) / total
    weighted = weights * slope
    grad = np.empty(5)
    grad[:3] = weighted.sum(axis=1)
    grad[3] = -weighted[0] @ log_n
    grad[4] = -weighted[1] @ log_d
    scale = 1.0 / HUBER_DELTA ** 2
    return float(loss) * scale, grad * scale


def _minimise(start, log_n, log_d, log_l, bounds=BOUNDS):
    result = minimize(_objective, np.asarray(start, dtype=np.float64), args=(log_n, log_d, log_l), jac=True,
                      method="L-BFGS-B", bounds=bounds)
    return result.fun, result.x


def grid_starts() -> list:
    return [(a, b, e, alpha, beta) for a, b, e, alpha, beta in
            itertools.product(GRID["a"], GRID["b"], GRID["e"], GRID["alpha"], GRID["beta"])]


def resample_starts(rng) -> list:
    """A bootstrap refit's starts: RESAMPLE_STARTS of the grid's, drawn afresh for each resample (none taken from
    the full fit)."""
    grid = grid_starts()
    return [grid[i] for i in rng.choice(len(grid), RESAMPLE_STARTS, replace=False)]


def _best(n, d, loss, starts, bounds):
    """(objective, theta) of the best of the fits from `starts` within `bounds`."""
    log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)
    return min((_minimise(start, log_n, log_d, log_l, bounds) for start in starts), key=lambda found: found[0])


def fit_theta(n, d, loss, starts=None):
    """The best theta over the starts (default: the whole grid)."""
    return _best(n, d, loss, starts if starts is not None else grid_starts(), BOUNDS)[1]


def fit_with_e_held(n, d, loss, e_value: float):
    """(objective, theta) of the best fit with E held at `e_value` (> 0), from the grid's starts: the profile of
    the fit over E, which shows how far E can move before the points object when a fit leaves it at a bound."""
    e = float(np.log(e_value))
    bounds = list(BOUNDS)
    bounds[2] = (e, e)
    starts = list(dict.fromkeys((a, b, e, alpha, beta) for a, b, _, alpha, beta in grid_starts()))
    value, theta = _best(n, d, loss, starts, bounds)
    return float(value), theta


def at_bounds(theta) -> list:
    """The parameters the optimiser left at a bound of BOUNDS: the points do not determine them."""
    return [name for name, value, (low, high) in zip(THETA_NAMES, theta, BOUNDS)
            if min(value - low, high - value) < 1e-3]


@dataclass
class Fit:
    theta: np.ndarray                     # (a, b, e, alpha, beta) on all points
    samples: np.ndarray                   # bootstrap thetas, [resamples, 5]; none when the fit is degenerate
    n_points: int
    n_groups: int                         # the lineages the bootstrap resampled
    run_noise: Optional[float] = None     # a new run's own spread of log loss (from repeats); None: not measured
    level: float = 0.95
    extra: dict = field(default_factory=dict)

    @property
    def params(self) -> dict:
        return as_params(self.theta)

    @property
    def degenerate(self) -> list:
        """The parameters at a bound of the search (no intervals then)."""
        return at_bounds(self.theta)

    def interval(self, values: np.ndarray) -> Optional[tuple]:
        if self.degenerate or not len(values):
            return None
        low = 100 * (1 - self.level) / 2
        return tuple(float(v) for v in np.percentile(values, [low, 100 - low]))

    def intervals(self) -> dict:
        """name -> (low, high), or None for every parameter of a degenerate fit."""
        if self.degenerate or not len(self.samples):
            return {name: None for name in NAMES}
        found = np.array([list(as_params(t).values()) for t in self.samples])
        return {name: self.interval(found[:, i]) for i, name in enumerate(NAMES)}

    def predict(self, n, d):
        return law(self.theta, n, d)

    def predict_interval(self, n, d, seed: int = 0) -> Optional[tuple]:
        """The interval a new run at (N, D) lands in: the bootstrap's spread of the law there, each resample's
        prediction moved by a normal draw of the run-to-run noise (when repeats measured it). None when the fit is
        degenerate."""
        if self.degenerate or not len(self.samples):
            return None
        log_pred = np.log([law(t, n, d) for t in self.samples])
        if self.run_noise:
            log_pred = log_pred + np.random.default_rng(seed).normal(0.0, self.run_noise, len(log_pred))
        return self.interval(np.exp(log_pred))


def as_params(theta) -> dict:
    a, b, e, alpha, beta = theta
    return {"E": float(np.exp(e)), "A": float(np.exp(a)), "alpha": float(alpha), "B": float(np.exp(b)),
            "beta": float(beta)}


def fit(n, d, loss, groups=None, resamples: int = 200, seed: int = 0, run_noise: Optional[float] = None,
        level: float = 0.95, progress=None) -> Fit:
    """The law fitted to points (N, D, loss); `groups[i]` names the lineage of point i (default: each point its
    own), which the bootstrap resamples whole, `resamples` times, each refitted from fresh starts. A resample must
    hold points of three sizes N (or all there are, when fewer): with two, E + A/N^alpha is any curve through two
    values and the resample's law at another N means nothing, so such a draw is drawn again. No bootstrap when the
    fit itself is degenerate. `progress(done, total)` is called after each resample."""
    n, d, loss = (np.asarray(x, dtype=np.float64) for x in (n, d, loss))
    if len(n) < 5:
        raise ValueError(f"{len(n)} points cannot fit 5 parameters: evaluate more sizes or more points per size")
    groups = np.asarray(list(range(len(n))) if groups is None else groups)
    names = list(dict.fromkeys(groups.tolist()))
    members = [np.flatnonzero(groups == g) for g in names]
    sizes_of = [frozenset(n[m].tolist()) for m in members]
    least = min(MIN_SIZES, len(set(n.tolist())))
    # L-BFGS-B calls BLAS on 5-vectors every iteration: OpenBLAS's threads make that 30x slower on a busy machine.
    with threadpool_limits(1, user_api="blas"):
        theta = fit_theta(n, d, loss)
        samples = []
        if not at_bounds(theta):
            rng = np.random.default_rng(seed)
            while len(samples) < resamples:
                drawn = rng.integers(0, len(members), len(members))
                if len(frozenset().union(*(sizes_of[j] for j in drawn))) < least:
                    continue
                pick = np.concatenate([members[j] for j in drawn])
                samples.append(fit_theta(n[pick], d[pick], loss[pick], resample_starts(rng)))
                if progress:
                    progress(len(samples), resamples)
    return Fit(theta, np.array(samples).reshape(-1, 5), len(n), len(names), run_noise, level)


def run_noise(pairs) -> Optional[float]:
    """The run-to-run spread (standard deviation) of log loss from pairs (loss of one run, loss of its repeat at the
    same size and duration on another data order): each difference of logs holds two runs' noise, so its mean square
    is twice the variance. None without pairs."""
    differences = [np.log(a) - np.log(b) for a, b in pairs]
    if not differences:
        return None
    return float(np.sqrt(np.mean(np.square(differences)) / 2))
