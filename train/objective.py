"""The training objective and its gradients, with micro-batching: the mesh-tensorflow graph of the training
step (train/step.py).

The objective is the cross-entropy (over all positions; for MLM over masked ones) plus GPT-Neo's z-loss
plus, with MoE layers, their load-balancing loss. With `tokens_per_mb_per_replica`, the batch is split
into micro-batches that run one after another in a loop (`mtf.serialize_training_step`): gradients are
summed over them locally and reduced once, and each micro-batch's loss is its share of the whole batch's,
so a step equals the step on the whole batch, with the memory of a micro-batch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import mesh_tensorflow as mtf

from models import gpt
from schema import GPTConfig, num_microbatches


@dataclass(frozen=True)
class Losses:
    cross_entropy: mtf.Tensor         # what is reported as "loss"
    objective: mtf.Tensor             # what is minimised
    moe_loss: Optional[mtf.Tensor]    # load-balancing loss of the MoE layers (in the objective); None without


def losses(inputs: mtf.Tensor, labels: mtf.Tensor, cfg: GPTConfig, dims: gpt.Dims, train: bool,
           weights: Optional[mtf.Tensor] = None, share: int = 1) -> Losses:
    """The losses of one forward pass. `share` > 1: this batch is one of that many micro-batches, and
    every term is its part of the whole batch's (weights, if given, already are)."""
    out = gpt.forward(inputs, cfg, dims, train=train, num_microbatches=share)
    cross_entropy, objective = gpt.loss(out.logits, labels, cfg, dims, weights)
    if weights is None and share > 1:
        cross_entropy, objective = cross_entropy / share, objective / share
    if out.moe_loss is not None:  # already divided by `share` inside the MoE layers
        objective += out.moe_loss
    return Losses(cross_entropy, objective, out.moe_loss)


def losses_and_gradients(inputs: mtf.Tensor, labels: mtf.Tensor, cfg: GPTConfig, dims: gpt.Dims,
                         loss_scale: Optional[mtf.Tensor] = None) -> tuple[Losses, list, list]:
    """Training losses and the gradients of the objective: (losses, gradients, variables), the gradients in
    the order of the variables (the graph's trainable variables). With `loss_scale` (float16's, a scalar;
    train/loss_scale.py) the gradients are those of the objective times it; the losses are not scaled."""
    graph = inputs.graph
    weights = gpt.loss_weights(labels, cfg)
    k = num_microbatches(cfg, dims.batch.size)  # schema.py: mesh-tensorflow's rule
    if k == 1:
        result = losses(inputs, labels, cfg, dims, train=True, weights=weights)
        variables = graph.trainable_variables
        scaled = result.objective if loss_scale is None else result.objective * loss_scale
        return result, mtf.gradients([scaled], [v.outputs[0] for v in variables]), variables

    features = {"inputs": inputs, "labels": labels}
    if weights is not None:
        features["weights"] = weights

    def microbatch(part: dict) -> dict:
        part_dims = dataclasses.replace(dims, batch=part["inputs"].shape.dims[0])
        result = losses(part["inputs"], part["labels"], cfg, part_dims, train=True, weights=part.get("weights"),
                        share=k)
        scaled = result.objective if loss_scale is None else result.objective * loss_scale
        out = {"loss": scaled, "objective": result.objective, "cross_entropy": result.cross_entropy}
        if result.moe_loss is not None:
            out["moe_loss"] = result.moe_loss
        return out

    # Variables are created inside the loop body; mesh-tensorflow moves them out of it.
    grads, summed = mtf.serialize_training_step(features, microbatch, dims.batch, k)
    result = Losses(summed["cross_entropy"], summed["objective"], summed.get("moe_loss"))
    return result, grads, graph.trainable_variables
