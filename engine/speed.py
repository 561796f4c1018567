"""Training speed on CPUs and GPUs (see README, "Speed"): the fused Adam update, and XLA auto-clustering.

XLA element-wise fusion: TensorFlow's auto-clustering compiles the runs of element-wise ops between matmuls
(layer norm, GELU, softmax, bias and residual adds, the optimizer's update) into fused XLA kernels, while the
matmuls/einsums stay TensorFlow's own (oneDNN on CPU) kernels (`--tf_xla_ops_to_cluster=FUSIBLE`). On the
benchmark model this takes most of the memory-bound passes off a step. It costs a one-off compilation when
the first step runs, and values differ from unfused ones by rounding only.
"""
from __future__ import annotations

import os

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from engine.optimizer import AdamWeightDecay

XLA_FUSION_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit --tf_xla_ops_to_cluster=FUSIBLE"


def enable_xla_fusion() -> None:
    """Turns XLA auto-clustering of element-wise ops on for this process. TensorFlow reads these flags when it
    creates its first session, so call this before anything runs (importing TensorFlow first is fine)."""
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if "--tf_xla_auto_jit" not in flags:
        os.environ["TF_XLA_FLAGS"] = f"{flags} {XLA_FUSION_FLAGS}".strip()


def xla_fusion_enabled() -> bool:
    return "--tf_xla_auto_jit" in os.environ.get("TF_XLA_FLAGS", "")


# ---------------------------------------------------------------------------------------------------------
# Fused Adam


def _adam_update(m, v, g, lr, beta_1, beta_2, epsilon):
    next_m = beta_1 * m + (1.0 - beta_1) * g
    next_v = beta_2 * v + (1.0 - beta_2) * (g * g)
    return next_m, next_v, next_m / (tf.sqrt(next_v) + epsilon)


@tf.function(jit_compile=True)
def _adam_step(m, v, g, lr, beta_1, beta_2, epsilon):
    next_m, next_v, update = _adam_update(m, v, g, lr, beta_1, beta_2, epsilon)
    return lr * update, next_m, next_v


@tf.function(jit_compile=True)
def _adam_step_decayed(m, v, g, w, lr, beta_1, beta_2, epsilon, decay):
    next_m, next_v, update = _adam_update(m, v, g, lr, beta_1, beta_2, epsilon)
    return lr * (update + decay * w), next_m, next_v


class FusedAdamWeightDecay(AdamWeightDecay):
    """engine/optimizer.py's Adam with decoupled weight decay (same slots, names and formula: m, v, m / (sqrt(v)
    + eps) + decay * w, times lr), computed for each variable in one XLA-fused pass that yields the step and the
    new m and v, instead of a dozen element-wise ops over every parameter (a fifth of the non-matmul time of a
    step on the benchmark model)."""

    def apply_grad(self, grad, var):
        if grad is None:
            tf.logging.warning("Gradient is None for variable %s", var.name)
            return []
        grad = mtf.to_float(grad)
        m = mtf.get_variable(var.mesh, var.name + "/adam_m", var.shape, initializer=tf.zeros_initializer(),
                             trainable=False)
        v = mtf.get_variable(var.mesh, var.name + "/adam_v", var.shape, initializer=tf.zeros_initializer(),
                             trainable=False)
        hyper = [self.beta_1, self.beta_2, self.epsilon]
        if self._do_use_weight_decay(var.name):
            inputs = [m, v, grad, mtf.to_float(var.value), self.learning_rate]
            fn = lambda m_, v_, g_, w_, lr_: _adam_step_decayed(m_, v_, g_, w_, lr_, *hyper,  # noqa: E731
                                                                self.weight_decay_rate)
        else:
            inputs = [m, v, grad, self.learning_rate]
            fn = lambda m_, v_, g_, lr_: _adam_step(m_, v_, g_, lr_, *hyper)  # noqa: E731
        step, next_m, next_v = mtf.slicewise(fn, inputs, output_shape=[var.shape] * 3,
                                             output_dtype=[tf.float32] * 3, splittable_dims=var.shape.dims,
                                             grad_function=0, name="adam")
        return [mtf.assign_sub(var, step), mtf.assign(m, next_m), mtf.assign(v, next_v)]
