"""α-entmax (models/entmax.py) against plain NumPy: the probabilities (bisection for any α, the exact sort-based
solution for α = 1.5), the entmax loss and its gradient, training on it, and sampling from entmax
probabilities (`sampling_use_entmax`) that never picks a token of probability zero."""
import tempfile

import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from config import replace
from models.entmax import entmax_loss, entmax_mtf, entmax_tf
from models.sampling import SamplingOptions
from tiny import (choose_tokens, compute_logits, compute_losses, devices_for, random_tokens, run_mtf, run_predict,
                  tiny_config, train)


def entmax_bisect_np(z, alpha, iterations=200):
    """float64 bisection on τ: p = [(α-1)z - τ]_+^(1/(α-1)) with Σp = 1."""
    z = np.asarray(z, np.float64) * (alpha - 1)
    lo = z.max(-1, keepdims=True) - 1.0   # Σp >= 1 here (the largest term alone is 1)
    hi = z.max(-1, keepdims=True)         # Σp = 0 here
    for _ in range(iterations):
        mid = (lo + hi) / 2
        above = (np.maximum(z - mid, 0) ** (1 / (alpha - 1))).sum(-1, keepdims=True) >= 1
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    p = np.maximum(z - lo, 0) ** (1 / (alpha - 1))
    return p / p.sum(-1, keepdims=True)


def entmax15_sort_np(z):
    """The exact 1.5-entmax (Peters et al. 2019, Algorithm 2): sort, find the support size, solve for τ."""
    z = np.asarray(z, np.float64) / 2
    z = z - z.max(-1, keepdims=True)
    ordered = -np.sort(-z, axis=-1)
    rho = np.arange(1, z.shape[-1] + 1)
    mean = np.cumsum(ordered, -1) / rho
    mean_sq = np.cumsum(ordered ** 2, -1) / rho
    delta = (1 - rho * (mean_sq - mean ** 2)) / rho
    tau = mean - np.sqrt(np.maximum(delta, 0))
    support = (tau <= ordered).sum(-1, keepdims=True)
    tau_star = np.take_along_axis(tau, support - 1, -1)
    return np.maximum(z - tau_star, 0) ** 2


def entmax_loss_np(z, labels, alpha):
    """The entmax (Fenchel-Young) loss: <p, z> + H_α(p) - z_y, H_α(p) = (1 - Σ p^α) / (α(α-1)), p = entmax(z)."""
    z = np.asarray(z, np.float64)
    p = entmax_bisect_np(z, alpha)
    z_y = np.take_along_axis(z, labels[..., None], -1)[..., 0]
    return (p * z).sum(-1) + (1 - (p ** alpha).sum(-1)) / (alpha * (alpha - 1)) - z_y


def logits_batch(seed=0, rows=6, vocab=50, scale=3.0):
    z = np.random.RandomState(seed).randn(rows, vocab) * scale
    z[0] = 0.0                        # all equal: uniform
    z[1, 7] += 40.0                   # one dominant token: a one-hot
    z[2] = np.linspace(-5, 5, vocab)  # evenly spread
    return z.astype(np.float32)


def run_tf(fn, *arrays):
    with tf.Graph().as_default(), tf.Session() as session:
        return session.run(fn(*[tf.constant(a) for a in arrays]))


@pytest.mark.parametrize("alpha", [1.3, 1.5, 1.7])
def test_entmax_matches_numpy_and_has_exact_zeros(alpha):
    z = logits_batch()
    p = run_tf(lambda t: entmax_tf(t, alpha), z)
    reference = entmax_bisect_np(z, alpha)
    if alpha == 1.5:
        np.testing.assert_allclose(reference, entmax15_sort_np(z), atol=1e-12)  # the two references agree
    np.testing.assert_allclose(p, reference, atol=2e-6)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
    assert (p >= 0).all()
    assert ((p == 0) == (reference == 0)).all()  # the same support, zeros exactly zero
    assert (p == 0).sum() > z.size // 4           # and it is sparse
    np.testing.assert_allclose(p[0], 1 / z.shape[1], rtol=1e-5)
    assert p[1, 7] == 1.0 and (np.delete(p[1], 7) == 0).all()


def test_the_mesh_tensorflow_entmax_is_the_same():
    z = logits_batch(seed=1)
    rows, vocab = mtf.Dimension("rows", z.shape[0]), mtf.Dimension("vocab", z.shape[1])
    out, _ = run_mtf(lambda mesh, z: {"p": entmax_mtf(z, vocab, 1.5)}, {"z": z}, {"z": [rows, vocab]})
    np.testing.assert_allclose(out["p"], entmax15_sort_np(z), atol=2e-6)


