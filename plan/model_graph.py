"""The model's mesh-tensorflow training graph, built without devices and without lowering, for planning.

`build(cfg)` makes the training step's graph with the step's own code (train/step.py's `build`, the half of
training_step before lowering: inputs, the losses of train/objective.py, gradients, float16's loss scaling, the
learning rate and the optimizer's updates) on an `mtf.Graph` and `mtf.Mesh` inside a throwaway `tf.Graph`.
Nothing is allocated: master variables are declared, never initialized. Planning reads it for exact parameter
and optimizer-state counts (whatever options the model code grows), per-tensor shapes under a layout, and the
graph that mesh-tensorflow's layout optimizer (auto_mtf) works on.

It is the step of one pass over the whole batch. With tokens_per_mb_per_replica, training runs this same
forward and backward pass on each micro-batch in turn (mtf.serialize_training_step's loop, whose body the graph
would hide inside one operation) and sums the gradients: plan/dry_run.py sizes the activations at one
micro-batch and adds the sums, and auto_mtf plans on the pass itself.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from schema import GPTConfig
from config import replace
from execution import meshes
from train import step as train_step

# Variables whose dimensions include one of these are embeddings (token and position tables), the rest are
# "non-embedding" parameters in the sense of the scaling-law papers.
EMBEDDING_DIMS = ("vocab", "embed_sequence")
_EMBEDDING_NAME = re.compile(r"(^|/)(wte|wpe)$|pos_emb|axial")


@dataclass
class ModelGraph:
    cfg: GPTConfig                 # the config the graph was built from (n_layer may be reduced, see build)
    tf_graph: tf.Graph
    graph: mtf.Graph
    mesh: mtf.Mesh
    cross_entropy: mtf.Tensor
    objective: mtf.Tensor          # what training minimises
    n_forward_ops: int             # graph.operations[:n_forward_ops] is the forward pass (inputs to loss)
    updates: list                  # the optimizer's update ops (whether autostack may lower them: train/optimizer)

    @property
    def trainable_variables(self) -> list:
        return list(self.graph.trainable_variables)

    @property
    def optimizer_variables(self) -> list:
        """Variables the optimizer made (Adam's m and v, Adafactor's factored slots): all non-trainable ones."""
        trainable = set(id(v) for v in self.graph.trainable_variables)
        return [v for v in self.graph.all_variables if id(v) not in trainable]

    @property
    def forward_operations(self) -> list:
        return self.graph.operations[:self.n_forward_ops]

    @property
    def backward_operations(self) -> list:
        return self.graph.operations[self.n_forward_ops:]

    def parameter_count(self) -> dict[str, int]:
        """Exact counts from the graph's trainable variables: total, embedding and non-embedding."""
        total = embedding = 0
        for v in self.trainable_variables:
            total += v.shape.size
            if is_embedding(v):
                embedding += v.shape.size
        return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def is_embedding(variable) -> bool:
    names = {d.name for d in variable.shape.dims}
    return bool(names & set(EMBEDDING_DIMS)) or bool(_EMBEDDING_NAME.search(variable.name))


def reduced(cfg: GPTConfig, n_layer: int) -> GPTConfig:
    """The same model with its first `n_layer` layers (attention types kept in order)."""
    n_layer = max(1, min(n_layer, cfg.n_layer))
    if n_layer == cfg.n_layer:
        return cfg
    changes = dict(n_layer=n_layer, attention_types=tuple(cfg.attention_types[:n_layer]))
    if getattr(cfg, "moe_layers", None):  # per-layer options name layers: keep those that remain
        changes["moe_layers"] = tuple(layer for layer in cfg.moe_layers if layer < n_layer)
    return replace(cfg, **changes)


class _DeclaredVariable:
    """Stands in for a TF master variable while planning: mesh-tensorflow reads only its name and device
    while building a graph, and creating ~1,500 real variables (with initializers) for a 13B model's
    training graph takes longer than everything else planning does."""

    def __init__(self, name: str, shape, dtype):
        self.name, self.shape, self.dtype, self.device = f"{name}:0", shape, dtype, ""


def _declare_only(next_creator, **kwargs):
    """Master variables (their initial value an initializer still to run) are declared; a variable whose initial
    value is already a tensor costs nothing more to create, and the step reads it while it is built (float16's
    loss scale): it is created."""
    if not callable(kwargs.get("initial_value")):
        return next_creator(**kwargs)
    return _DeclaredVariable(kwargs.get("name"), kwargs.get("shape"), kwargs.get("dtype"))


def build(cfg: GPTConfig, n_layer: Optional[int] = None, declare_only: bool = True) -> ModelGraph:
    """The training step's graph (forward, loss, gradients, optimizer updates), by train/step.py's `build`.

    `n_layer` builds a shallower copy (for fast planning: layouts are per dimension name, the same in every
    layer). The mesh carries no devices and no variable placer: shapes and layouts are all that planning
    needs. With declare_only (the default) no TF master variables are created at all; pass False for a graph
    whose master variables exist (to lower it).
    """
    if n_layer is not None:
        cfg = reduced(cfg, n_layer)
    whole_batch = replace(cfg, tokens_per_mb_per_replica=None) if cfg.tokens_per_mb_per_replica else cfg
    tf_graph = tf.Graph()
    with tf_graph.as_default(), contextlib.ExitStack() as stack:
        tf.train.get_or_create_global_step()  # a real one: the learning rate and Adafactor compute with it
        if declare_only:
            stack.enter_context(tf.variable_creator_scope(_declare_only))
        mesh = meshes.new_mesh()
        # What a run on CPUs or GPUs lowers it with; the step only asks whether it is a TPU's.
        mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(mtf.convert_to_shape(cfg.mesh_shape),
                                                              mtf.convert_to_layout_rules(cfg.layout),
                                                              [""] * cfg.n_devices)
        tokens = tf.zeros([cfg.train_batch_size, cfg.n_ctx], tf.int32)
        step = train_step.build(whole_batch, mesh, mesh_impl, tokens, tokens)
    losses = step.losses
    # The forward pass ends with the objective (train/objective.py's losses: its last term); what follows,
    # float16's scaling of it among them, is the backward pass and the update.
    n_forward = mesh.graph.operations.index(losses.objective.operation) + 1
    return ModelGraph(cfg, tf_graph, mesh.graph, mesh, losses.cross_entropy, losses.objective, n_forward, step.updates)
