"""Evaluation tasks (config key `eval_tasks`, data/eval_tasks.py's registry), run on a checkpoint by `main.py
--eval` and after each checkpoint's eval. Every result, and the validation loss, is appended as one JSON line
with the checkpoint's step and the precision the model ran in to `eval_results_path` (default:
model_path/eval_results.jsonl).
"""
from __future__ import annotations

import numpy as np

from data.eval_tasks import TASKS
from infer import run
from modelpath import checkpoints, eval_results
from devices import precision


def scorer(cfg, predictor: run.Predictor):
    """score(tokens, targets) -> (token_loss, token_correct) at the predictor's checkpoint, eval_batch_size rows at
    a time (infer/run.py's predictions, so it runs wherever --predict does)."""

    def score(tokens: np.ndarray, targets: np.ndarray):
        out = predictor.predict({"tokens": tokens, "targets": targets}, cfg.eval_batch_size, progress=True)
        return out["token_loss"], out["token_correct"]

    return score


def append_result(cfg, record: dict) -> str:
    """Appends `record` to the config's results file (modelpath/eval_results.py), with the precision the model of
    `cfg` ran in; returns the file's path."""
    where = eval_results.path(cfg.model_path, cfg.eval_results_path)
    return eval_results.append(where, dict(record, precision=precision.running(cfg)))


class EvalTasks:
    """Every task in cfg.eval_tasks at checkpoints: printed and appended to the results file. The scoring programs
    are built at the first checkpoint and kept, restored at each next one (a training run's evaluations)."""

    def __init__(self, cfg, placement, tokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.predictor = run.Predictor(cfg, placement)

    def on_checkpoint(self, step: int, prefix: str) -> list[dict]:
        self.predictor.restore(prefix)
        score = scorer(self.cfg, self.predictor)
        records = []
        for task in self.cfg.eval_tasks:
            metrics = TASKS[task].run(self.cfg, score, self.tokenizer)
            record = {"step": step, "task": task, **metrics}
            path = append_result(self.cfg, record)
            shown = " | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
            print(f"eval task {task} at step {step}: {shown} ({precision.running(self.cfg)}; appended to {path})",
                  flush=True)
            records.append(record)
        return records

    def close(self) -> None:
        self.predictor.close()

    def __enter__(self) -> "EvalTasks":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_eval_tasks(cfg, placement, tokenizer, step: int) -> list[dict]:
    """Runs every task in cfg.eval_tasks on model_path's checkpoint at `step`, prints and appends the results."""
    with EvalTasks(cfg, placement, tokenizer) as eval_tasks:
        return eval_tasks.on_checkpoint(step, checkpoints.prefix_of(cfg.model_path, step))
