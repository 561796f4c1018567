"""The project's one runner (in place of TensorFlow's Estimator): train, evaluate and predict on a mesh.

Every mode goes the same way: build the mode's graph (engine/modes.py) on the mesh, lower it, open a
session, restore the latest checkpoint of model_path (or initialise the variables from their seeds), copy
the master variables to the mesh's slices, and run. Training runs steps from the input pipeline, positioned
at the restored step so that a resumed run sees exactly the batches an uninterrupted one would; it saves a
checkpoint every `steps_per_checkpoint` steps and at the end (engine/checkpoints.py: atomic, rotated),
prints progress and writes TensorBoard scalars (engine/progress.py). Ctrl-C stops after the current step
with a checkpoint saved; a second Ctrl-C stops at once (the last checkpoint is intact either way).

On CPUs and GPUs (one host or several, engine/cluster.py) the mesh is mesh-tensorflow's placement mesh and
one session call runs one step. With --tpu it is the SIMD mesh inside a replicated TPU loop that runs
`iterations` steps per session call (engine/tpu.py); everything else here is shared.
"""
from __future__ import annotations

import signal
import threading
from typing import Callable, Optional

import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from engine import checkpoints, modes, tpu
from engine.devices import Placement
from engine.mesh_session import MeshSession, padded_batch
from engine.progress import TrainingLog
from models.config import ConfigError, GPTConfig

# (start_step) -> tf.data.Dataset of (inputs, labels) int batches [train_batch_size, n_ctx], from that step on.
TrainBatches = Callable[[int], tf.data.Dataset]


class Interrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C after `step`, with that step's checkpoint saved."""

    def __init__(self, step: int, checkpoint: str):
        super().__init__(f"interrupted at step {step}; saved {checkpoint}")
        self.step, self.checkpoint = step, checkpoint


def placement_mesh(cfg: GPTConfig, placement: Placement):
    """(mtf.Mesh, PlacementMeshImpl) over the placement's devices; master variables on its hosts if several."""
    placer = mtf.utils.BalancedVariablePlacer(list(placement.hosts)) if placement.hosts else None
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mtf.convert_to_shape(cfg.mesh_shape),
                                                     mtf.convert_to_layout_rules(cfg.layout), list(placement.devices))
    return modes.new_mesh(placer), impl


def session_config(placement: Placement) -> tf.ConfigProto:
    return tf.ConfigProto(allow_soft_placement=True, device_count={"CPU": placement.cpu_devices})


def open_session(placement: Placement, graph: tf.Graph, lowering: mtf.Lowering,
                 checkpoint: Optional[str]) -> MeshSession:
    config = tpu.session_config(placement) if placement.use_tpu else session_config(placement)
    return MeshSession(graph, lowering, placement.master or "", config, checkpoint)


# ----------------------------------------------------------------------------------------------------
# Training


class _PlacementTraining:
    """The training step on a placement mesh, one step per session call."""
    steps_per_call = 1

    def __init__(self, cfg: GPTConfig, placement: Placement, dataset: tf.data.Dataset, extra_fetches=None):
        with tf.device(placement.device_function()):
            self.iterator = tf.data.make_initializable_iterator(dataset)
            inputs, labels = self.iterator.get_next()
            mesh, impl = placement_mesh(cfg, placement)
            self.lowered = modes.training_step(cfg, mesh, impl, inputs, labels)
            extra = extra_fetches(self.lowered) if extra_fetches else {}
        self.fetches = {"train": self.lowered.train_op, "scalars": self.lowered.outputs, "extra": extra}

    def start(self, session: MeshSession) -> None:
        session.run(self.iterator.initializer)

    def run(self, session: MeshSession, steps: int) -> list:
        assert steps == 1
        values = session.run(self.fetches)
        return [dict(values["scalars"], **values["extra"])]


