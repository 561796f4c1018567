"""The one callback type of a training run (OLMo-core's): what a run does besides training steps, at four moments.

train/loop.py calls, in the order the callbacks were given, each one's
    on_open(run)                        the session is open and the checkpoint restored, before anything is written
    on_step(run, step, values)          after each step, with its scalars
    on_checkpoint(run, step, prefix)    after a steps_per_checkpoint (or keep_checkpoint_steps) save, unless stopping
    on_end(run, step)                   when the loop leaves, normally or not (in the reverse order)
with the `Run`: what every callback may need (the config, the placement, the program and its session, the steps)
and the two requests a callback can make of the loop: stop after this step (`run.stop`) and save now
(`run.save_soon`). The progress line, the trackers (TensorBoard, W&B), the evaluations at checkpoints, the
placement listing, preemption and the clock's checkpoints are all callbacks (train/job.py lists a run's). They live
here, below the jobs, so that the evaluations (evals/), the signal handling (execution/preemption.py) and the op
listing (execution/op_listing.py) can be callbacks without importing the trainer.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Optional

# The clock a run's times are read from (tests replace it).
clock = time.monotonic


def now() -> float:
    """`clock()`, read when called (so that a replaced clock is the one read)."""
    return clock()


@dataclass
class Run:
    """A training run while its loop runs, as its callbacks see it."""
    cfg: Any                    # the config as trained (precision resolved)
    placement: Any              # devices/placement.Placement
    program: Any                # execution/runner.Program: the training step built on the placement
    session: Any                # execution/mesh_session.MeshSession, open
    start: int                  # the step the run started from (the restored checkpoint's, or 0)
    until: int                  # the step it trains to
    step: int = 0               # the last step trained
    saved_at: float = field(default_factory=now)  # when the last checkpoint was saved (or the run began)
    stop_signal: Optional[int] = None  # set by `stop`: the loop saves and stops after this step
    save_soon: bool = False     # set by a callback: the loop saves after this session call
    _paused: float = 0.0        # seconds spent in on_checkpoint hooks
    _began: float = field(default_factory=now)

    def stop(self, signum: int) -> None:
        """Stop after the step in progress with a checkpoint, as for `signum` (a callback saw it, or was told)."""
        if self.stop_signal is None:
            self.stop_signal = signum

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None

    def training_seconds(self) -> float:
        """Seconds since the loop began, without the time spent in on_checkpoint hooks (the evaluations at
        checkpoints): what a rate of training steps is measured against."""
        return clock() - self._began - self._paused

    @contextlib.contextmanager
    def paused(self):
        """Time spent inside is not training time (the loop runs the on_checkpoint hooks in it)."""
        began = clock()
        try:
            yield
        finally:
            self._paused += clock() - began


class Callback:
    """One thing a training run does besides its steps; each hook does nothing unless a subclass says otherwise."""

    def on_open(self, run: Run) -> None:
        """The session is open, the checkpoint restored and found to fit the config: from here on model_path is
        written (a checkpoint of another model left it untouched). Before the first step."""

    def on_step(self, run: Run, step: int, values: dict) -> None:
        """After training step `step` (counted from 1) with its scalars (train/step.py's outputs)."""

    def on_checkpoint(self, run: Run, step: int, prefix: str) -> None:
        """After the checkpoint of `step` was saved as `prefix` (model_path/model.ckpt-STEP) at a steps_per_checkpoint
        boundary, a keep_checkpoint_steps step or the last step, unless a stop was asked for; training goes on in
        the same session after it. Its time is left out of the run's training time."""

    def on_end(self, run: Run, step: int) -> None:
        """When the loop leaves at `step`: at the end, on a stop, or on an error (then `run.step` may be short of
        `run.until`). Runs for every callback whose on_open ran, in the reverse order."""


class EachStep(Callback):
    """A function of (step, values) called after each step: the smallest callback (tests and benchmarks record
    losses or times with it)."""

    def __init__(self, fn):
        self.fn = fn

    def on_step(self, run: Run, step: int, values: dict) -> None:
        self.fn(step, values)
