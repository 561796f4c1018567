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


class AdamWeightDecay(mtf.optimize.AdamWeightDecayOptimizer):
    """mesh-tensorflow's Adam with decoupled weight decay, with the decay term in float32.

    A variable's `value` is in the activation dtype; mesh-tensorflow adds it to the float32 update as it
    is, which fails for bfloat16 activations. In float32 the computation is the same as the parent's."""

    def apply_grad(self, grad, var):
        if grad is None:
            tf.logging.warning("Gradient is None for variable %s", var.name)
            return []
        grad = mtf.to_float(grad)
        m = mtf.get_variable(var.mesh, var.name + "/adam_m", var.shape, initializer=tf.zeros_initializer(),
                             trainable=False)
        v = mtf.get_variable(var.mesh, var.name + "/adam_v", var.shape, initializer=tf.zeros_initializer(),
                             trainable=False)
        next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
        next_v = self.beta_2 * v + (1.0 - self.beta_2) * mtf.square(grad)
        update = next_m / (mtf.sqrt(next_v) + self.epsilon)
        if self._do_use_weight_decay(var.name):
            update += self.weight_decay_rate * mtf.to_float(var.value)
        return [mtf.assign_sub(var, self.learning_rate * update), mtf.assign(m, next_m), mtf.assign(v, next_v)]


def make_optimizer(cfg: GPTConfig, lr: mtf.Tensor) -> mtf.optimize.Optimizer:
    if cfg.opt_name == "adam":
        # Slots are named `<var>/adam_m|adam_v`, which HF's GPT-Neo loader knows to skip.
        from engine.speed import FusedAdamWeightDecay  # AdamWeightDecay, one fused pass per variable
        return FusedAdamWeightDecay(learning_rate=lr, weight_decay_rate=cfg.weight_decay, beta_1=cfg.beta1,
                                    beta_2=cfg.beta2, epsilon=cfg.epsilon, exclude_from_weight_decay=NO_DECAY)
    # Adafactor (mesh-tensorflow's): the update is relative to each weight's scale; weight_decay is Adam's only.
    return mtf.optimize.AdafactorOptimizer(learning_rate=lr, beta1=cfg.beta1, epsilon1=cfg.ada_epsilon1,
                                           epsilon2=cfg.ada_epsilon2)


def minimize(objective: mtf.Tensor, graph: mtf.Graph, cfg: GPTConfig, lr: mtf.Tensor):
    """Gradients of `objective` (clipped by global norm), then the optimizer's update ops.
    Returns (update ops, gradient norm)."""
    variables = graph.trainable_variables
    grads = mtf.gradients([objective], [v.outputs[0] for v in variables])
    return apply_gradients(grads, variables, cfg, lr)


def apply_gradients(grads: list, variables: list, cfg: GPTConfig, lr: mtf.Tensor):
    """Clips `grads` (one per variable) by global norm and returns (the optimizer's update ops, gradient norm
    or None without clipping)."""
    grads = [None if g is None else mtf.to_float(g) for g in grads]  # bf16 activations give bf16 gradients
    grad_norm = None
    if cfg.gradient_clipping:
        grads, grad_norm = clip_by_global_norm(grads, cfg.gradient_clipping)
    updates = make_optimizer(cfg, lr).apply_grads(grads, variables)
    return updates, grad_norm


def updates_then_step(updates: list, global_step: tf.Variable) -> tf.Operation:
    """The train op: the (lowered) updates, then the step increment. The updates read the step (learning-rate
    schedule, Adafactor's decay rate); unordered, some would see the incremented step, at random run to run."""
    with tf.control_dependencies(updates):
        return tf.group(updates + [tf.assign_add(global_step, 1)])
