"""The progress line of a training run, a callback (execution/callbacks.py) printed every few steps:

  step    100/600 | loss 6.1182 | lr 1.88e-03 | 2.07 steps/s | 4,246 tok/s | 34.78 GFLOP/s/device | MFU 21.5% | eta 4m01s

Throughput is measured between printed lines over the run's training time (the evaluations at checkpoints left
out); the first step of a session (graph building, the first run's compilation) is printed but not timed. tok/s
is the whole mesh's; model FLOPs are models/flops.py's per token, and the FLOP/s shown is per device: the mesh's
model FLOP/s divided by its cfg.n_devices devices. MFU divides that by one device's peak FLOP/s (`--peak_tflops`,
or devices/peaks.py's at start). The trackers (train/trackers.py) record the scalars at the steps the line is
printed, with the throughput measured here (`shown`).
"""
from __future__ import annotations

import math
from typing import Optional

from execution.callbacks import Callback, Run
from models import flops
from schema import GPTConfig

SHOWN = ("moe_loss",)  # extra scalars on the progress line


class Progress(Callback):
    """Progress lines every `every` steps (and at the first and last step) of one training session."""

    def __init__(self, cfg: GPTConfig, every: int, peak_flops: float, print_fn=print):
        """`peak_flops`: one device's peak FLOP/s (0: no MFU)."""
        self.cfg, self.every, self.peak, self.print = cfg, max(1, every), peak_flops, print_fn
        self.tokens_per_step = cfg.train_batch_size * cfg.n_ctx
        self.flops_per_token = flops.training_flops_per_token(cfg)
        self._last_time: Optional[float] = None
        self._last_step: Optional[int] = None
        # (step, its throughput scalars) of the last line printed: what the trackers record beside the step's own
        self.shown: tuple[int, dict] = (-1, {})

    def on_open(self, run: Run) -> None:
        self._last_time = self._last_step = None
        # The session's first call optimises the graph and compiles its kernels (or loads them from XLA's cache):
        # seconds without a line otherwise, 17 s on a 2-core AVX2 CPU with a cold cache.
        self.print(f"running step {run.step + 1}, the session's first: the graph is optimised and its kernels "
                   f"compiled (or loaded from XLA's cache) ...", flush=True)

    def on_step(self, run: Run, step: int, values: dict) -> None:
        self.step(step, values, run.training_seconds())

    def step(self, step: int, values: dict, now: float) -> None:
        """After training step `step` (counted from 1) with its fetched scalars, at training time `now`."""
        line = f"step {step:>6}/{self.cfg.train_steps} | loss {values['loss']:.4f}" + "".join(
            f" | {name} {values[name]:.4f}" for name in SHOWN if name in values) + f" | lr {values['learning_rate']:.2e}"
        if self._last_time is None:  # the first step includes building and warming up: not timed
            self._last_time, self._last_step = now, step
            self.print(line, flush=True)
            self.shown = (step, {})
            return
        if step % self.every and step != self.cfg.train_steps:
            return
        steps_per_s = (step - self._last_step) / max(now - self._last_time, 1e-9)
        tokens_per_s = steps_per_s * self.tokens_per_step
        model_flops = tokens_per_s * self.flops_per_token
        per_device = model_flops / self.cfg.n_devices
        mfu = f" | MFU {100 * per_device / self.peak:.1f}%" if self.peak else ""
        eta = (self.cfg.train_steps - step) / steps_per_s if steps_per_s > 0 else math.inf
        self.print(f"{line} | {steps_per_s:.2f} steps/s | {tokens_per_s:,.0f} tok/s | "
                   f"{per_device / 1e9:.2f} GFLOP/s/device{mfu} | eta {duration(eta)}", flush=True)
        speed = {"tokens_per_sec": tokens_per_s, "model_flops_per_sec": model_flops,
                 "model_flops_per_sec_per_device": per_device}
        if self.peak:
            speed["mfu"] = per_device / self.peak
        self.shown = (step, speed)
        self._last_time, self._last_step = now, step


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
