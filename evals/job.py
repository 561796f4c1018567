"""`main.py --eval`: the validation loss on the dataset's eval_path, the config's eval tasks and its
lm-evaluation-harness tasks, at model_path's newest checkpoint (evals/validation.py, evals/tasks.py,
evals/harness.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from schema import ConfigError, GPTConfig
from evals import harness
from evals.at_checkpoints import Evaluations
from modelpath import checkpoints
from devices.placement import Placement


@dataclass(frozen=True)
class Checked:
    """What check_evaluation found, for run_evaluation: the harness's tasks, prepared (None without them)."""
    prepared: Optional[harness.Prepared]


def check_evaluation(cfg: GPTConfig, harness_options: Optional[harness.HarnessOptions] = None) -> Checked:
    """--eval's refusals, writing nothing: no checkpoint, a model_path it cannot write its results in, nothing to
    evaluate, harness tasks that are unknown or lack their local data."""
    checkpoints.require_checkpoint(cfg.model_path)
    checkpoints.check_writable(cfg.model_path, "make it writable (evaluation writes model_path/eval and its "
                                               "results file), or evaluate a writable copy")
    if not (cfg.tokenizer_dataset and cfg.tokenizer_dataset.eval_path) and not cfg.eval_tasks and not cfg.harness_tasks:
        raise ConfigError("nothing to evaluate: set eval_path in the dataset config, eval_tasks or harness_tasks in "
                          "the model config, or pass --harness_tasks")
    harness_options = harness_options or harness.HarnessOptions.from_config(cfg)
    return Checked(harness.prepare(harness_options, cfg) if cfg.harness_tasks else None)


def run_evaluation(cfg: GPTConfig, placement: Placement, harness_options: Optional[harness.HarnessOptions] = None,
                   checked: Optional["Checked"] = None) -> int:
    """Evaluates the newest checkpoint that can be read (check_evaluation's refusals first, unless its result is
    given as `checked`). Results are printed, written under model_path/eval and appended to the results file."""
    prepared = (checked or check_evaluation(cfg, harness_options)).prepared
    checkpoint = checkpoints.require_checkpoint(cfg.model_path)
    step = checkpoints.step_of(checkpoint)
    harness_options = harness_options or harness.HarnessOptions.from_config(cfg)
    has_eval_path = bool(cfg.tokenizer_dataset and cfg.tokenizer_dataset.eval_path)
    with Evaluations(cfg, placement, has_eval_path, harness_options, prepared) as evaluations:
        evaluations.evaluate(step, checkpoint)
    return 0
