"""The training loop (the project's own, in place of TensorFlow's Estimator).

It builds the training step (train/step.py) on the mesh, opens a session that restores model_path's latest
checkpoint (or initialises the variables from their seeds; execution/mesh_session.py) and runs steps from the
input pipeline, positioned at the restored step so that a resumed run sees exactly the batches an
uninterrupted one would. It saves a checkpoint every `steps_per_checkpoint` steps, at each of
`keep_checkpoint_steps` (never rotated away) and at the end (modelpath/checkpoints.py: atomic, rotated), prints
progress and writes TensorBoard scalars (train/progress.py).
After each of those saves (not the ones `checkpoint_minutes` adds, nor one made to stop) the callbacks given run
with the checkpoint just written (`Callback.on_checkpoint`: train/job.py's evaluations), while the training
session stays open: one program and one session train the whole run.
A non-finite loss or gradient norm stops the run at that step, and a checkpoint is never written with weights
holding inf or NaN (train/divergence.py's Diverged, one line: the last checkpoint written is the newest).
Ctrl-C or SIGTERM (a scheduler's preemption or time limit) stops after the current step with a checkpoint saved; a
second one stops at once (the last checkpoint is intact either way; execution/preemption.py). `checkpoint_minutes`
also saves whenever that many minutes have passed since the last save (for long steps).

The step runs on the placement through execution/runner.py: on CPUs and GPUs (one host or several,
devices/cluster.py) one session call runs one step; with --tpu the SIMD mesh runs inside a replicated TPU loop,
`iterations` steps per session call (devices/tpu.py). Everything here is the same for all of them.
"""
from __future__ import annotations

import contextlib
import io
import signal
import time
from typing import Callable, Optional, Protocol, Sequence

import tensorflow.compat.v1 as tf

from schema import GPTConfig
from modelpath import checkpoints
from devices import gpus
from execution import op_listing
from execution import runner
from devices.placement import Placement
from execution.preemption import StopOnSignal, exit_code, name as signal_name
from models.optimizers import slot_patterns
from train.divergence import Diverged, problem as nonfinite, weights_problem
from train.progress import TrainingLog
from train.step import training_step

# (start_step) -> tf.data.Dataset of (inputs, labels) int batches [train_batch_size, n_ctx], from that step on.
TrainBatches = Callable[[int], tf.data.Dataset]


class Interrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C (SIGINT) or SIGTERM after `step`, with that step's checkpoint saved."""

    def __init__(self, step: int, checkpoint: Optional[str], signum: int = signal.SIGINT):
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal_name(signum)}"
        if checkpoint:
            super().__init__(f"{how} at step {step}; saved {checkpoint} (run the same command again to resume)")
        else:
            super().__init__(f"{how} before the first step; nothing was trained, nothing saved")
        self.step, self.checkpoint, self.signum = step, checkpoint, signum

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


class Callback(Protocol):
    """What a training run does at its checkpoints, beside saving them (train/job.py's evaluations)."""

    def on_checkpoint(self, step: int, prefix: str) -> None:
        """Runs after the checkpoint of `step` was saved as `prefix` (model_path/model.ckpt-STEP), at every
        steps_per_checkpoint boundary, at each keep_checkpoint_steps step and at the last step, unless a stop was
        asked for; training goes on after it in the same session. Its time is left out of the progress line's
        throughput."""


# The clock of `checkpoint_minutes` (tests replace it).
clock = time.monotonic


def training_program(cfg: GPTConfig, placement: Placement, batches: TrainBatches, start_step: int,
                     on_placement: Optional[Callable[[op_listing.PlacementReport], None]] = None) -> runner.Program:
    """The training step (train/step.py) on the placement, reading `batches` from `start_step` on: one step per
    session call, or `iterations` in a TPU's loop. On GPUs the first step lists the ops that ran on the CPU,
    printing the line; `on_placement(report)` asks for that listing on any placement but a TPU's (quiet off
    GPUs: the line speaks of GPUs) and gets it after the first step."""
    program = runner.Program(cfg, placement, lambda mesh, impl, batch: training_step(cfg, mesh, impl, *batch),
                             runner.Batches(lambda: batches(start_step)), steps_per_call=cfg.iterations, seed=cfg.seed)
    if gpus.uses_gpus(placement):
        program.list_placement(then=on_placement)
    elif on_placement:
        program.list_placement(out=io.StringIO(), then=on_placement)
    return program


# train()'s default checkpoint: model_path's newest that can be read (modelpath/checkpoints.py's `restorable`).
NEWEST = "newest"


