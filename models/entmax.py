"""α-entmax (Peters, Niculae & Martins 2019, arXiv:1905.05702): a sparse alternative to softmax, for sampling
(`sampling_use_entmax`) and training (`entmax_loss`), with α = `entmax_alpha` (GPT-Neo's 1.3 by default;
1.5 is "entmax15"; α → 1 is softmax, α = 2 sparsemax).

    entmax_α(z)_i = [(α - 1) z_i - τ]_+ ^ (1 / (α - 1)),   τ such that the entries sum to 1.

Tokens whose logit is far enough below the largest get probability exactly 0. τ is found by bisection, as
GPT-Neo did: it lies in [max - 1, max - (1/d)^(α-1)] of the scaled logits (at the lower end the largest term
alone is 1, at the upper end all d terms together are at most 1), and `BISECTION_STEPS` halvings take that
interval below float32's resolution. The result is taken at the lower end, where the sum is at least 1, and
divided by its sum: every entry of the support is positive, the rest exactly 0, and the entries sum to 1.

The loss is the entmax loss (the Fenchel-Young loss of the Tsallis entropy, the `entmax` package's
`EntmaxBisectLoss`): L(z, y) = <p, z> + H_α(p) - z_y with p = entmax_α(z) and H_α(p) = (1 - Σ p^α) / (α(α-1)).
It is 0 when p is the target's one-hot, positive otherwise, and its gradient is p - onehot(y): no
differentiation through the bisection is needed. (GPT-Neo's `entmax_cross_entropy_with_logits` took
-log entmax(z)_y instead, which is infinite whenever the target is outside the support, as it often is.)
"""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

BISECTION_STEPS = 32  # the interval (width < 1) shrinks to < 2.4e-10, below float32's resolution of τ


def _check(alpha: float) -> None:
    if not 1.0 < alpha < 2.0:
        raise ValueError(f"entmax alpha must be in (1, 2), got {alpha}")


def entmax_tf(logits: tf.Tensor, alpha: float, steps: int = BISECTION_STEPS) -> tf.Tensor:
    """entmax_α over the last axis of `logits` (float32 probabilities, exact zeros outside the support)."""
    _check(alpha)
    z = tf.cast(logits, tf.float32) * (alpha - 1)
    size = int(z.shape[-1])
    power = 1.0 / (alpha - 1)
    lower = tf.reduce_max(z, axis=-1, keepdims=True) - 1.0
    width = 1.0 - (1.0 / size) ** (alpha - 1)

    def terms(tau):
        return tf.pow(tf.nn.relu(z - tau), power)

    for _ in range(steps):
        width /= 2
        middle = lower + width
        lower = tf.where(tf.reduce_sum(terms(middle), axis=-1, keepdims=True) >= 1.0, middle, lower)
    p = terms(lower)
    return p / tf.reduce_sum(p, axis=-1, keepdims=True)


def _power(x: mtf.Tensor, exponent: float) -> mtf.Tensor:
    """x ** exponent for x >= 0 (0 ** exponent = 0 for a positive exponent; mesh-tensorflow has no pow)."""
    return mtf.exp(mtf.log(x) * exponent)


def entmax_mtf(logits: mtf.Tensor, dim: mtf.Dimension, alpha: float, steps: int = BISECTION_STEPS) -> mtf.Tensor:
    """entmax_α over `dim` of a mesh-tensorflow tensor; any layout, `dim` split or not. Not differentiable:
    the loss below needs only its value."""
    _check(alpha)
    z = mtf.cast(logits, tf.float32) * (alpha - 1)
    power = 1.0 / (alpha - 1)
    lower = mtf.reduce_max(z, reduced_dim=dim) - 1.0
    width = 1.0 - (1.0 / dim.size) ** (alpha - 1)

    def terms(tau):
        return _power(mtf.relu(z - tau), power)

    for _ in range(steps):
        width /= 2
        middle = lower + width
        lower = mtf.where(mtf.greater_equal(mtf.reduce_sum(terms(middle), reduced_dim=dim), 1.0), middle, lower)
    p = terms(lower)
    return p / mtf.reduce_sum(p, reduced_dim=dim)


def entmax_loss(logits: mtf.Tensor, targets: mtf.Tensor, dim: mtf.Dimension, alpha: float) -> mtf.Tensor:
    """The entmax loss per position: logits [..., dim] float32, integer targets [...] -> [...]. Its gradient
    with respect to the logits is entmax_α(logits) - onehot(targets)."""
    z = mtf.cast(logits, tf.float32)
    p = mtf.stop_gradient(entmax_mtf(z, dim, alpha))
    target_logit = mtf.reduce_sum(z * mtf.one_hot(targets, dim, dtype=tf.float32), reduced_dim=dim)
    tsallis = (1.0 - mtf.reduce_sum(_power(p, alpha), reduced_dim=dim)) / (alpha * (alpha - 1))
    return mtf.reduce_sum(p * z, reduced_dim=dim) + tsallis - target_logit