def train(cfg: GPTConfig, placement: Placement, batches: TrainBatches, until: Optional[int] = None,
          log: Optional[TrainingLog] = None, extra_fetches: Optional[Callable] = None,
          on_step: Optional[Callable[[int, dict], None]] = None) -> int:
    """Trains from model_path's latest checkpoint (or the seeded initial weights) to step `until` (default
    train_steps), saving every steps_per_checkpoint steps and at the end. Returns the step reached.

    `extra_fetches(lowered)` may return more TF tensors to fetch with every step; `on_step(step, values)` sees
    each step's scalars (and those extras)."""
    until = cfg.train_steps if until is None else until
    checkpoints.remove_leftovers(cfg.model_path)
    checkpoint = checkpoints.latest(cfg.model_path)
    step = checkpoints.step_of(checkpoint) if checkpoint else 0
    if step >= until:
        return step
    graph = tf.Graph()
    with graph.as_default():
        tf.set_random_seed(cfg.seed)
        if placement.use_tpu:
            program = tpu.TrainingLoop(cfg, placement, batches, step)
        else:
            program = _PlacementTraining(cfg, placement, batches(step), extra_fetches)
    if log and step == 0:  # once per model_path: the graph for TensorBoard's graph view
        log.graph(graph)
    with open_session(placement, graph, program.lowered.lowering, checkpoint) as session, \
            _StopOnInterrupt() as stop:
        writer = checkpoints.CheckpointWriter(cfg.model_path, session.saver, cfg.keep_checkpoint_max,
                                              cfg.keep_checkpoint_every_n_hours)
        program.start(session)
        saved = step
        try:
            while step < until and not stop.requested:
                boundary = min(until, (step // cfg.steps_per_checkpoint + 1) * cfg.steps_per_checkpoint)
                for values in program.run(session, min(program.steps_per_call, boundary - step)):
                    step += 1
                    if log:
                        log.step(step, values)
                    if on_step:
                        on_step(step, values)
                if step == boundary:
                    session.save(writer, step)
                    saved = step
        finally:
            if log:
                log.close()
        if stop.requested:
            if saved != step:
                session.save(writer, step)
            raise Interrupted(step, checkpoints.prefix_of(cfg.model_path, step))
    return step


class _StopOnInterrupt:
    """The first Ctrl-C asks training to stop after the current step (with a checkpoint); the second stops
    at once. Only in the main thread (signal handlers cannot be installed elsewhere)."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        self.requested = True
        print("\nstopping after this step and saving a checkpoint (Ctrl-C again to stop at once)", flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> "_StopOnInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


# ----------------------------------------------------------------------------------------------------
# Evaluation and prediction


def evaluate(cfg: GPTConfig, placement: Placement, batches: Callable[[], tf.data.Dataset], steps: int,
             checkpoint: Optional[str] = None) -> tuple[float, int]:
    """The mean loss over `steps` batches of `batches()` ((inputs, labels), eval_batch_size rows each; made
    inside the graph) at `checkpoint` (default: model_path's latest); returns (loss, the checkpoint's step)."""
    checkpoint = checkpoint or require_checkpoint(cfg.model_path)
    if placement.use_tpu:
        return tpu.evaluate(cfg, placement, batches, steps, checkpoint)
    graph = tf.Graph()
    with graph.as_default(), tf.device(placement.device_function()):
        iterator = tf.data.make_initializable_iterator(batches())
        inputs, labels = iterator.get_next()
        mesh, impl = placement_mesh(cfg, placement)
        lowered = modes.evaluation_loss(cfg, mesh, impl, inputs, labels)
    with open_session(placement, graph, lowered.lowering, checkpoint) as session:
        session.run(iterator.initializer)
        losses = [session.run(lowered.outputs["loss"]) for _ in range(steps)]
    return float(np.mean(losses)), checkpoints.step_of(checkpoint)


def predict(cfg: GPTConfig, placement: Placement, rows: dict, batch_size: int,
            checkpoint: Optional[str] = None, options=None, progress: bool = False) -> dict:
    """engine/inference.py's outputs for every row of `rows` (numpy arrays, one row per example), run
    `batch_size` rows at a time (the last batch padded); from `checkpoint`, a checkpoint prefix or a folder
    (its latest), or from the seeded initial weights when None."""
    rows = {name: np.asarray(value) for name, value in rows.items()}
    count = len(next(iter(rows.values())))
    if checkpoint and tf.io.gfile.isdir(checkpoint):
        checkpoint = require_checkpoint(checkpoint)
    if placement.use_tpu:
        return tpu.predict(cfg, placement, rows, batch_size, checkpoint, options)
    graph = tf.Graph()
    with graph.as_default(), tf.device(placement.device_function()):
        feeds = {name: tf.placeholder(tf.as_dtype(value.dtype), [batch_size] + list(value.shape[1:]), name=name)
                 for name, value in rows.items()}
        mesh, impl = placement_mesh(cfg, placement)
        lowered = modes.predictions(cfg, mesh, impl, feeds, options)
    batches = range(0, count, batch_size)
    if progress and len(batches) > 1:
        from tqdm import tqdm
        batches = tqdm(batches, unit="batch", desc="predict", dynamic_ncols=True)
    results = []
    with open_session(placement, graph, lowered.lowering, checkpoint) as session:
        for first in batches:
            batch = {feeds[name]: padded_batch(value[first:first + batch_size], batch_size) for name, value in rows.items()}
            out = session.run(lowered.outputs, feed_dict=batch)
            results.append({name: value[:min(batch_size, count - first)] for name, value in out.items()})
    return {name: np.concatenate([r[name] for r in results]) for name in results[0]}


def require_checkpoint(folder: str) -> str:
    """The newest checkpoint in `folder` (a model_path); a one-line error when there is none."""
    found = checkpoints.latest(folder)
    if not found:
        raise ConfigError(f"no checkpoint in {folder}: train first (python main.py --model ...)")
    return found
