"""Direct (non-Estimator) evaluation of a model's logits on given tokens, from a checkpoint or fresh init.

Used by the tests (causality, layout equivalence, HF parity) and by tools that need logits for a batch
without a training loop. Runs on the same placement mesh as training.
"""
from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from models import gpt
from models.config import GPTConfig


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
        session_config = tf.ConfigProto(device_count={"CPU": max(1, sum("CPU" in d for d in devices))},
                                        allow_soft_placement=True)
        with tf.Session(config=session_config) as session:
            session.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
            if checkpoint:
                tf.train.Saver(var_list=masters).restore(session, checkpoint)
            session.run(copy_to_slices)
            return session.run(tf_logits)
