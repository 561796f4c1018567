"""evals/job.py, `--eval`'s refusals before anything runs or is written: no checkpoint, a model_path it cannot
write its results in, nothing to evaluate; any one of the dataset's eval_path, eval_tasks or harness_tasks is
something to evaluate. (The evaluations themselves through main.py: tests/evals/test_tasks.py,
tests/evals/test_harness.py.)"""
import os

import pytest

from config import load_config, replace
from evals.job import Checked, check_evaluation
from modelpath.checkpoints import CheckpointError
from permissions import read_only
from schema import ConfigError
from tiny import checkpoint_of_order_one_weights, tiny_config
from workspace import make_workspace


def test_eval_is_refused_without_a_checkpoint_a_writable_model_path_or_anything_to_evaluate(tmp_path):
    """Bugs caught: the checkpoint looked for only when the evaluation starts, the check for something to
    evaluate requiring every kind (`or` for `and`: eval_tasks alone refused) or gone (a run that evaluates
    nothing), the write test gone (a read-only model_path found at the first result, after the evaluation)."""
    bare = tiny_config(model_path=str(tmp_path / "run"))  # no dataset: no eval_path
    with pytest.raises(ConfigError, match=f"^no checkpoint in {tmp_path / 'run'}: train first"):
        check_evaluation(bare)
    os.makedirs(bare.model_path)
    checkpoint_of_order_one_weights(bare, os.path.join(bare.model_path, "model.ckpt-1"))
    with pytest.raises(ConfigError, match="^nothing to evaluate: set eval_path in the dataset config, eval_tasks or "
                                          "harness_tasks in the model config, or pass --harness_tasks$"):
        check_evaluation(bare)
    lambada = replace(bare, eval_tasks=["lambada"], lambada_path=str(tmp_path / "lambada.jsonl"))
    assert check_evaluation(lambada) == Checked(prepared=None)
    with read_only(bare.model_path), pytest.raises(CheckpointError, match="make it writable .*or evaluate a "
                                                                          "writable copy"):
        check_evaluation(lambada)

    cfg = load_config(make_workspace(tmp_path / "workspace"))  # its dataset has an eval_path
    os.makedirs(cfg.model_path)
    checkpoint_of_order_one_weights(cfg, os.path.join(cfg.model_path, "model.ckpt-1"))
    assert not cfg.eval_tasks and not cfg.harness_tasks and check_evaluation(cfg) == Checked(prepared=None)
