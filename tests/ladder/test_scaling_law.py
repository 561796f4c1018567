"""ladder/scaling_law.py: L(N, D) = E + A/N^alpha + B/D^beta fitted to known losses recovers the law within its
bootstrap intervals (its reports through `fit`, a degenerate fit's among them: tests/ladder/test_fit.py)."""
from __future__ import annotations

import numpy as np
import pytest

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


def test_a_law_without_a_floor_leaves_e_at_its_bound_and_the_profile_shows_how_far_it_can_move():
    """Losses of a pure power law (E = 0) over a narrow range, as a tiny CPU ladder gives: the fit leaves E at the
    floor of its search (degenerate), and the fit again with E held (`fit_with_e_held`, the profile `fit` prints)
    is best at the smallest E, rises as E moves away from it, and keeps the law's other exponents near the truth at
    the floor. (Bug it catches: the held E not reaching the objective, `bounds[2]` left as BOUNDS' (-5, 5): every
    row would be the same free fit.)"""
    theta = [np.log(4.0), np.log(25.0), -40.0, 0.08, 0.17]  # E = exp(-40): no floor
    n = np.repeat([6.5e3, 1.4e4, 2.5e4, 3.9e4], 3)
    d = n * np.tile([20.0, 40.0, 80.0], 4)
    loss = scaling_law.law(theta, n, d) * np.exp(np.random.default_rng(0).normal(0.0, 0.003, n.shape))
    result = scaling_law.fit(n, d, loss, resamples=0)
    assert result.degenerate == ["E"]
    profile = [scaling_law.fit_with_e_held(n, d, loss, e) for e in (0.001, 1.0, 2.0)]
    objectives = [objective for objective, _ in profile]
    assert objectives[0] < objectives[1] < objectives[2]
    assert [np.exp(held[2]) for _, held in profile] == pytest.approx([0.001, 1.0, 2.0])
    assert abs(profile[0][1][3] - 0.08) < 0.03 and abs(profile[0][1][4] - 0.17) < 0.03
