"""Experiment trackers: callbacks (execution/callbacks.py) that record a training run's scalars where people
look at runs. Each records, at the steps the progress line is printed (train/progress.py's `shown`), the step's
scalars (LOGGED; with `log_grads`, grad_norm/<variable>) and the throughput the line measured.

* `TensorBoard` (always): event files in model_path (`tensorboard --logdir runs/NAME`); the evaluations write
  theirs to model_path/eval (evals/). Sacred (run_experiment.py) copies its metrics from these files.
* `WandB` (config key `wandb_project`): a Weights & Biases run in model_path/wandb, offline by default
  (`wandb_mode: "offline"`: nothing leaves the machine; `wandb sync` uploads it later) or online; the evaluations'
  results of each checkpoint (eval_results.jsonl) are logged beside the training scalars. `wandb` is not in
  requirements.txt: `pip install wandb` where you want it (the job refuses the key without it, before training).
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional

from execution.callbacks import Callback, Run
from modelpath import eval_results, events, run_info
from schema import ConfigError, GPTConfig
from train.progress import Progress

LOGGED = ("loss", "learning_rate", "grad_norm", "moe_loss", "loss_scale")  # the step's scalars the trackers record


def logged(values: dict) -> dict:
    """The scalars of a step's outputs that trackers record."""
    return {k: float(v) for k, v in values.items() if k in LOGGED or k.startswith("grad_norm/")}


class Tracker(Callback):
    """Records a step's scalars and the progress line's throughput, at the steps the line is printed."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def on_step(self, run: Run, step: int, values: dict) -> None:
        shown, speed = self.progress.shown
        if shown == step:
            self.record(step, {**logged(values), **speed})

    def record(self, step: int, scalars: dict) -> None:
        raise NotImplementedError


class TensorBoard(Tracker):
    """TensorBoard event files in model_path; the training graph once per model_path (its first run)."""

    def __init__(self, progress: Progress):
        super().__init__(progress)
        self.writer = None

    def on_open(self, run: Run) -> None:
        self.writer = events.summary_writer(events.folder(run.cfg.model_path))
        if run.start == 0:  # once per model_path: the graph for TensorBoard's graph view (devices included)
            self.writer.add_graph(run.program.graph)

    def record(self, step: int, scalars: dict) -> None:
        events.write_scalars(self.writer, step, scalars)

    def on_checkpoint(self, run: Run, step: int, prefix: str) -> None:
        self.writer.flush()  # what was written shows in TensorBoard during a long evaluation

    def on_end(self, run: Run, step: int) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


WANDB_MODES = ("offline", "online")


def check_wandb(cfg: GPTConfig) -> None:
    """A ConfigError when the config asks for W&B (`wandb_project`) and `wandb` cannot be imported."""
    if not cfg.wandb_project:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError(f"wandb_project is {cfg.wandb_project!r} but the wandb package is not installed: pip install "
                          f"wandb, or remove wandb_project from the config") from None


class WandB(Tracker):
    """A Weights & Biases run in model_path/wandb: the training scalars at the progress line's steps, and each
    checkpoint's evaluation results (under eval/). One W&B run per model_path: a resumed training continues it
    (its id is made from model_path and the time of its first start, which run_info.json keeps)."""

    def __init__(self, progress: Progress, description: dict):
        super().__init__(progress)
        self.description = description
        self.run = None

    def on_open(self, run: Run) -> None:
        import wandb
        cfg = run.cfg
        os.makedirs(cfg.model_path, exist_ok=True)  # W&B writes model_path/wandb
        self.run = wandb.init(project=cfg.wandb_project, dir=cfg.model_path, mode=cfg.wandb_mode,
                              id=run_id(cfg.model_path), resume="allow", name=os.path.basename(
                                  os.path.normpath(cfg.model_path)), config=self.description,
                              settings=wandb.Settings(silent=True, console="off"))

    def record(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)

    def on_checkpoint(self, run: Run, step: int, prefix: str) -> None:
        """The evaluations that ran at this checkpoint (before the trackers: train/job.py orders them so)."""
        where = eval_results.path(run.cfg.model_path, run.cfg.eval_results_path)
        results = {}
        for record in eval_results.read(where):
            if record.get("step") != step:
                continue
            task = record.get("task", "validation")
            results.update({f"eval/{task}/{key}": value for key, value in record.items()
                            if isinstance(value, (int, float)) and not isinstance(value, bool)
                            and key not in ("step", "time")})
        if results:
            self.run.log(results, step=step)

    def on_end(self, run: Run, step: int) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def run_id(model_path: str) -> Optional[str]:
    """The W&B run id of a model_path: stable across its resumed runs, new after --new deletes it."""
    info = run_info.read(model_path) or {}
    starts = info.get("starts") if isinstance(info.get("starts"), list) else []
    first = starts[0].get("time", "") if starts and isinstance(starts[0], dict) else ""
    return hashlib.sha1(f"{os.path.abspath(model_path)}|{first}".encode()).hexdigest()[:16]
