"""What a training run shows while it runs: a progress line every few steps and TensorBoard scalars.

    step    100/600 | loss 6.1182 | lr 1.88e-03 | 2.07 steps/s | 4,246 tok/s | 34.78 GFLOP/s | MFU 21.5% | eta 4m01s

Throughput is measured between printed lines; the first step of a session (graph building, the first run's
compilation) is printed but not timed. Model FLOPs are models/flops.py's per token; MFU divides them by the
peak FLOP/s given (`--peak_tflops`, or the matmul peak measured at start). TensorBoard gets loss,
learning_rate, grad_norm (and moe_loss) every `every` steps with the throughput numbers, in model_path;
evaluation results go to model_path/eval.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import tensorflow.compat.v1 as tf

from config.schema import GPTConfig
from models import flops
from runtime.summaries import write_scalars

LOGGED = ("loss", "learning_rate", "grad_norm", "moe_loss")  # the step's scalars written to TensorBoard
SHOWN = ("moe_loss",)                                        # extra scalars on the progress line


class TrainingLog:
    """Progress lines and TensorBoard scalars for the steps of one training session."""

    def __init__(self, cfg: GPTConfig, every: int, peak_flops: float, writer: Optional[tf.summary.FileWriter],
                 print_fn=print):
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
        mfu = f" | MFU {100 * model_flops / self.peak:.1f}%" if self.peak else ""
        eta = (self.cfg.train_steps - step) / steps_per_s if steps_per_s > 0 else math.inf
        self.print(f"{shown} | {steps_per_s:.2f} steps/s | {tokens_per_s:,.0f} tok/s | "
                   f"{model_flops / 1e9:.2f} GFLOP/s{mfu} | eta {duration(eta)}", flush=True)
        speed = {"tokens_per_sec": tokens_per_s, "model_flops_per_sec": model_flops}
        if self.peak:
            speed["mfu"] = model_flops / self.peak
        self._write(step, values, speed)
        self._last_time, self._last_step = now, step

    def graph(self, graph: tf.Graph) -> None:
        """The training graph, for TensorBoard's graph view (devices included)."""
        if self.writer is not None:
            self.writer.add_graph(graph)

    def _write(self, step: int, values: dict, speed: dict) -> None:
        if self.writer is not None:
            write_scalars(self.writer, step, {**{k: values[k] for k in LOGGED if k in values}, **speed})

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