@pytest.mark.parametrize("alpha", [1.3, 1.5])
def test_entmax_loss_is_the_fenchel_young_loss_and_its_gradient_is_entmax_minus_the_target(alpha):
    z = logits_batch(seed=2)
    labels = np.random.RandomState(3).randint(0, z.shape[1], z.shape[0]).astype(np.int32)
    labels[1] = 7  # the one-hot row, labelled with its own token: loss 0
    rows, vocab = mtf.Dimension("rows", z.shape[0]), mtf.Dimension("vocab", z.shape[1])

    def build(mesh, z, labels):
        loss = entmax_loss(z, labels, vocab, alpha)
        (grad,) = mtf.gradients([mtf.reduce_sum(loss)], [z])
        return {"loss": loss, "grad": grad}

    out, _ = run_mtf(build, {"z": z, "labels": labels}, {"z": [rows, vocab], "labels": [rows]})
    expected = entmax_loss_np(z, labels, alpha)
    np.testing.assert_allclose(out["loss"], expected, rtol=1e-5, atol=1e-5)
    assert (expected >= -1e-9).all() and abs(expected[1]) < 1e-9
    target = np.eye(z.shape[1])[labels]
    np.testing.assert_allclose(out["grad"], entmax_bisect_np(z, alpha) - target, atol=2e-6)
    # The reference formula's own derivative, by central differences, is entmax(z) - onehot(y) too.
    step, row = 1e-5, 3
    loss_at = lambda logits: entmax_loss_np(logits, labels[row], alpha)  # noqa: E731
    numeric = [(loss_at(z[row] + step * e) - loss_at(z[row] - step * e)) / (2 * step) for e in np.eye(z.shape[1])]
    np.testing.assert_allclose(numeric, entmax_bisect_np(z[row], alpha) - target[row], atol=1e-6)


@pytest.mark.slow
def test_the_model_trains_on_the_entmax_loss_on_any_layout():
    cfg = tiny_config(entmax_loss=True, entmax_alpha=1.5)
    tokens = random_tokens([4, cfg.n_ctx + 1], seed=5)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    logits = compute_logits(cfg, inputs, devices_for(cfg))
    expected = entmax_loss_np(logits, labels, 1.5).mean()
    assert compute_losses(cfg, inputs, labels, devices_for(cfg))["loss"] == pytest.approx(expected, rel=1e-4)
    # The vocabulary split over two devices: the same loss.
    split = replace(cfg, mesh_shape="x:2", layout="vocab:x")
    assert compute_losses(split, inputs, labels, devices_for(split))["loss"] == pytest.approx(expected, rel=1e-4)
    with tempfile.TemporaryDirectory() as folder:
        losses = train(replace(cfg, model_path=folder, train_steps=6, steps_per_checkpoint=6), tokens)
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0]


def draws(logits, options, n):
    """n tokens chosen from each row of logits: the row repeated n times, each copy with its own noise (the
    noise hashes the row index)."""
    tiled = np.repeat(logits, n, axis=0)
    rows = np.arange(len(tiled), dtype=np.int32)
    seeds = np.full(len(tiled), 11, np.int32)
    chosen = run_tf(lambda lg, sd, rw: choose_tokens(lg, sd, rw, 0, options), tiled, seeds, rows)
    return chosen.reshape(len(logits), n)


def test_entmax_sampling_follows_the_entmax_probabilities_and_never_picks_a_zero():
    z = logits_batch(seed=4, rows=4, vocab=12, scale=2.0)
    options = SamplingOptions(max_new_tokens=1, entmax_alpha=1.5)
    chosen = draws(z, options, 3000)
    p = entmax15_sort_np(z)
    for row in range(len(z)):
        assert (p[row, chosen[row]] > 0).all()
        frequency = np.bincount(chosen[row], minlength=z.shape[1]) / chosen.shape[1]
        np.testing.assert_allclose(frequency, p[row], atol=0.03)
    # Temperature divides the logits first: entmax(z / T); T = 0 is the argmax.
    cooled = draws(z, SamplingOptions(max_new_tokens=1, entmax_alpha=1.5, temperature=0.5), 500)
    assert all((entmax15_sort_np(z / 0.5)[row, cooled[row]] > 0).all() for row in range(len(z)))
    greedy = draws(z, SamplingOptions(max_new_tokens=1, entmax_alpha=1.5, temperature=0.0), 3)
    assert (greedy == z.argmax(-1)[:, None]).all()
    # top_k keeps the k most likely tokens of the entmax distribution (row 0, all tied, keeps them all).
    top2 = draws(z, SamplingOptions(max_new_tokens=1, entmax_alpha=1.5, top_k=2), 300)
    for row in range(1, len(z)):
        allowed = set(np.argsort(-z[row])[:2]) & set(np.flatnonzero(p[row]))
        assert set(top2[row]) <= allowed


def test_predict_with_sampling_use_entmax_picks_only_tokens_inside_the_support():
    cfg = tiny_config(sampling_use_entmax=True, entmax_alpha=1.5, temperature=0.02)
    options = SamplingOptions.from_config(cfg, max_new_tokens=1, padding_id=0)
    assert options.entmax_alpha == 1.5 and SamplingOptions.from_config(tiny_config()).entmax_alpha is None
    rows = 16
    tokens = random_tokens([rows, cfg.n_ctx], vocab=cfg.n_vocab, seed=8)
    lengths = np.full(rows, 5, np.int32)
    tokens[:, 5:] = 0
    out = run_predict(cfg, {"tokens": tokens, "prompt_length": lengths, "seed": np.arange(rows, dtype=np.int32)},
                      devices_for(cfg), None, options)
    chosen = out["tokens"][:, 5]
    p = entmax15_sort_np(compute_logits(cfg, tokens, devices_for(cfg))[:, 4] / 0.02)
    assert ((p > 0).sum(-1) < cfg.n_vocab).all()  # the support really excludes tokens
    assert (p[np.arange(rows), chosen] > 0).all()
    assert len(set(chosen.tolist())) > 1
