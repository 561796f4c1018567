"""Running infer/outputs.py's PREDICT outputs over rows of examples from a checkpoint, a batch at a time: for
--predict's samples, the eval tasks' scores and tools that need logits; on CPUs and GPUs or on a TPU."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow.compat.v1 as tf
from tqdm import tqdm

from config.schema import GPTConfig
from infer import outputs
from runtime import checkpoints, meshes, tpu
from runtime.devices import Placement
from runtime.mesh_session import open_session, padded_batch
from models.optimizers import slot_patterns


def predict(cfg: GPTConfig, placement: Placement, rows: dict, batch_size: int,
            checkpoint: Optional[str] = None, options=None, progress: bool = False,
            on_batch: Optional[Callable[[int], None]] = None) -> dict:
    """infer/outputs.py's outputs for every row of `rows` (numpy arrays, one row per example), run
    `batch_size` rows at a time (the last batch padded); from `checkpoint`, a checkpoint prefix or a folder
    (its latest), or from the seeded initial weights when None. `progress` shows a bar of batches;
    `on_batch(rows)` is called after each batch with its count of rows (a caller's own progress bar)."""
    rows = {name: np.asarray(value) for name, value in rows.items()}
    count = len(next(iter(rows.values())))
    if checkpoint and tf.io.gfile.isdir(checkpoint):
        checkpoint = checkpoints.require_checkpoint(checkpoint)
    if placement.use_tpu:
        return _predict_on_tpu(cfg, placement, rows, batch_size, checkpoint, options, on_batch)
    graph = tf.Graph()
    with graph.as_default(), tf.device(placement.device_function()):
        feeds = {name: tf.placeholder(tf.as_dtype(value.dtype), [batch_size] + list(value.shape[1:]), name=name)
                 for name, value in rows.items()}
        mesh, impl = meshes.placement_mesh(cfg, placement)
        lowered = outputs.predictions(cfg, mesh, impl, feeds, options)
    batches = range(0, count, batch_size)
    if progress and len(batches) > 1:
        batches = tqdm(batches, unit="batch", desc="predict", dynamic_ncols=True)
    results = []
    with open_session(placement, graph, lowered.lowering, checkpoint, slot_patterns(),
                      inference=True) as session:
        for first in batches:
            batch = {feeds[name]: padded_batch(value[first:first + batch_size], batch_size) for name, value in rows.items()}
            out = session.run(lowered.outputs, feed_dict=batch)
            results.append({name: value[:min(batch_size, count - first)] for name, value in out.items()})
            if on_batch:
                on_batch(min(batch_size, count - first))
    return {name: np.concatenate([r[name] for r in results]) for name in results[0]}


class TpuPrediction:
    """infer/outputs.py's outputs for one batch per session call, the batch fed on the first host."""

    def __init__(self, cfg: GPTConfig, placement: Placement, rows: dict, batch_size: int, options=None):
        system = placement.system
        self.names = sorted(rows)
        tf.train.get_or_create_global_step()
        with tf.device(system.host_device(0)):
            self.feeds = [tf.placeholder(tf.as_dtype(rows[k].dtype), [batch_size] + list(rows[k].shape[1:]), name=k)
                          for k in self.names]
        lowered = []

        def step(dequeued):
            mesh, impl = tpu.simd_mesh(cfg, system)
            lowered.append(outputs.predictions(cfg, mesh, impl, dict(zip(self.names, dequeued)), options, gather=True))
            return lowered[-1].outputs, None

        self.loop = tpu.ReplicatedLoop(system, self.feeds, step)
        self.lowered = lowered[0]


def _predict_on_tpu(cfg: GPTConfig, placement: Placement, rows: dict, batch_size: int, checkpoint: Optional[str], options,
                    on_batch: Optional[Callable[[int], None]] = None):
    """predict() on the TPU: one batch per session call."""
    count = len(next(iter(rows.values())))
    graph = tf.Graph()
    with graph.as_default():
        program = TpuPrediction(cfg, placement, rows, batch_size, options)
    results = []
    with open_session(placement, graph, program.lowered.lowering, checkpoint, slot_patterns()) as session:
        for first in range(0, count, batch_size):
            feed = {placeholder: padded_batch(rows[name][first:first + batch_size], batch_size)
                    for placeholder, name in zip(program.feeds, program.names)}
            out = program.loop.run(session, 1, feed_dict=feed)[0]
            results.append({k: v[:min(batch_size, count - first)] for k, v in out.items()})
            if on_batch:
                on_batch(min(batch_size, count - first))
    return {k: np.concatenate([r[k] for r in results]) for k in results[0]}
