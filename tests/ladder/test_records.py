"""ladder/records.py: what `plan` and `run` leave for `status` and `fit`, read without TensorFlow: a run's eval
results file and its validation losses, and the plan file."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

from ladder import records


def test_validation_losses_keep_the_last_record_of_each_step_and_skip_what_is_not_one(tmp_path):
    """An eval results file where step 4 was evaluated twice (a run evaluated again after a resume), with a task
    other than validation, a record without a loss and a line cut short: the losses are each step's last
    validation loss. (Bug: the first record of a step kept, `found.setdefault(step, loss)`: a run's stale loss.)"""
    lines = [{"task": "validation", "step": 2, "loss": 6.5}, {"task": "validation", "step": 4, "loss": 6.1},
             {"task": "lambada", "step": 4, "loss": 9.0}, {"task": "validation", "step": 4, "accuracy": 0.1},
             {"task": "validation", "step": 4, "loss": 5.9}]
    path = tmp_path / "eval_results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"task": "validation", "st')
    assert records.validation_losses(str(path)) == {2: 6.5, 4: 5.9}
    assert records.validation_losses(str(tmp_path / "none.jsonl")) == {}


def test_the_results_file_is_the_configs_eval_results_path_else_model_paths_own(tmp_path):
    """A run whose config sets eval_results_path is read there; one whose config does not, or is not written yet,
    in model_path/eval_results.jsonl. (Bug: model_path's file read whatever the config says, so a run evaluated
    elsewhere shows no evaluation and fit has no point for it.)"""
    config = tmp_path / "n6.6K.json"
    config.write_text(json.dumps({"eval_results_path": str(tmp_path / "elsewhere.jsonl")}))
    record = {"config_path": str(config), "model_path": str(tmp_path / "n6.6K")}
    assert records.results_file(record) == str(tmp_path / "elsewhere.jsonl")
    config.write_text(json.dumps({"n_layer": 2}))
    assert records.results_file(record) == os.path.join(str(tmp_path / "n6.6K"), "eval_results.jsonl")
    missing = dict(record, config_path=str(tmp_path / "not_written.json"))
    assert records.results_file(missing) == os.path.join(str(tmp_path / "n6.6K"), "eval_results.jsonl")


def test_a_plan_file_missing_or_cut_short_reads_as_none(tmp_path):
    """OUT/NAME.plan.json read back as written; missing or cut short it is None (status plans afresh, fit says to
    run plan), never a traceback. (Bug: the JSON error let through: `status` of a ladder whose plan was being
    written fails.)"""
    spec = SimpleNamespace(out=str(tmp_path), name="cpu")
    assert records.read_plan(spec) is None
    plan = tmp_path / records.PLAN_FILE.format("cpu")
    plan.write_text(json.dumps({"sizes": [{"name": "n6.6K"}]}))
    assert records.read_plan(spec) == {"sizes": [{"name": "n6.6K"}]}
    plan.write_text('{"sizes": [{"na')
    assert records.read_plan(spec) is None

