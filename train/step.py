"""The training step on a mesh: its mesh-tensorflow graph (`build`: the objective's gradients, train/objective.py,
applied by the optimizer, train/optimizer.py), then lowered (`training_step`), with the global step incremented.
train/loop.py runs it on a placement mesh (one step per session call) or inside the TPU's replicated loop; the
planner (plan/model_graph.py) reads the graph `build` makes, without devices, so that it plans what trains."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from schema import GPTConfig
from models import gpt
from models.optimizers import learning_rate
from execution import meshes
from train import loss_scale, objective
from train.optimizer import apply_gradients, autostack_allowed, sum_of_squares, updates_then_step


@dataclass
class StepGraph:
    """One training step as a mesh-tensorflow graph, before lowering."""
    losses: objective.Losses          # of the whole batch (summed over its micro-batches)
    scalars: dict                     # name -> mtf scalar the step outputs (loss, objective, grad_norm, ...)
    updates: list                     # the optimizer's assignments (gated by `finite` with float16)
    learning_rate: tf.Tensor          # this step's, computed from the global step
    global_step: tf.Variable
    scaling: Optional[loss_scale.LossScale]  # float16 only
    finite: Optional[mtf.Tensor]      # float16: whether every gradient was finite (then the updates apply)


def build(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl, inputs: tf.Tensor, labels: tf.Tensor) -> StepGraph:
    """The step's graph on `mesh` for a batch of token ids: the losses, their gradients (micro-batched with
    tokens_per_mb_per_replica; with float16 of the loss-scaled objective, unscaled after), the learning rate and
    the optimizer's updates. `mesh_impl` is only asked whether it is a TPU's (float16 is refused there, and the
    optimizer updates each variable on its own)."""
    dims = gpt.Dims.of(cfg, meshes.batch_size(inputs))
    x, y = meshes.import_tokens(mesh, dims, inputs, labels)
    scaling = loss_scale.for_training(cfg, mesh, mesh_impl)  # float16 only
    losses, grads, variables = objective.losses_and_gradients(x, y, cfg, dims,
                                                              None if scaling is None else scaling.factor)
    finite = None
    if scaling is not None:
        grads, finite = scaling.unscale(grads)
    global_step = tf.train.get_or_create_global_step()
    lr = learning_rate(cfg, global_step)
    # On a TPU mesh XLA compiles the whole replicated step: a fused optimizer pass gains nothing there and would
    # keep autostack off (docs/tpus.md), so each variable is updated on its own.
    on_tpu = isinstance(mesh_impl, mtf.simd_mesh_impl.SimdMeshImpl)
    updates, grad_norm = apply_gradients(grads, variables, cfg, mtf.import_fully_replicated(mesh, lr, mtf.Shape([]),
                                                                                            "lr"),
                                        apply_if=finite, fused=not on_tpu)
    scalars = {"loss": losses.cross_entropy, "objective": losses.objective}
    if cfg.log_grads:  # the norms of the unclipped gradients, whose global norm is grad_norm
        norms = {v.name: mtf.sqrt(sum_of_squares(mtf.to_float(g))) for v, g in zip(variables, grads)
                 if g is not None}
        scalars.update({f"grad_norm/{name}": norm for name, norm in norms.items()})
        if grad_norm is None:  # clipping off: computed here
            grad_norm = mtf.sqrt(mtf.add_n([mtf.square(norm) for norm in norms.values()]))
    if grad_norm is not None:
        scalars["grad_norm"] = grad_norm
    if losses.moe_loss is not None:
        scalars["moe_loss"] = losses.moe_loss
    return StepGraph(losses, scalars, updates, lr, global_step, scaling, finite)


def training_step(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl, inputs: tf.Tensor,
                  labels: tf.Tensor) -> meshes.Lowered:
    """One optimizer step on the batch (micro-batched with tokens_per_mb_per_replica): outputs `loss`
    (cross-entropy, as logged), `objective` (what is minimised), `learning_rate`, `grad_norm` and, with MoE
    layers, `moe_loss`; with `log_grads`, also `grad_norm/<variable>` for every variable (GPT-Neo's per-variable
    gradient norms); with float16, `loss_scale` (train/loss_scale.py: the objective is scaled for the backward
    pass, and a step with non-finite gradients updates no variable). The train op applies the updates, then
    increments the global step."""
    step = build(cfg, mesh, mesh_impl, inputs, labels)
    # The fused Adam and float16's gated updates name the variables themselves: mesh-tensorflow's autostack, which
    # on meshes of several devices combines variables and rewrites only its own Assign ops, would leave them
    # pointing at variables that no longer exist (train/optimizer.autostack_allowed).
    lowering = mtf.Lowering(mesh.graph, {mesh: mesh_impl}, autostack=autostack_allowed(step.updates))
    outputs = {name: tf.cast(lowering.export_to_tf_tensor(t), tf.float32) for name, t in step.scalars.items()}
    outputs["learning_rate"] = step.learning_rate
    if "grad_norm" not in outputs:  # clipping off: the norm is not computed
        outputs["grad_norm"] = tf.constant(0.0)
    lowered_updates = [lowering.lowered_operation(op) for op in step.updates]
    if step.scaling is not None:
        outputs["loss_scale"] = step.scaling.value
        lowered_updates.append(step.scaling.update(lowering.export_to_tf_tensor(step.finite)))
    return meshes.Lowered(lowering, outputs, updates_then_step(lowered_updates, step.global_step))
