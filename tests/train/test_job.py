"""train/job.py: the training job's own decisions (which checkpoint to start from, and a run with nothing left to
train). Its checks before --new deletes anything, and their result handed to the run, are jobs.py's
(tests/test_jobs.py); its runs through main.py are the scenarios'."""
import pytest
import tensorflow.compat.v1 as tf

from config import load_config
from modelpath.checkpoints import CheckpointError
from tests.scenarios.test_bad_inputs import write_config
from tiny import placement_for, random_tokens, train
from train.job import run_training


def test_a_checkpoint_of_another_shape_is_refused_when_nothing_is_left_to_train(tmp_path):
    """A checkpoint of another model is refused when train_steps is already reached, as it is when steps are left
    (train/loop.py); the same config with nothing left to train returns its step. Bug caught: that branch of
    run_training without its `check_fits` (another model's model_path reported as trained to the end)."""
    trained = load_config(write_config(tmp_path))
    train(trained, random_tokens([4, trained.n_ctx + 1], vocab=trained.n_vocab))
    assert tf.train.latest_checkpoint(trained.model_path).endswith("model.ckpt-1")
    wider = load_config(write_config(tmp_path, "wider", n_embd=64))
    with pytest.raises(CheckpointError, match="is another model than the config's"):
        run_training(wider, placement_for(wider))
    assert run_training(trained, placement_for(trained)) == 1  # the same config: nothing to train, no error
