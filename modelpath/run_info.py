"""`model_path/run_info.json`: what a training run records when it starts, for the tools that read a model_path
afterwards: the model's shape, tokens per step and model FLOPs per token, the training length and learning rate it
ran with (--train_steps, --lr, --warmup_steps), so that `tools/plot_runs.py` can put a run's loss against training
tokens and compute from the model_path alone, and, per start, the step and the Sacred run (`--sacred_id`, set by
run_experiment.py) that trained it. The training job (train/job.py) says what goes in; this module keeps the file.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

from modelpath import files

RUN_INFO = "run_info.json"


def write(model_path: str, info: dict, start_step: int, sacred_id: Optional[str] = None) -> str:
    """Writes model_path/run_info.json: `info` (the run's description), with the history of earlier starts kept
    and this one added (its step and time, the Sacred run, the train_steps, lr and warmup_steps of `info`);
    returns its path. A damaged one (cut short, not JSON, not an object) never blocks training: it is kept as
    run_info.json.damaged, with a warning, and a new one is written."""
    path = os.path.join(model_path, RUN_INFO)
    previous = read(model_path)
    if previous is None and files.exists(path):
        files.rename(path, path + ".damaged")
        _warn(f"kept it as {path}.damaged; writing a new {RUN_INFO} (the starts it listed are not carried over)")
    previous = previous or {}
    info = dict(info)
    starts = previous.get("starts") if isinstance(previous.get("starts"), list) else []
    info["starts"] = starts + [  # each start with what it trained to and at (a fine-tune's --train_steps, --lr)
        {"step": start_step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "sacred_id": sacred_id,
         **{key: info.get(key) for key in ("train_steps", "lr", "warmup_steps")}}]
    files.makedirs(model_path)
    files.write_atomically(path, json.dumps(info, indent=1))
    return path


def read(model_path: str) -> Optional[dict]:
    """model_path/run_info.json; None when there is none, or (with a warning) when it is damaged."""
    path = os.path.join(model_path, RUN_INFO)
    if not files.exists(path) or files.isdir(path):
        return None
    try:
        with files.open_text(path) as f:
            info = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # empty, cut short, garbage
        _warn(f"{path} is damaged ({type(e).__name__}: {str(e).splitlines()[0][:80]}): ignoring it")
        return None
    if not isinstance(info, dict):
        _warn(f"{path} is damaged (it holds a JSON {type(info).__name__}, not an object): ignoring it")
        return None
    return info


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)
