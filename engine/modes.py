"""What each mode puts on the mesh, lowered to TF: the training step, the evaluation loss, the PREDICT outputs.

Each function takes TF input tensors, builds the mesh-tensorflow graph on a fresh `mtf.Mesh`, lowers it with
the given mesh implementation (a placement mesh over devices, or the TPU's SIMD mesh) and returns the TF
tensors to run together with the lowering (whose copy ops move values between the master variables, which
checkpoints hold under GPT-Neo's names, and the per-device slices). engine/runner.py runs them in a session
on CPUs and GPUs; engine/tpu.py inside the TPU's replicated loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from engine import inference, train_step
from engine.optimizer import apply_gradients, learning_rate, updates_then_step
from models import gpt
from models.config import GPTConfig

MESH_NAME = "gpt_mesh"


@dataclass
class Lowered:
    """One mode's graph, lowered: `outputs` are TF tensors (scalars for train/eval, arrays for predict)."""
    lowering: mtf.Lowering
    outputs: dict
    train_op: Optional[tf.Operation] = None
    # mtf (variable, gradient) pairs of the training step, for callers that fetch gradients (tests).
    gradients: list = field(default_factory=list)


def new_mesh(variable_placer=None) -> mtf.Mesh:
    return mtf.Mesh(mtf.Graph(), MESH_NAME, variable_placer)


def _batch_size(tokens: tf.Tensor) -> int:
    if not tokens.shape.is_fully_defined():
        raise ValueError(f"token batches need a static shape, got {tokens.shape}: batch the dataset with "
                         f"drop_remainder=True")
    return int(tokens.shape[0])


def _token_inputs(mesh: mtf.Mesh, dims: gpt.Dims, inputs: tf.Tensor, labels: tf.Tensor):
    shape = mtf.Shape([dims.batch, dims.sequence])
    return (mtf.import_fully_replicated(mesh, tf.cast(inputs, tf.int32), shape, "inputs"),
            mtf.import_fully_replicated(mesh, tf.cast(labels, tf.int32), shape, "labels"))


def training_step(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl, inputs: tf.Tensor, labels: tf.Tensor) -> Lowered:
    """One optimizer step on the batch (micro-batched with tokens_per_mb_per_replica): outputs `loss`
    (cross-entropy, as logged), `objective` (what is minimised), `learning_rate`, `grad_norm` and, with MoE
    layers, `moe_loss`. The train op applies the updates, then increments the global step."""
    dims = gpt.Dims.of(cfg, _batch_size(inputs))
    x, y = _token_inputs(mesh, dims, inputs, labels)
    losses, grads, variables = train_step.losses_and_gradients(x, y, cfg, dims)
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
    return Lowered(lowering, outputs, train_op, [(v, g) for v, g in zip(variables, grads) if g is not None])


def evaluation_loss(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl, inputs: tf.Tensor, labels: tf.Tensor) -> Lowered:
    """The batch's mean cross-entropy (over masked positions for MLM) as `loss`, the model as in inference."""
    dims = gpt.Dims.of(cfg, _batch_size(inputs))
    x, y = _token_inputs(mesh, dims, inputs, labels)
    losses = train_step.evaluation_losses(x, y, cfg, dims)
    lowering = mtf.Lowering(mesh.graph, {mesh: mesh_impl})
    return Lowered(lowering, {"loss": tf.cast(lowering.export_to_tf_tensor(losses.cross_entropy), tf.float32)})


def predictions(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl, features: dict, options=None,
                gather: bool = False) -> Lowered:
    """engine/inference.py's outputs for the features (sampling, scoring or logits), as TF tensors.

    gather: make each output whole on every device first (mtf.anonymize), which the TPU's SIMD mesh needs to
    hand a tensor out; a placement mesh assembles the slices itself."""
    dims = gpt.Dims.of(cfg, _batch_size(features["tokens"]))
    outputs = inference.predict_outputs(features, mesh, cfg, dims, options)
    if gather:
        outputs = {name: mtf.anonymize(t) for name, t in outputs.items()}
    lowering = mtf.Lowering(mesh.graph, {mesh: mesh_impl})
    return Lowered(lowering, {name: lowering.export_to_tf_tensor(t) for name, t in outputs.items()})
