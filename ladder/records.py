"""What `plan` and `run` leave for the ladder's other commands, read without TensorFlow: OUT/SPEC_NAME.plan.json
(every run's numbers, as SizePlan.record() gives them, and the FLOPs per token of the size rule's shapes) and each
run's eval results file. `fit` reads nothing else, so it runs where TensorFlow is not installed."""
from __future__ import annotations

import json
import os
from typing import Optional

PFLOP_DAY = 1e15 * 86400
PLAN_FILE = "{}.plan.json"        # OUT/SPEC_NAME.plan.json: the table's numbers, for status and fit (specs may share OUT)


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def read_plan(spec) -> Optional[dict]:
    path = os.path.join(spec.out, PLAN_FILE.format(spec.name))
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError:
        return None


def results_file(record: dict) -> str:
    """The run's eval results file: its config's eval_results_path, else model_path/eval_results.jsonl."""
    try:
        with open(record["config_path"], encoding="utf-8") as f:
            configured = json.load(f).get("eval_results_path")
    except (OSError, ValueError):
        configured = None
    return configured or os.path.join(record["model_path"], "eval_results.jsonl")


def validation_losses(path: str) -> dict:
    """step -> validation loss from an eval results file (the last record of a step wins; torn lines skipped)."""
    found = {}
    if not os.path.isfile(path):
        return found
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("task") == "validation" and "loss" in record:
                found[int(record["step"])] = float(record["loss"])
    return found
