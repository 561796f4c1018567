"""Direct (non-Estimator) runs of a model on given tokens: its logits from a checkpoint or fresh init, and
a few training steps through the same training step as the Estimator (engine/train_step.py).

Used by the tests (causality, layout equivalence, HF parity, model options) and by tools that need logits
for a batch without a training loop. Runs on the same placement mesh as training.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from engine import train_step
from engine.optimizer import apply_gradients, learning_rate, updates_then_step
from models import gpt
from models.config import GPTConfig


def _session_config(devices: list[str]) -> tf.ConfigProto:
    """These graphs run a handful of times, so Grappler's graph rewriting would cost more than it saves."""
    rewrites = rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True)
    return tf.ConfigProto(device_count={"CPU": max(1, sum("CPU" in d for d in devices))}, allow_soft_placement=True,
                          graph_options=tf.GraphOptions(rewrite_options=rewrites))


def compute_logits(cfg: GPTConfig, tokens: np.ndarray, devices: list[str],
                   checkpoint: Optional[str] = None) -> np.ndarray:
    """tokens [batch, n_ctx] -> float32 logits [batch, n_ctx, n_vocab].

    `checkpoint` is a checkpoint prefix or a model directory (its latest checkpoint); without one the
    variables take their seeded initial values, identical on every layout.
    """
    tokens = np.asarray(tokens, dtype=np.int32)
    if checkpoint and tf.io.gfile.isdir(checkpoint):
        checkpoint = tf.train.latest_checkpoint(checkpoint)
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "gpt_mesh")
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mtf.convert_to_shape(cfg.mesh_shape), mtf.convert_to_layout_rules(cfg.layout), devices)
        dims = gpt.Dims.of(cfg, tokens.shape[0])
        x = mtf.import_fully_replicated(mesh, tf.constant(tokens), mtf.Shape([dims.batch, dims.sequence]))
        out = gpt.logits(x, cfg, dims, train=False)
        lowering = mtf.Lowering(mtf_graph, {mesh: impl})
        tf_logits = lowering.export_to_tf_tensor(out)
        masters = tf.global_variables()
        copy_to_slices = lowering.copy_masters_to_slices()
        session_config = _session_config(devices)
        with tf.Session(config=session_config) as session:
            session.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
            if checkpoint:
                tf.train.Saver(var_list=masters).restore(session, checkpoint)
            session.run(copy_to_slices)
            return session.run(tf_logits)


def compute_losses(cfg: GPTConfig, inputs: np.ndarray, labels: np.ndarray, devices: list[str],
                   train: bool = True) -> dict[str, float]:
    """The losses of one batch at the seeded initial weights, without a backward pass: "loss" (cross-entropy),
    "objective" and, with MoE layers, "moe_loss". train=True builds the model as a training step does
    (MoE capacity and dropout of training)."""
    inputs, labels = np.asarray(inputs, np.int32), np.asarray(labels, np.int32)
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "gpt_mesh")
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mtf.convert_to_shape(cfg.mesh_shape), mtf.convert_to_layout_rules(cfg.layout), devices)
        dims = gpt.Dims.of(cfg, inputs.shape[0])
        shape = mtf.Shape([dims.batch, dims.sequence])
        x, y = (mtf.import_fully_replicated(mesh, tf.constant(t), shape) for t in (inputs, labels))
        losses = train_step.losses(x, y, cfg, dims, train=train, weights=gpt.loss_weights(y, cfg))
        named = {"loss": losses.cross_entropy, "objective": losses.objective}
        if losses.moe_loss is not None:
            named["moe_loss"] = losses.moe_loss
        lowering = mtf.Lowering(mtf_graph, {mesh: impl})
        tf_losses = {name: lowering.export_to_tf_tensor(t) for name, t in named.items()}
        session_config = _session_config(devices)
        with tf.Session(config=session_config) as session:
            session.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
            session.run(lowering.copy_masters_to_slices())
            return {name: float(value) for name, value in session.run(tf_losses).items()}


@dataclass
class TrainingRun:
    """What `run_training` saw: per step (before that step's update) and after the last step."""
    losses: list = field(default_factory=list)        # cross-entropy, as the Estimator reports it
    objectives: list = field(default_factory=list)    # what was minimised (with z-loss and MoE loss)
    moe_losses: list = field(default_factory=list)    # the MoE load-balancing loss (empty without MoE)
    gradients: dict = field(default_factory=dict)     # name -> unclipped gradient of the last step
    weights: dict = field(default_factory=dict)       # name -> value after the last step


def run_training(cfg: GPTConfig, batches: list, devices: list[str], steps: int) -> TrainingRun:
    """Runs `steps` training steps from the seeded initial weights on the batches [(inputs, labels), ...]
    (int [batch, n_ctx] each, cycled), with the learning-rate schedule from global step 0."""
    batch_size = int(np.asarray(batches[0][0]).shape[0])
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "gpt_mesh")
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mtf.convert_to_shape(cfg.mesh_shape), mtf.convert_to_layout_rules(cfg.layout), devices)
        dims = gpt.Dims.of(cfg, batch_size)
        shape = mtf.Shape([dims.batch, dims.sequence])
        feeds = [tf.placeholder(tf.int32, shape.to_integer_list) for _ in range(2)]
        inputs, labels = (mtf.import_fully_replicated(mesh, t, shape) for t in feeds)
        losses, grads, variables = train_step.losses_and_gradients(inputs, labels, cfg, dims)
        global_step = tf.train.get_or_create_global_step()
        lr = learning_rate(cfg, global_step)
        updates, _ = apply_gradients(grads, variables, cfg, mtf.import_fully_replicated(mesh, lr, mtf.Shape([])))
        lowering = mtf.Lowering(mtf_graph, {mesh: impl})
        scalars = {"loss": losses.cross_entropy, "objective": losses.objective}
        if losses.moe_loss is not None:
            scalars["moe_loss"] = losses.moe_loss
        tf_scalars = {name: lowering.export_to_tf_tensor(t) for name, t in scalars.items()}
        tf_grads = {v.name: lowering.export_to_tf_tensor(g) for v, g in zip(variables, grads) if g is not None}
        train_op = updates_then_step([lowering.lowered_operation(op) for op in updates], global_step)
        names = {v.name: v for v in variables}
        copy_to_slices, copy_to_masters = lowering.copy_masters_to_slices(), lowering.copy_slices_to_masters()
        session_config = _session_config(devices)
        run = TrainingRun()
        with tf.Session(config=session_config) as session:
            session.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
            session.run(copy_to_slices)
            for step in range(steps):
                batch = batches[step % len(batches)]
                fetches = {"scalars": tf_scalars, "train": train_op}
                if step == steps - 1:
                    fetches["gradients"] = tf_grads
                values = session.run(fetches, feed_dict=dict(zip(feeds, batch)))
                run.losses.append(float(values["scalars"]["loss"]))
                run.objectives.append(float(values["scalars"]["objective"]))
                if "moe_loss" in values["scalars"]:
                    run.moe_losses.append(float(values["scalars"]["moe_loss"]))
            run.gradients = values.get("gradients", {})
            session.run(copy_to_masters)
            masters = {v.name[:-2]: v for v in tf.global_variables()}
            run.weights = session.run({name: masters[name] for name in names})
        return run
