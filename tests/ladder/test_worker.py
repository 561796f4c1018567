"""ladder/worker.py: one process runs main.py's `main` for run after run (ladder/run.py's `Worker`), and nothing of
one run reaches the next: each trains its own model_path from its own step, logs its own steps, takes and leaves
its own lock."""
from __future__ import annotations

import json
import os
import re

import pytest

from workspace import make_workspace

from ladder import run as ladder_run
from modelpath import checkpoints, events
from modelpath.lock import LOCK


def _config(base: str, name: str, **changes) -> tuple[str, str]:
    """A copy of the workspace's tiny config as NAME.json beside it, training into its own model_path NAME."""
    with open(base) as f:
        cfg = json.load(f)
    cfg.update(changes, model_path=os.path.join(os.path.dirname(os.path.dirname(base)), name))
    path = os.path.join(os.path.dirname(base), f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path, cfg["model_path"]


def _losses(model_path: str) -> list:
    return events.read_scalars(events.folder(model_path))["loss"]


@pytest.mark.slow
def test_runs_in_one_worker_keep_their_own_state(tmp_path):
    """In one worker: a config that is not there is refused in main.py's one error line, exit code 1; then b trains, then a (another shape, another model_path), then a again to a later step. Each run
    trains and logs its own steps from its own start and leaves no lock; a's second run resumes it (its lock was
    released though the worker that held it lives on); the worker ends with the `with`. (Bug: train/job.run_training
    taking the TrainerLock without releasing it, `TrainerLock(...).acquire()`: b's lock is left held by the live
    worker, and a's second run is refused.)"""
    base = make_workspace(tmp_path, train_steps=3, steps_per_checkpoint=3)
    b, b_path = _config(base, "b")
    a, a_path = _config(base, "a", n_embd=16, n_head=2, lr=1e-3, train_steps=2, steps_per_checkpoint=1)
    runs = [(b, b_path, [], 0, 3), (a, a_path, [], 0, 2), (a, a_path, ["--train_steps", "3"], 2, 3)]
    with ladder_run.Worker() as worker:
        lines = list(worker.run(["--model", os.path.join(str(tmp_path), "missing.json")]))  # main.py's refusal
        # the worker's first run loads TensorFlow, and says so before main.py's one error line
        assert worker.code == 1 and lines[:-1] == ["loading TensorFlow ..."] and lines[-1].startswith("error: "), lines
        for config, model_path, flags, start, end in runs:
            lines = list(worker.run(["--model", config, "--log_every", "1", *flags]))
            text = "\n".join(lines)
            assert worker.code == 0, text[-3000:]
            assert re.search(rf"^training .* steps {start} -> {end}, .* in {re.escape(model_path)}$", text, re.M), text
            assert checkpoints.steps(model_path)[-1] == end
            assert [step for step, _ in _losses(model_path)] == list(range(1, end + 1))
            for folder in (a_path, b_path):  # no run holds a lock once it has ended
                assert not os.path.exists(os.path.join(folder, LOCK)), folder
        pid = worker.process.pid
    with pytest.raises(ProcessLookupError):  # the worker ended with the ladder's `with`
        os.kill(pid, 0)
