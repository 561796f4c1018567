"""Dynamic loss scaling, for float16 activations (precision "float16": GPUs without bfloat16, such as V100 and T4).

float16 has 5 exponent bits: gradients below ~6e-8 flush to zero and values above 65504 overflow. The training
step (train/step.py) multiplies the objective by the loss scale S before the backward pass, so that small
gradients stay representable in float16, and divides the gradients by S in float32 before clipping and the
optimizer. Master weights and optimizer slots stay float32, as with bfloat16.

A step whose gradients are not all finite (S too large: something overflowed) changes no weight and no
optimizer slot (train/optimizer.py's `AssignIf`); the global step still advances, so the batch is consumed and
the learning-rate schedule moves on, as in PyTorch's GradScaler and Keras' LossScaleOptimizer; and S halves
(not below 1). After `loss_scale_window` finite steps in a row, S doubles. The progress log and TensorBoard
show S as `loss_scale` (a halving is a skipped step).

The state is two variables beside the global step, `global_step/loss_scale` (float32, starting at
`initial_loss_scale`) and `global_step/loss_scale_good_steps` (int64, finite steps since S last changed).
Checkpoints hold them and a resumed run goes on with them; a checkpoint without them (trained in another
precision, converted from HF, GPT-Neo's) starts them afresh (execution/mesh_session.py's RESTORE_OPTIONAL).
The names contain "global_step" because HF's `load_tf_weights_in_gpt_neo` skips exactly the names holding
"global_step" or "adam"; tools/hf.py reads only the model's variables.

TPUs compute in bfloat16 and need none of this: float16 is refused there.
"""
from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from schema import ConfigError, GPTConfig
from execution.mesh_session import RESTORE_OPTIONAL

SCALE = "global_step/loss_scale"
GOOD_STEPS = "global_step/loss_scale_good_steps"


class LossScale:
    """The loss scale of one training step on `mesh`: `value` (this step's S, a TF scalar), `factor` (S on the
    mesh, for the objective), `unscale` for the gradients and `update` for the variables."""

    def __init__(self, cfg: GPTConfig, mesh: mtf.Mesh):
        self.window = cfg.loss_scale_window
        self.scale = tf.get_variable(SCALE, initializer=tf.constant(float(cfg.initial_loss_scale)), trainable=False)
        self.good_steps = tf.get_variable(GOOD_STEPS, initializer=tf.constant(0, tf.int64), trainable=False)
        for variable in (self.scale, self.good_steps):
            tf.add_to_collection(RESTORE_OPTIONAL, variable)
        self.value = self.scale.read_value()  # read once: the forward pass, the gradients and the log agree
        self.factor = mtf.import_fully_replicated(mesh, self.value, mtf.Shape([]), "loss_scale")
        self._inverse = mtf.import_fully_replicated(mesh, 1.0 / self.value, mtf.Shape([]), "inverse_loss_scale")

    def unscale(self, grads: list) -> tuple[list, mtf.Tensor]:
        """Gradients of the scaled objective -> (float32 gradients of the objective, a boolean mtf scalar: are
        they all finite). An inf or NaN anywhere makes the sum of every gradient's elements inf or NaN."""
        grads = [None if g is None else mtf.to_float(g) * self._inverse for g in grads]
        total = mtf.add_n([mtf.reduce_sum(g) for g in grads if g is not None])
        finite = mtf.slicewise(tf.math.is_finite, [total], output_shape=mtf.Shape([]), output_dtype=tf.bool,
                               splittable_dims=[], name="gradients_finite")
        return grads, finite

    def update(self, finite: tf.Tensor) -> tf.Operation:
        """The variables' update after this step (`finite`: the lowered `unscale` flag): S halves after an
        overflow (not below 1) and doubles after `window` finite steps in a row."""
        good = tf.where(finite, self.good_steps.read_value() + 1, tf.constant(0, tf.int64))
        grow = good >= self.window
        scale = tf.where(finite, tf.where(grow, self.value * 2.0, self.value), tf.maximum(self.value * 0.5, 1.0))
        return tf.group(self.scale.assign(scale), self.good_steps.assign(tf.where(grow, tf.zeros_like(good), good)))


def for_training(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl) -> Optional[LossScale]:
    """The training step's loss scale: float16 precision only (None otherwise); not on a TPU."""
    if cfg.precision != "float16":
        return None
    if isinstance(mesh_impl, mtf.simd_mesh_impl.SimdMeshImpl):
        raise ConfigError("precision float16 (with loss scaling) is for GPUs without bfloat16; TPUs compute in "
                          "bfloat16: set precision to bfloat16")
    return LossScale(cfg, mesh)
