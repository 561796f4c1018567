"""Running infer/outputs.py's PREDICT outputs over rows of examples from a checkpoint, a batch at a time: for
--predict's samples, the eval tasks' scores and tools that need logits; on CPUs and GPUs or on a TPU."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow.compat.v1 as tf
from tqdm import tqdm

from config.schema import GPTConfig
from infer import outputs
from runtime import checkpoints, runner
from runtime.devices import Placement
from runtime.mesh_session import padded_batch
from models.optimizers import slot_patterns


def prediction_program(cfg: GPTConfig, placement: Placement, rows: dict, batch_size: int,
                       options=None) -> runner.Program:
    """infer/outputs.py's outputs on the placement for `batch_size` rows like those of `rows`, fed per call."""
    def step(mesh, impl, features):
        return outputs.predictions(cfg, mesh, impl, features, options, gather=placement.whole_outputs)
    return runner.Program(cfg, placement, step, runner.Fed.like(rows, batch_size))


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
    program = prediction_program(cfg, placement, rows, batch_size, options)
    batches = range(0, count, batch_size)
    if progress and len(batches) > 1:
        batches = tqdm(batches, unit="batch", desc="predict", dynamic_ncols=True)
    results = []
    with program.open(checkpoint, slot_patterns(), inference=True) as session:
        for first in batches:
            batch = {name: padded_batch(value[first:first + batch_size], batch_size) for name, value in rows.items()}
            out = program.run(session, 1, batch)[0]
            results.append({name: value[:min(batch_size, count - first)] for name, value in out.items()})
            if on_batch:
                on_batch(min(batch_size, count - first))
    return {name: np.concatenate([r[name] for r in results]) for name in results[0]}
