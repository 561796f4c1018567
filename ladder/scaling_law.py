"""The scaling law L(N, D) = E + A / N^alpha + B / D^beta, fitted as Hoffmann et al. 2022 (Chinchilla, approach 3)
did: the parameters (log A, log B, log E, alpha, beta), the Huber loss (delta 1e-3) of the residuals between
log L and the log of the prediction (a log-sum-exp of the three terms), minimised by L-BFGS-B (scipy.optimize)
from every start of a grid, the best kept; intervals from a bootstrap over the points (each resample refitted from
the full fit and a few grid starts). Pure NumPy and SciPy: no TensorFlow.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

HUBER_DELTA = 1e-3
NAMES = ("E", "A", "alpha", "B", "beta")
# Starts: Hoffmann et al.'s grid, thinned (theirs has 4,500 starts, a minute of fitting here; these 72 found the
# same optimum on every ladder and synthetic law tried).
GRID = {"a": (0.0, 8.0, 16.0), "b": (0.0, 8.0, 16.0), "e": (-1.0, 0.5), "alpha": (0.3, 0.9), "beta": (0.3, 0.9)}
BOUNDS = [(-10.0, 60.0), (-10.0, 60.0), (-5.0, 5.0), (0.0, 4.0), (0.0, 4.0)]  # a, b, e, alpha, beta


def law(theta, n, d):
    """theta = (a, b, e, alpha, beta) -> L(N, D)."""
    a, b, e, alpha, beta = theta
    return np.exp(e) + np.exp(a) / np.power(n, alpha) + np.exp(b) / np.power(d, beta)


def _objective(theta, log_n, log_d, log_l):
    """Huber loss of the log residuals, and its gradient."""
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    total = weights.sum(axis=0)
    residual = top + np.log(total) - log_l
    weights /= total
    small = np.abs(residual) <= HUBER_DELTA
    loss = np.where(small, 0.5 * residual ** 2, HUBER_DELTA * (np.abs(residual) - 0.5 * HUBER_DELTA))
    slope = np.where(small, residual, HUBER_DELTA * np.sign(residual))
    grad = np.array([np.sum(slope * weights[0]), np.sum(slope * weights[1]), np.sum(slope * weights[2]),
                     -np.sum(slope * weights[0] * log_n), -np.sum(slope * weights[1] * log_d)])
    return float(loss.sum()), grad


def _minimise(start, log_n, log_d, log_l):
    result = minimize(_objective, np.asarray(start, dtype=np.float64), args=(log_n, log_d, log_l), jac=True,
                      method="L-BFGS-B", bounds=BOUNDS)
    return result.fun, result.x


def grid_starts() -> list:
    return [(a, b, e, alpha, beta) for a, b, e, alpha, beta in
            itertools.product(GRID["a"], GRID["b"], GRID["e"], GRID["alpha"], GRID["beta"])]


def fit_theta(n, d, loss, starts=None):
    """The best theta over the starts (default: the whole grid)."""
    log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)
    best = None
    for start in starts if starts is not None else grid_starts():
        value, theta = _minimise(start, log_n, log_d, log_l)
        if best is None or value < best[0]:
            best = (value, theta)
    return best[1]


@dataclass
class Fit:
    theta: np.ndarray                     # (a, b, e, alpha, beta) on all points
    samples: np.ndarray                   # bootstrap thetas, [resamples, 5]
    n_points: int
    level: float = 0.95
    extra: dict = field(default_factory=dict)

    @property
    def params(self) -> dict:
        return as_params(self.theta)

    def interval(self, values: np.ndarray) -> tuple:
        low = 100 * (1 - self.level) / 2
        return tuple(np.percentile(values, [low, 100 - low]))

    def intervals(self) -> dict:
        found = np.array([list(as_params(t).values()) for t in self.samples])
        return {name: self.interval(found[:, i]) for i, name in enumerate(NAMES)}

    def at_bounds(self) -> list:
        """The parameters the optimiser left at a bound of BOUNDS: the points do not determine them."""
        names = ("A", "B", "E", "alpha", "beta")
        return [name for name, value, (low, high) in zip(names, self.theta, BOUNDS)
                if min(value - low, high - value) < 1e-3]

    def predict(self, n, d):
        return law(self.theta, n, d)

    def predict_interval(self, n, d) -> tuple:
        return self.interval(np.array([law(t, n, d) for t in self.samples]))


def as_params(theta) -> dict:
    a, b, e, alpha, beta = theta
    return {"E": float(np.exp(e)), "A": float(np.exp(a)), "alpha": float(alpha), "B": float(np.exp(b)),
            "beta": float(beta)}


def fit(n, d, loss, resamples: int = 200, seed: int = 0, level: float = 0.95) -> Fit:
    """The law fitted to points (N, D, loss), with `resamples` bootstrap refits for the intervals."""
    n, d, loss = (np.asarray(x, dtype=np.float64) for x in (n, d, loss))
    if len(n) < 5:
        raise ValueError(f"{len(n)} points cannot fit 5 parameters: evaluate more sizes or more points per size")
    # L-BFGS-B calls BLAS on 5-vectors every iteration: OpenBLAS's threads make that 30x slower on a busy machine.
    with threadpool_limits(1, user_api="blas"):
        theta = fit_theta(n, d, loss)
        rng = np.random.default_rng(seed)
        starts = [theta] + grid_starts()[::35]  # the full fit, and a few spread-out grid starts
        samples = []
        for _ in range(resamples):
            pick = rng.integers(0, len(n), len(n))
            samples.append(fit_theta(n[pick], d[pick], loss[pick], starts))
    return Fit(theta, np.array(samples).reshape(-1, 5), len(n), level)
