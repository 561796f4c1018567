"""Evaluation tasks (config key `eval_tasks`, data/eval_tasks.py's registry), run on a checkpoint by `main.py
--eval` and after each checkpoint's eval. Every result, and the validation loss, is appended as one JSON line
with the checkpoint's step to `eval_results_path` (default: model_path/eval_results.jsonl).
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from data.eval_tasks import TASKS
from infer import run
from runtime import checkpoints


def checkpoint_scorer(cfg, placement, checkpoint: str):
    """score(tokens, targets) -> (token_loss, token_correct) at the checkpoint, eval_batch_size rows at a time
    (infer/run.py's predict, so it runs wherever --predict does)."""

    def score(tokens: np.ndarray, targets: np.ndarray):
        out = run.predict(cfg, placement, {"tokens": tokens, "targets": targets}, cfg.eval_batch_size, checkpoint,
                             progress=True)
        return out["token_loss"], out["token_correct"]

    return score


def results_path(cfg) -> str:
    return cfg.eval_results_path or os.path.join(cfg.model_path, "eval_results.jsonl")


def append_result(cfg, record: dict) -> str:
    """Appends one JSON line (with a timestamp) to the results file; returns its path."""
    path = results_path(cfg)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(dict(record, time=round(time.time(), 3))) + "\n")
    return path


def run_eval_tasks(cfg, placement, tokenizer, step: int) -> list[dict]:
    """Runs every task in cfg.eval_tasks on the latest checkpoint, prints and appends the results."""
    score = checkpoint_scorer(cfg, placement, checkpoints.prefix_of(cfg.model_path, step))
    records = []
    for task in cfg.eval_tasks:
        metrics = TASKS[task].run(cfg, score, tokenizer)
        record = {"step": step, "task": task, **metrics}
        path = append_result(cfg, record)
        shown = " | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        print(f"eval task {task} at step {step}: {shown} (appended to {path})", flush=True)
        records.append(record)
    return records
