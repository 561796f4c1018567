"""A TF session over one lowered mesh-tensorflow graph: the model's variables restored from a checkpoint (or
initialised from their seeds) and copied to the mesh's slices; saving copies them back first.

Every job's program runs in one (opened by execution/runner.py's Program for training, evaluation, prediction, the
SavedModel export and --selfcheck), on CPUs and GPUs or on a TPU. tools/hf.py's import writes its step-0
checkpoint without one (nothing is lowered), with the same Saver and finiteness check (`checkpoint_saver`,
`save_finite`).
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

import models  # noqa: F401  (mesh-tensorflow's compatibility alias, before mesh_tensorflow)
import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

try:  # TensorFlow's internals (2.20, 2.21): without them `run_once` keeps its executor (see there)
    from tensorflow.core.protobuf import config_pb2
except ImportError:
    config_pb2 = None

from modelpath import checkpoints

# Graph collection of the variables a checkpoint may lack, initialised where it does: float16 training's loss
# scale (train/loss_scale.py), absent from checkpoints of other precisions and converted ones.
RESTORE_OPTIONAL = "restore_optional"


class MeshSession:
    """A session over a graph holding one lowered mesh, with the model's variables restored from `checkpoint`
    (or initialised from their seeds) and copied to the mesh's slices. `save` copies them back and writes a
    checkpoint of every global variable (weights, optimizer slots, global step) into model_path. The checkpoint's
    variables and shapes are compared with the graph's first (checkpoints.check_fits): a checkpoint of another
    model is one CheckpointError, before anything is restored or written. `slot_patterns` (opt_name -> the
    pattern of its slot names, models/optimizers.slot_patterns()) tells optimizer state in the checkpoint apart from
    model variables. `saves=False` (prediction, evaluation, export) leaves out what only saving needs: the
    finiteness check's ops, four a variable and a third of a tiny model's session set-up."""

    def __init__(self, graph: tf.Graph, lowering: mtf.Lowering, target: str, config: tf.ConfigProto,
                 checkpoint: Optional[str], finalize: bool = True, slot_patterns: Mapping[str, str] = {},
                 saves: bool = True):
        with graph.as_default():
            self.saver = checkpoint_saver(tf.global_variables())
            initialize = tf.group(tf.global_variables_initializer(), tf.local_variables_initializer())
            self.copy_to_slices = lowering.copy_masters_to_slices()
            self.copy_to_masters = lowering.copy_slices_to_masters()
            self.saves = saves
            self._checked, self._finite = finiteness(tf.global_variables()) if saves else ([], None)
        self.session = tf.Session(target, graph=graph, config=config)
        self.checkpoint, self._slot_patterns = checkpoint, slot_patterns
        try:
            if checkpoint:
                self.checkpoint = self._restore_newest_complete(graph, checkpoint)
            else:
                run_once(self.session, initialize)
            self.session.run(self.copy_to_slices)
        except BaseException:
            self.session.close()
            raise
        if finalize:  # nothing is added while running: a loop that grows the graph fails at once
            graph.finalize()

    def _restore_newest_complete(self, graph: tf.Graph, checkpoint: str, tries: int = 3, initial: bool = True) -> str:
        """Restores `checkpoint`; when a trainer rotated it away meanwhile (its index gone: a reader does not take
        the trainer's lock, modelpath/lock.py), from the newest complete one then, up to `tries` times in all (a
        trainer that saves every few seconds and keeps few checkpoints can rotate the next one away too). Returns
        the one restored."""
        folder, first = os.path.dirname(checkpoint), checkpoint
        for attempt in range(tries):
            try:
                self._restore(graph, checkpoint, initial)
                break
            except (checkpoints.CheckpointError, tf.errors.OpError):
                newest = None if tf.io.gfile.exists(checkpoint + ".index") else checkpoints.restorable(folder)
                if attempt + 1 == tries or not newest:
                    raise
                checkpoint = newest
        if checkpoint != first:
            checkpoints.warn(f"{os.path.basename(first)} in {folder} was removed while it was being read (a "
                             f"trainer rotated it away); using {os.path.basename(checkpoint)}, the newest then")
        return checkpoint

    def restore(self, checkpoint: str) -> str:
        """The variables of this open session restored from another checkpoint of the same model (an evaluation
        program reused at each checkpoint of a training run, train/job.py) and copied to the mesh's slices: adds
        nothing to the graph. Local variables keep their values (they are the session's own state, not the
        checkpoint's: a TPU loop's count). Returns the checkpoint restored (the newest, if it was rotated away)."""
        self.checkpoint = self._restore_newest_complete(self.session.graph, checkpoint, initial=False)
        self.session.run(self.copy_to_slices)
        return self.checkpoint

    def _restore(self, graph: tf.Graph, checkpoint: str, initial: bool = True) -> None:
        with graph.as_default():
            # before anything is restored or written: every job's graph against its checkpoint
            checkpoints.check_fits(checkpoint, {v.op.name: v.shape.as_list() for v in tf.global_variables()},
                                   {v.op.name for v in tf.get_collection(RESTORE_OPTIONAL)}, self._slot_patterns)
            stored = {name for name, _ in tf.train.list_variables(checkpoint)}
            fresh = [v for v in tf.get_collection(RESTORE_OPTIONAL) if v.op.name not in stored]
            if fresh and not initial:  # restore() builds no Saver: only a session's first restore meets these
                raise checkpoints.CheckpointError(f"{os.path.basename(checkpoint)} lacks variables this session "
                                                  f"initialised at its first restore: open a new session on it")
            restorer = self.saver
            if fresh:
                names = {v.op.name for v in fresh}
                restorer = tf.train.Saver([v for v in tf.global_variables() if v.op.name not in names], sharded=True)
            restore_locals = (tf.group(tf.local_variables_initializer(), tf.variables_initializer(fresh))
                              if initial else None)
            # Saver.save/restore take their eager path outside the graph
            try:
                restorer.restore(self.session, checkpoint)
            except (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.NotFoundError,
                    tf.errors.InvalidArgumentError, ValueError) as e:  # damaged in a way its sizes do not show, or gone
                folder, base = os.path.split(checkpoint)
                raise checkpoints.CheckpointError(
                    f"{base} in {folder} cannot be restored ({checkpoints.reason(e)}): put back a good copy of "
                    f"its files, delete them ({base}.*) to use the previous checkpoint, or pass --new to start "
                    f"over") from e
            if restore_locals is not None:
                self.session.run(restore_locals)

    def run(self, fetches, feed_dict=None):
        return self.session.run(fetches, feed_dict=feed_dict)

    def save(self, writer: checkpoints.CheckpointWriter, step: int) -> str:
        """Copies the slices back to the masters and writes them as model.ckpt-STEP; weights holding inf or NaN
        are a checkpoints.NonFiniteWeights, with nothing written."""
        if not self.saves:
            raise RuntimeError("this session was opened with saves=False: it has no finiteness check to save with")
        self.session.run(self.copy_to_masters)
        return save_finite(self.session, writer, step, self._checked, self._finite)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "MeshSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_once(session: tf.Session, op) -> None:
    """Runs `op` through a callable released right after, so that TF drops its executor, constants included.
    TF's constant folding turns a zeros initializer into a Const node (a splat: compact in the graph, a whole
    tensor in memory), and a session keeps every executor it ran, with its kernels and their tensors, until it
    closes: each Adam slot's folded zeros outlived its initialisation, held beside the slot once the first update
    gave it a buffer of its own (two weight-sized copies: 0.93 GiB at GPT-Neo 125M)."""
    make_callable = getattr(session, "_make_callable_from_options", None)  # Session.make_callable takes run()'s path
    if make_callable is None or config_pb2 is None:  # a TensorFlow without them: run once, the executor kept
        session.run(op)
        return
    initialise = make_callable(config_pb2.CallableOptions(target=[op.name]))
    initialise()
    del initialise  # TF_SessionReleaseCallable


def checkpoint_saver(variables: list) -> tf.train.Saver:
    """The Saver of a checkpoint of `variables` (every global variable of a job's graph), as every checkpoint is
    written: sharded by device, with relative paths (a model_path can move), rotation left to
    checkpoints.CheckpointWriter."""
    return tf.train.Saver(variables, sharded=True, max_to_keep=None, save_relative_paths=True)


def save_finite(session: tf.Session, writer: checkpoints.CheckpointWriter, step: int, checked: list,
                finite: Optional[tf.Tensor]) -> str:
    """Writes model.ckpt-STEP through `writer`, unless a variable of `checked` holds inf or NaN (`finite`: their
    flags, from `finiteness`): then a checkpoints.NonFiniteWeights, with nothing written."""
    if finite is not None:
        flags = session.run(finite)
        if not flags.all():
            names = [v.op.name for v, ok in zip(checked, flags) if not ok]
            raise checkpoints.NonFiniteWeights(writer.model_path, step, names)
    with session.graph.as_default():
        return writer.save(session, step)


def finiteness(variables: list) -> tuple[list, Optional[tf.Tensor]]:
    """(the floating-point variables, a bool per one: all its elements are finite), each flag computed where
    its variable lives (a host's CPU for a TPU's or a cluster's masters): one read of the weights, per save."""
    checked = [v for v in variables if v.dtype.base_dtype.is_floating]
    flags = []
    for v in checked:
        with tf.colocate_with(v):
            flags.append(tf.reduce_all(tf.math.is_finite(v)))
    return checked, (tf.stack(flags) if flags else None)


def padded_batch(rows: np.ndarray, size: int) -> np.ndarray:
    """Fills a short last batch with copies of its first row (their outputs are dropped)."""
    if len(rows) == size:
        return rows
    return np.concatenate([rows, np.repeat(rows[:1], size - len(rows), axis=0)])

