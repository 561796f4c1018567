"""`model_path/eval_results.jsonl` (or the config's `eval_results_path`): every evaluation of a checkpoint, one JSON
line each, appended by the evaluations (evals/: the validation loss, the eval tasks, the harness's tasks) with
the checkpoint's step, the precision the model ran in and the time; read back by the ladder and the tools."""
from __future__ import annotations

import json
import os
import time
from typing import Optional

from modelpath import files

RESULTS = "eval_results.jsonl"


def path(model_path: str, configured: Optional[str] = None) -> str:
    """The results file: `configured` (the config's eval_results_path) when set, else model_path's own."""
    return configured or os.path.join(model_path, RESULTS)


def append(where: str, record: dict) -> str:
    """Appends `record` (stamped with the time) as one JSON line to the results file `where`; returns `where`."""
    folder = os.path.dirname(where)
    if folder:
        files.makedirs(folder)
    with files.open_text(where, "a") as f:
        f.write(json.dumps(dict(record, time=round(time.time(), 3))) + "\n")
    return where


def read(where: str) -> list[dict]:
    """The records of the results file `where`, in the order written; [] when there is none. A line that is not
    a JSON object (one cut short while being written) is skipped."""
    if not files.exists(where):
        return []
    records = []
    with files.open_text(where) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records
