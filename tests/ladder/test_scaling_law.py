"""ladder/scaling_law.py: L(N, D) = E + A/N^alpha + B/D^beta fitted to known losses recovers the law within its
bootstrap intervals (its reports through `fit`, a degenerate fit's among them: tests/ladder/test_fit.py)."""
from __future__ import annotations

import numpy as np

from ladder import scaling_law


def test_fit_recovers_a_known_law_within_its_intervals():
    """Losses from a known L(N, D) with 0.5% noise: the fit's 95% bootstrap intervals hold E, A, alpha, B and beta,
    and its estimates are near them. (Bug it catches: the gradient's sign flipped for beta in _objective, or the
    bootstrap refitting the full data instead of the resample.)"""
    true = {"E": 1.8, "A": 400.0, "alpha": 0.34, "B": 410.0, "beta": 0.28}
    theta = np.log([true["A"], true["B"], true["E"]]).tolist() + [true["alpha"], true["beta"]]
    rng = np.random.default_rng(0)
    n = np.repeat(np.logspace(4, 7, 6), 4)
    d = n * np.tile([5.0, 10.0, 15.0, 20.0], 6)
    loss = scaling_law.law(theta, n, d) * np.exp(rng.normal(0.0, 0.005, n.shape))
    result = scaling_law.fit(n, d, loss, resamples=30, seed=0)
    assert not result.degenerate
    for name, (low, high) in result.intervals().items():
        assert low <= true[name] <= high, (name, low, true[name], high)
        assert high > low, name  # an interval, not a point: the resamples differ
    assert abs(result.params["alpha"] - true["alpha"]) < 0.03 and abs(result.params["beta"] - true["beta"]) < 0.03
    assert abs(result.params["E"] / true["E"] - 1) < 0.1
