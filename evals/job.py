"""`main.py --eval`: the validation loss on the dataset's eval_path and the config's eval tasks, at model_path's
newest checkpoint (evals/validation.py, evals/tasks.py)."""
from __future__ import annotations

from config.schema import ConfigError, GPTConfig
from data.tokenizer import load_for_config
from evals import tasks, validation
from runtime import checkpoints
from runtime.devices import Placement


def run_evaluation(cfg: GPTConfig, placement: Placement) -> int:
    """Evaluates the newest checkpoint that can be read; an error when there is none or nothing to evaluate.
    Results are printed, written under model_path/eval and appended to the results file."""
    step = checkpoints.step_of(checkpoints.require_checkpoint(cfg.model_path))
    checkpoints.check_writable(cfg.model_path, "make it writable (evaluation writes model_path/eval and its "
                                               "results file), or evaluate a writable copy")
    has_eval_path = bool(cfg.tokenizer_dataset and cfg.tokenizer_dataset.eval_path)
    if not has_eval_path and not cfg.eval_tasks:
        raise ConfigError("nothing to evaluate: set eval_path in the dataset config or eval_tasks in the model config")
    if has_eval_path:
        validation.report(cfg, placement)
    if cfg.eval_tasks:
        tasks.run_eval_tasks(cfg, placement, load_for_config(cfg), step)
    return 0
