"""`main.py --eval`: the validation loss on the dataset's eval_path, the config's eval tasks and its
lm-evaluation-harness tasks, at model_path's newest checkpoint (evals/validation.py, evals/tasks.py,
evals/harness.py)."""
from __future__ import annotations

from typing import Optional

from schema import ConfigError, GPTConfig
from evals import harness
from evals.at_checkpoints import Evaluations
from modelpath import checkpoints
from devices.placement import Placement


def run_evaluation(cfg: GPTConfig, placement: Placement, harness_options: Optional[harness.HarnessOptions] = None) -> int:
    """Evaluates the newest checkpoint that can be read; an error when there is none or nothing to evaluate.
    Results are printed, written under model_path/eval and appended to the results file. The harness's tasks
    (evals/harness.py) are checked first, before anything runs."""
    checkpoint = checkpoints.require_checkpoint(cfg.model_path)
    step = checkpoints.step_of(checkpoint)
    checkpoints.check_writable(cfg.model_path, "make it writable (evaluation writes model_path/eval and its "
                                               "results file), or evaluate a writable copy")
    has_eval_path = bool(cfg.tokenizer_dataset and cfg.tokenizer_dataset.eval_path)
    if not has_eval_path and not cfg.eval_tasks and not cfg.harness_tasks:
        raise ConfigError("nothing to evaluate: set eval_path in the dataset config, eval_tasks or harness_tasks in "
                          "the model config, or pass --harness_tasks")
    harness_options = harness_options or harness.HarnessOptions.from_config(cfg)
    prepared = harness.prepare(harness_options, cfg) if cfg.harness_tasks else None
    with Evaluations(cfg, placement, has_eval_path, harness_options, prepared) as evaluations:
        evaluations.evaluate(step, checkpoint)
    return 0
