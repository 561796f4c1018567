"""Learning-rate schedule, gradient clipping and the optimizer, as mesh-tensorflow operations."""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.config import GPTConfig

# Norm gains/biases and other biases are not decayed (GPT-2/GPT-Neo practice).
NO_DECAY = [r"norm", r"ln_f", r"/b$", r"bias", r"o_b"]


def learning_rate(cfg: GPTConfig, global_step: tf.Tensor) -> tf.Tensor:
    """Linear warmup from 0 to lr, then cosine or linear decay to 10% of lr at lr_decay_end."""
    step = tf.cast(global_step, tf.float32)
    decay_end = float(cfg.lr_decay_end or cfg.train_steps)
    progress = tf.minimum(step / max(decay_end, 1.0), 1.0)
    if cfg.lr_decay == "cosine":
        decayed = cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + tf.cos(3.141592653589793 * progress)))
    else:
        decayed = cfg.lr * (1.0 - 0.9 * progress)
    if cfg.warmup_steps > 0:
        warmup = cfg.lr * step / float(cfg.warmup_steps)
        return tf.where(step < cfg.warmup_steps, warmup, decayed)
    return decayed


def clip_by_global_norm(grads: list, clip_norm: float) -> tuple[list, mtf.Tensor]:
    squares = [mtf.reduce_sum(mtf.square(g)) for g in grads if g is not None]
    norm = mtf.sqrt(mtf.add_n(squares))
    scale = clip_norm / mtf.maximum(norm, clip_norm)
    return [None if g is None else g * scale for g in grads], norm


def make_optimizer(cfg: GPTConfig, lr: mtf.Tensor) -> mtf.optimize.Optimizer:
    if cfg.opt_name == "adam":
        # Slots are named `<var>/adam_m|adam_v`, which HF's GPT-Neo loader knows to skip.
        return mtf.optimize.AdamWeightDecayOptimizer(learning_rate=lr, weight_decay_rate=cfg.weight_decay,
                                                     beta_1=cfg.beta1, beta_2=cfg.beta2, epsilon=cfg.epsilon,
                                                     exclude_from_weight_decay=NO_DECAY)
    return mtf.optimize.AdafactorOptimizer(learning_rate=lr, beta1=cfg.beta1, epsilon1=cfg.ada_epsilon1,
                                           epsilon2=cfg.ada_epsilon2)


def minimize(objective: mtf.Tensor, graph: mtf.Graph, cfg: GPTConfig, lr: mtf.Tensor):
    """Gradients of `objective` (clipped by global norm), then the optimizer's update ops.
    Returns (update ops, gradient norm)."""
    variables = graph.trainable_variables
    grads = mtf.gradients([objective], [v.outputs[0] for v in variables])
    grad_norm = None
    if cfg.gradient_clipping:
        grads, grad_norm = clip_by_global_norm(grads, cfg.gradient_clipping)
    updates = make_optimizer(cfg, lr).apply_grads(grads, variables)
    return updates, grad_norm
