"""The model's mesh-tensorflow training graph, built without devices and without lowering, for planning.

`build(cfg)` makes exactly the graph that training builds (train/step.py's training_step: inputs, the
losses of train/objective.py, gradients and the optimizer's updates) on an `mtf.Graph` and `mtf.Mesh` inside a
throwaway `tf.Graph`. Nothing is allocated: master variables are declared, never initialized. Planning
reads it for exact parameter and optimizer-state counts (whatever options the model code grows), per-tensor
shapes under a layout, and the graph that mesh-tensorflow's layout optimizer (auto_mtf) works on.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from train import objective as train_step
from train.optimizer import apply_gradients
from loading.config import replace
from models import gpt
from config.schema import GPTConfig

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
    train: bool

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
    return _DeclaredVariable(kwargs.get("name"), kwargs.get("shape"), kwargs.get("dtype"))


def build(cfg: GPTConfig, train: bool = True, n_layer: Optional[int] = None,
          batch_size: Optional[int] = None, declare_only: bool = True) -> ModelGraph:
    """The training graph (train=True: forward, loss, gradients, optimizer updates) or the forward graph.

    `n_layer` builds a shallower copy (for fast planning: layouts are per dimension name, the same in every
    layer); `batch_size` defaults to train_batch_size. The mesh carries no devices and no variable placer:
    shapes and layouts are all that planning needs. With declare_only (the default) no TF variables are
    created at all; pass False for a graph whose master variables exist (to lower it).
    """
    if n_layer is not None:
        cfg = reduced(cfg, n_layer)
    tf_graph = tf.Graph()
    with tf_graph.as_default(), contextlib.ExitStack() as stack:
        tf.train.get_or_create_global_step()  # a real one: optimizers (Adafactor) compute with it
        if declare_only:
            stack.enter_context(tf.variable_creator_scope(_declare_only))
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "gpt_mesh")
        dims = gpt.Dims.of(cfg, batch_size or cfg.train_batch_size)
        token_shape = mtf.Shape([dims.batch, dims.sequence])
        zeros = tf.zeros(token_shape.to_integer_list, tf.int32)
        inputs = mtf.import_fully_replicated(mesh, zeros, token_shape, "inputs")
        targets = mtf.import_fully_replicated(mesh, zeros, token_shape, "labels")
        if not train:
            losses = train_step.evaluation_losses(inputs, targets, cfg, dims)
            n_forward = len(graph.operations)
        else:
            # train_step.losses_and_gradients with one micro-batch, split where the backward pass begins.
            # (Micro-batching runs this same graph on a smaller batch in a loop: build with batch_size.)
            losses = train_step.losses(inputs, targets, cfg, dims, train=True, weights=gpt.loss_weights(targets, cfg))
            n_forward = len(graph.operations)
            variables = graph.trainable_variables
            grads = mtf.gradients([losses.objective], [v.outputs[0] for v in variables])
            lr = mtf.import_fully_replicated(mesh, tf.constant(cfg.lr, tf.float32), mtf.Shape([]), "lr")
            apply_gradients(grads, variables, cfg, lr)
    return ModelGraph(cfg, tf_graph, graph, mesh, losses.cross_entropy, losses.objective, n_forward, train)
