"""The evaluations a config asks for at a checkpoint: the validation loss (evals/validation.py), the eval tasks
(evals/tasks.py) and lm-evaluation-harness tasks (evals/harness.py). A training run gives them to its loop as one
callback (execution/callbacks.py's on_checkpoint), run after each steps_per_checkpoint save; `main.py --eval` runs
them once.

They all run the model in one precision, resolved here where the placement is known (devices/precision.py's
`for_inference`): training's (the config training hands them is resolved already, and `--eval` resolves `auto`
the same way on the same device), or float32 with `eval_precision: "float32"`; every result records it.

Each builds its programs at the first checkpoint and keeps them with their sessions open, restored from each
next checkpoint: a run evaluating at every checkpoint builds them once. The weights come from the checkpoint just
written, not from the training session: the same bytes as evaluating it later, restored where each placement keeps
its variables (a TPU's or a cluster's hosts) without a round trip through this process. Each kept program holds one
copy of the weights (no optimizer state) beside training's until the run ends.
"""
from __future__ import annotations

from typing import Optional

from schema import GPTConfig
from data.tokenizer import load_for_config
from evals import harness, tasks, validation
from devices import precision
from devices.placement import Placement
from execution.callbacks import Callback, Run


class Evaluations(Callback):
    """The config's evaluations at checkpoints: `validate` (the validation loss; it needs eval_path), eval_tasks,
    and the harness's tasks when `prepared` (evals/harness.py's checked tasks) is given."""

    def __init__(self, cfg: GPTConfig, placement: Placement, validate: bool,
                 harness_options: Optional[harness.HarnessOptions] = None,
                 prepared: Optional[harness.Prepared] = None):
        cfg = precision.for_inference(cfg, placement)
        self.each = []
        if validate:
            self.each.append(validation.Validation(cfg, placement))
        if cfg.eval_tasks:
            self.each.append(tasks.EvalTasks(cfg, placement, load_for_config(cfg)))
        if prepared:
            self.each.append(harness.Harness(cfg, placement, harness_options, prepared))

    def __bool__(self) -> bool:
        return bool(self.each)

    def evaluate(self, step: int, prefix: str) -> None:
        """Every evaluation of the checkpoint `prefix` (of `step`), results printed and appended."""
        for evaluation in self.each:
            evaluation.on_checkpoint(step, prefix)

    def on_checkpoint(self, run: Run, step: int, prefix: str) -> None:
        self.evaluate(step, prefix)

    def close(self) -> None:
        for evaluation in self.each:
            evaluation.close()

    def __enter__(self) -> "Evaluations":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
