"""A TF session over one lowered mesh-tensorflow graph: the model's variables restored from a checkpoint (or
initialised from their seeds) and copied to the mesh's slices; saving copies them back first.

Every job's program runs in one opened by `open_session` (training, evaluation, prediction, the SavedModel
export, tools/hf.py's import), on CPUs and GPUs or on a TPU.
"""
from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from runtime import checkpoints, tpu
from runtime.devices import Placement


class MeshSession:
    """A session over a graph holding one lowered mesh, with the model's variables restored from `checkpoint`
    (or initialised from their seeds) and copied to the mesh's slices. `save` copies them back and writes a
    checkpoint of every global variable (weights, optimizer slots, global step) into model_path."""

    def __init__(self, graph: tf.Graph, lowering: mtf.Lowering, target: str, config: tf.ConfigProto,
                 checkpoint: Optional[str], finalize: bool = True):
        with graph.as_default():
            self.saver = tf.train.Saver(tf.global_variables(), sharded=True, max_to_keep=None,
                                        save_relative_paths=True)
            initialize = tf.group(tf.global_variables_initializer(), tf.local_variables_initializer())
            restore_locals = tf.local_variables_initializer()
            self.copy_to_slices = lowering.copy_masters_to_slices()
            self.copy_to_masters = lowering.copy_slices_to_masters()
        if finalize:  # nothing is added while running: a loop that grows the graph fails at once
            graph.finalize()
        self.session = tf.Session(target, graph=graph, config=config)
        with graph.as_default():  # Saver.save/restore take their eager path outside the graph
            if checkpoint:
                self.saver.restore(self.session, checkpoint)
                self.session.run(restore_locals)
            else:
                self.session.run(initialize)
            self.session.run(self.copy_to_slices)

    def run(self, fetches, feed_dict=None):
        return self.session.run(fetches, feed_dict=feed_dict)

    def save(self, writer: checkpoints.CheckpointWriter, step: int) -> str:
        self.session.run(self.copy_to_masters)
        with self.session.graph.as_default():
            return writer.save(self.session, step)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "MeshSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def padded_batch(rows: np.ndarray, size: int) -> np.ndarray:
    """Fills a short last batch with copies of its first row (their outputs are dropped)."""
    if len(rows) == size:
        return rows
    return np.concatenate([rows, np.repeat(rows[:1], size - len(rows), axis=0)])


def session_config(placement: Placement) -> tf.ConfigProto:
    if placement.use_tpu:
        return tpu.session_config(placement)
    return tf.ConfigProto(allow_soft_placement=True, device_count={"CPU": placement.cpu_devices})


def open_session(placement: Placement, graph: tf.Graph, lowering: mtf.Lowering,
                 checkpoint: Optional[str]) -> MeshSession:
    """A MeshSession on the placement's master (in-process when empty) with its session config."""
    return MeshSession(graph, lowering, placement.master or "", session_config(placement), checkpoint)
