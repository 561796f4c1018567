"""The training loop (the project's own, in place of TensorFlow's Estimator).

It builds the training step (train/step.py) on the mesh, opens a session that restores model_path's latest
checkpoint (or initialises the variables from their seeds; execution/mesh_session.py) and runs steps from the
input pipeline, positioned at the restored step so that a resumed run sees exactly the batches an
uninterrupted one would. It saves a checkpoint every `steps_per_checkpoint` steps, at each of
`keep_checkpoint_steps` (never rotated away) and at the end (modelpath/checkpoints.py: atomic, rotated): one
program and one session train the whole run. Everything else a run does is a callback (execution/callbacks.py:
on_open, on_step, on_checkpoint, on_end), which train/job.py lists: the progress line, the trackers, the
evaluations at checkpoints, the placement listing, the signal watcher and `CheckpointOnTheClock` below.
A non-finite loss or gradient norm stops the run at that step, and a checkpoint is never written with weights
holding inf or NaN (train/divergence.py's Diverged, one line: the last checkpoint written is the newest).
Ctrl-C or SIGTERM (a scheduler's preemption or time limit) stops after the current step with a checkpoint saved; a
second one stops at once (the last checkpoint is intact either way; execution/preemption.py).

The step runs on the placement through execution/runner.py: on CPUs and GPUs (one host or several,
devices/cluster.py) one session call runs one step; with --tpu the SIMD mesh runs inside a replicated TPU loop,
`iterations` steps per session call (devices/tpu.py). Everything here is the same for all of them.
"""
from __future__ import annotations

import signal
from typing import Callable, Optional, Sequence

import tensorflow.compat.v1 as tf

from devices.placement import Placement
from execution import runner
from execution.callbacks import Callback, Run, now
from execution.preemption import StopOnSignal, exit_code, name as signal_name
from modelpath import checkpoints
from models.optimizers import slot_patterns
from schema import GPTConfig
from train.divergence import Diverged, problem as nonfinite, weights_problem
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


def training_program(cfg: GPTConfig, placement: Placement, batches: TrainBatches, start_step: int) -> runner.Program:
    """The training step (train/step.py) on the placement, reading `batches` from `start_step` on: one step per
    session call, or `iterations` in a TPU's loop."""
    return runner.Program(cfg, placement, lambda mesh, impl, batch: training_step(cfg, mesh, impl, *batch),
                          runner.Batches(lambda: batches(start_step)), steps_per_call=cfg.iterations, seed=cfg.seed)


class CheckpointOnTheClock(Callback):
    """`checkpoint_minutes`: a save also whenever that many minutes have passed since the last one (for long
    steps; checked after each step, saved after the session call)."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60

    def on_step(self, run: Run, step: int, values: dict) -> None:
        if now() - run.saved_at >= self.seconds:
            run.save_soon = True


# train()'s default checkpoint: model_path's newest that can be read (modelpath/checkpoints.py's `restorable`).
NEWEST = "newest"


def train(cfg: GPTConfig, placement: Placement, batches: TrainBatches, callbacks: Sequence[Callback] = (),
          until: Optional[int] = None, checkpoint: Optional[str] = NEWEST) -> int:
    """Trains from `checkpoint` (or the seeded initial weights) to step `until` (default train_steps), saving every
    steps_per_checkpoint steps, at each keep_checkpoint_steps step and at the end, with the `callbacks` around the
    steps (execution/callbacks.py: progress, trackers, evaluations, ...). Returns the step reached.

    Every run stops cleanly on SIGINT or SIGTERM (after the step, with a checkpoint: Interrupted): the placement's
    signal watcher (`Placement.stop_watcher`; a multi-host chief's also stops when one of its workers got SIGTERM)
    runs first among the callbacks unless one (a StopOnSignal) is given.

    `checkpoint` is the prefix to start from, as the caller decided it (train/job.py), None for the seeded
    initial weights, or NEWEST: model_path's newest that can be read (modelpath/checkpoints.py's `restorable`:
    found by its files, one cut short skipped with a warning). The start removes the leftovers of interrupted
    saves and repairs the state file."""
    until = cfg.train_steps if until is None else until
    if checkpoint == NEWEST:
        checkpoint = checkpoints.restorable(cfg.model_path)
    start = step = checkpoints.step_of(checkpoint) if checkpoint else 0
    if step >= until:
        return step
    if not any(isinstance(callback, StopOnSignal) for callback in callbacks):
        callbacks = [placement.stop_watcher(), *callbacks]
    program = training_program(cfg, placement, batches, step)
    with program.open(checkpoint, slot_patterns()) as session:
        # The checkpoint fits the config (opening the session compared them): from here on model_path is written.
        checkpoints.remove_leftovers(cfg.model_path)
        repaired = checkpoints.repair_state(cfg.model_path, cfg.keep_checkpoint_max, step if checkpoint else None)
        if repaired:
            print(repaired, flush=True)
        run = Run(cfg, placement, program, session, start, until, step)
        writer = checkpoints.CheckpointWriter(cfg.model_path, session.saver, cfg.keep_checkpoint_max,
                                              cfg.keep_checkpoint_every_n_hours, cfg.keep_checkpoint_steps)
        saved = step

        def save() -> None:  # weights holding inf or NaN are not written (execution/mesh_session.py)
            nonlocal saved
            try:
                session.save(writer, step)
            except checkpoints.NonFiniteWeights as e:
                raise Diverged(cfg, step, weights_problem(e), from_newest=False) from None
            saved, run.saved_at, run.save_soon = step, now(), False

        opened = []
        try:
            for callback in callbacks:
                callback.on_open(run)
                opened.append(callback)
            program.start(session)
            while step < until and not run.stopping:
                boundary = min([until, (step // cfg.steps_per_checkpoint + 1) * cfg.steps_per_checkpoint]
                               + [s for s in cfg.keep_checkpoint_steps if s > step])
                for values in program.run(session, min(program.steps_per_call, boundary - step)):
                    step += 1
                    run.step = step
                    for callback in callbacks:
                        callback.on_step(run, step, values)
                    what = nonfinite(values)
                    if what:  # nothing more is saved: the newest checkpoint is the last finite one
                        raise Diverged(cfg, step, what)
                if step == boundary or (run.save_soon and not run.stopping):
                    save()
                if step == boundary and not run.stopping:
                    prefix = checkpoints.prefix_of(cfg.model_path, step)
                    with run.paused():
                        for callback in callbacks:
                            callback.on_checkpoint(run, step, prefix)
            if run.stopping:
                if saved != step:
                    save()
                trained = saved != start or checkpoint  # stopped before the first step of a new run: nothing to save
                raise Interrupted(step, checkpoints.prefix_of(cfg.model_path, step) if trained else None,
                                  run.stop_signal)
        finally:
            for callback in reversed(opened):
                callback.on_end(run, step)
    return step