def train(cfg: GPTConfig, placement: Placement, batches: TrainBatches, until: Optional[int] = None,
          log: Optional[TrainingLog] = None, on_step: Optional[Callable[[int, dict], None]] = None,
          on_open: Optional[Callable[[], None]] = None,
          on_placement: Optional[Callable[[op_listing.PlacementReport], None]] = None,
          checkpoint: Optional[str] = NEWEST, checkpoint_minutes: Optional[float] = None,
          stop: Optional[StopOnSignal] = None, callbacks: Sequence[Callback] = ()) -> int:
    """Trains from model_path's latest checkpoint (or the seeded initial weights) to step `until` (default
    train_steps), saving every steps_per_checkpoint steps and at the end. Returns the step reached.

    `on_step(step, values)` sees each step's scalars (train/step.py's outputs); `on_open()` runs once the session
    is open, the checkpoint restored and found to fit the config, before training writes anything into model_path
    (a job's own writes go there); `on_placement(report)` gets where the first step's ops ran (devices/gpus.py's
    PlacementReport, from that step's partition graphs; not on a TPU), see training_program.
    `checkpoint_minutes` saves also when that many minutes have passed since the last save (checked after each
    session call). `stop` is the signal watcher to use; by default the placement's (a multi-host chief's also
    stops when one of its workers got SIGTERM). `callbacks` run after each steps_per_checkpoint save (Callback).

    `checkpoint` is the prefix to start from, as the caller decided it (train/job.py), None for the seeded
    initial weights, or NEWEST: model_path's newest that can be read (modelpath/checkpoints.py's `restorable`: found
    by its files, one cut short skipped with a warning). The start removes the leftovers of interrupted saves and
    repairs the state file."""
    until = cfg.train_steps if until is None else until
    if checkpoint == NEWEST:
        checkpoint = checkpoints.restorable(cfg.model_path)
    start = step = checkpoints.step_of(checkpoint) if checkpoint else 0
    if step >= until:
        return step
    program = training_program(cfg, placement, batches, step, on_placement)
    with program.open(checkpoint, slot_patterns()) as session, (stop or placement.stop_watcher()) as stop:
        # The checkpoint fits the config (opening the session compared them): from here on model_path is written.
        checkpoints.remove_leftovers(cfg.model_path)
        repaired = checkpoints.repair_state(cfg.model_path, cfg.keep_checkpoint_max, step if checkpoint else None)
        if repaired:
            print(repaired, flush=True)
        if on_open:
            on_open()
        if log and step == 0:  # once per model_path: the graph for TensorBoard's graph view
            log.graph(program.graph)
        writer = checkpoints.CheckpointWriter(cfg.model_path, session.saver, cfg.keep_checkpoint_max,
                                              cfg.keep_checkpoint_every_n_hours, cfg.keep_checkpoint_steps)
        program.start(session)
        saved, saved_at = step, clock()

        def save() -> None:  # weights holding inf or NaN are not written (execution/mesh_session.py)
            try:
                session.save(writer, step)
            except checkpoints.NonFiniteWeights as e:
                raise Diverged(cfg, step, weights_problem(e), from_newest=False) from None

        try:
            while step < until and not stop.requested:
                boundary = min([until, (step // cfg.steps_per_checkpoint + 1) * cfg.steps_per_checkpoint]
                               + [s for s in cfg.keep_checkpoint_steps if s > step])
                for values in program.run(session, min(program.steps_per_call, boundary - step)):
                    step += 1
                    if log:
                        log.step(step, values)
                    if on_step:
                        on_step(step, values)
                    what = nonfinite(values)
                    if what:  # nothing more is saved: the newest checkpoint is the last finite one
                        raise Diverged(cfg, step, what)
                due = checkpoint_minutes and clock() - saved_at >= checkpoint_minutes * 60
                if step == boundary or (due and not stop.requested):
                    save()
                    saved, saved_at = step, clock()
                if step == boundary and callbacks and not stop.requested:
                    prefix = checkpoints.prefix_of(cfg.model_path, step)
                    with (log.paused() if log else contextlib.nullcontext()):
                        for callback in callbacks:
                            callback.on_checkpoint(step, prefix)
        finally:
            if log:
                log.close()
        if stop.requested:
            if saved != step:
                save()
                saved = step
            trained = saved != start or checkpoint  # stopped before the first step of a new run: nothing to save
            raise Interrupted(step, checkpoints.prefix_of(cfg.model_path, step) if trained else None, stop.signum)
    return step
