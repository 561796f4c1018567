"""The training step on a mesh, lowered: the objective's gradients (train/objective.py) applied by the
optimizer (train/optimizer.py), then the global step incremented. train/loop.py runs it on a placement mesh
(one step per session call) or inside the TPU's replicated loop."""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from config.schema import GPTConfig
from models import gpt
from runtime import meshes
from train import objective
from train.optimizer import apply_gradients, learning_rate, updates_then_step


def training_step(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl, inputs: tf.Tensor,
                  labels: tf.Tensor) -> meshes.Lowered:
    """One optimizer step on the batch (micro-batched with tokens_per_mb_per_replica): outputs `loss`
    (cross-entropy, as logged), `objective` (what is minimised), `learning_rate`, `grad_norm` and, with MoE
    layers, `moe_loss`. The train op applies the updates, then increments the global step."""
    dims = gpt.Dims.of(cfg, meshes.batch_size(inputs))
    x, y = meshes.import_tokens(mesh, dims, inputs, labels)
    losses, grads, variables = objective.losses_and_gradients(x, y, cfg, dims)
    global_step = tf.train.get_or_create_global_step()
    lr = learning_rate(cfg, global_step)
    updates, grad_norm = apply_gradients(grads, variables, cfg, mtf.import_fully_replicated(mesh, lr, mtf.Shape([]),
                                                                                            "lr"))
    scalars = {"loss": losses.cross_entropy, "objective": losses.objective}
    if grad_norm is not None:
        scalars["grad_norm"] = grad_norm
    if losses.moe_loss is not None:
        scalars["moe_loss"] = losses.moe_loss
    lowering = mtf.Lowering(mesh.graph, {mesh: mesh_impl})
    outputs = {name: tf.cast(lowering.export_to_tf_tensor(t), tf.float32) for name, t in scalars.items()}
    outputs["learning_rate"] = lr
    if "grad_norm" not in outputs:  # clipping off: the norm is not computed
        outputs["grad_norm"] = tf.constant(0.0)
    train_op = updates_then_step([lowering.lowered_operation(op) for op in updates], global_step)
    gradients = [(v, g) for v, g in zip(variables, grads) if g is not None]
    return meshes.Lowered(lowering, outputs, train_op, gradients)
