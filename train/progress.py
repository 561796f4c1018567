"""What a training run shows while it runs: a progress line every few steps and TensorBoard scalars.

  step    100/600 | loss 6.1182 | lr 1.88e-03 | 2.07 steps/s | 4,246 tok/s | 34.78 GFLOP/s/device | MFU 21.5% | eta 4m01s

Throughput is measured between printed lines; the first step of a session (graph building, the first run's
compilation) is printed but not timed. tok/s is the whole mesh's; model FLOPs are models/flops.py's per token,
and the FLOP/s shown is per device: the mesh's model FLOP/s divided by its cfg.n_devices devices. MFU divides
that by one device's peak FLOP/s (`--peak_tflops`, or devices/peaks.py's at start). TensorBoard gets loss,
learning_rate, grad_norm (and moe_loss; float16's loss_scale; with `log_grads`, grad_norm/<variable>) every
`every` steps with the throughput numbers, in model_path; evaluation results go to model_path/eval.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Optional

import tensorflow.compat.v1 as tf

from schema import GPTConfig
from models import flops
from modelpath.events import write_scalars

LOGGED = ("loss", "learning_rate", "grad_norm", "moe_loss", "loss_scale")  # the step's scalars for TensorBoard
SHOWN = ("moe_loss",)                                        # extra scalars on the progress line


class TrainingLog:
    """Progress lines and TensorBoard scalars for the steps of one training session."""

    def __init__(self, cfg: GPTConfig, every: int, peak_flops: float, writer: Optional[tf.summary.FileWriter],
                 print_fn=print):
        """`peak_flops`: one device's peak FLOP/s (0: no MFU)."""
        self.cfg, self.every, self.peak, self.writer, self.print = cfg, max(1, every), peak_flops, writer, print_fn
        self.tokens_per_step = cfg.train_batch_size * cfg.n_ctx
        self.flops_per_token = flops.training_flops_per_token(cfg)
        self._last_time: Optional[float] = None
        self._last_step: Optional[int] = None

    def step(self, step: int, values: dict) -> None:
        """After training step `step` (counted from 1) with its fetched scalars."""
        now = time.time()
        shown = f"step {step:>6}/{self.cfg.train_steps} | loss {values['loss']:.4f}" + "".join(
            f" | {name} {values[name]:.4f}" for name in SHOWN if name in values) + f" | lr {values['learning_rate']:.2e}"
        if self._last_time is None:  # the first step includes building and warming up: not timed
            self._last_time, self._last_step = now, step
            self.print(shown, flush=True)
            self._write(step, values, {})
            return
        if step % self.every and step != self.cfg.train_steps:
            return
        steps_per_s = (step - self._last_step) / max(now - self._last_time, 1e-9)
        tokens_per_s = steps_per_s * self.tokens_per_step
        model_flops = tokens_per_s * self.flops_per_token
        per_device = model_flops / self.cfg.n_devices
        mfu = f" | MFU {100 * per_device / self.peak:.1f}%" if self.peak else ""
        eta = (self.cfg.train_steps - step) / steps_per_s if steps_per_s > 0 else math.inf
        self.print(f"{shown} | {steps_per_s:.2f} steps/s | {tokens_per_s:,.0f} tok/s | "
                   f"{per_device / 1e9:.2f} GFLOP/s/device{mfu} | eta {duration(eta)}", flush=True)
        speed = {"tokens_per_sec": tokens_per_s, "model_flops_per_sec": model_flops,
                 "model_flops_per_sec_per_device": per_device}
        if self.peak:
            speed["mfu"] = per_device / self.peak
        self._write(step, values, speed)
        self._last_time, self._last_step = now, step

    @contextlib.contextmanager
    def paused(self):
        """Time spent inside (an evaluation at a checkpoint) is not training: the next line's rate leaves it out.
        The scalars written so far are flushed first, so that TensorBoard shows them during a long evaluation."""
        self.close()
        began = time.time()
        try:
            yield
        finally:
            if self._last_time is not None:
                self._last_time += time.time() - began

    def graph(self, graph: tf.Graph) -> None:
        """The training graph, for TensorBoard's graph view (devices included)."""
        if self.writer is not None:
            self.writer.add_graph(graph)

    def _write(self, step: int, values: dict, speed: dict) -> None:
        if self.writer is not None:
            logged = {k: v for k, v in values.items() if k in LOGGED or k.startswith("grad_norm/")}  # log_grads
            write_scalars(self.writer, step, {**logged, **speed})

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
