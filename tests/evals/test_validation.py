"""evals/validation.py without a graph: bits per byte (the loss in bits over the bytes the evaluated tokens spell),
those bytes counted from the labels' decoded text, and how many batches a validation reads. (The loss against
logits computed on their own, through --eval: tests/evals/test_tasks.py; its program kept across a run's
checkpoints: tests/train/test_loop.py.)"""
import glob
import math

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from config import load_config, replace
from conftest import CPU_DEVICES
from devices.placement import Placement
from evals import validation
from schema import ConfigError
from tests.data.test_create_tfrecords import read_records
from tiny import tiny_config
from workspace import make_workspace


def test_bits_per_byte_is_the_loss_in_bits_over_the_bytes_whatever_a_token_spans():
    """A model uniform over byte strings spends 8 bits a byte, whether its tokens are one byte each (a loss of
    ln 256 a token, 100 tokens spelling 100 bytes) or four (ln 256^4 a token, 25 tokens spelling the same 100).
    Bugs caught: the loss left in nats (no `math.log(2)`), tokens and bytes swapped."""
    assert validation.bits_per_byte(math.log(256), 100, 100) == pytest.approx(8.0)
    assert validation.bits_per_byte(math.log(256 ** 4), 25, 100) == pytest.approx(8.0)


def test_the_bytes_are_those_the_labels_of_the_evaluated_batches_spell():
    """Each label row decoded whole (special tokens are the decoder's to leave out: id 0 here), its UTF-8 bytes
    counted, over the first `steps` batches only.
    Bug caught: characters counted instead of bytes ("é" is two)."""
    text = {0: "", 1: "a", 2: "é"}
    labels = np.array([[[1, 2, 0], [2, 2, 2]],    # "aé" 3 bytes, "ééé" 6
                       [[1, 1, 1], [0, 0, 2]],    # "aaa" 3, "é" 2
                       [[2, 2, 2], [2, 2, 2]]],   # not evaluated
                      np.int32)
    counted = validation.evaluated_bytes(lambda: tf.data.Dataset.from_tensor_slices((labels, labels)), 2,
                                         lambda ids: "".join(text[i] for i in ids))
    assert counted == 3 + 6 + 3 + 2


def test_a_validation_reads_eval_steps_batches_and_no_more_than_the_eval_data_holds(tmp_path):
    """eval_steps 0 reads every whole batch of the eval data (its tokens cut into windows of n_ctx + 1, then into
    batches), a smaller eval_steps that many, a larger one only those there are; without eval_path, one error.
    Bug caught: the `min` with what the data holds dropped (a validation asking for batches that are not there)."""
    cfg = load_config(make_workspace(tmp_path))
    tokens = sum(len(record) for path in glob.glob(str(tmp_path / "eval" / "*.tfrecords"))
                 for record in read_records(path))
    whole = tokens // (cfg.n_ctx + 1) // cfg.eval_batch_size
    assert whole > 1
    placement = Placement(devices=tuple(CPU_DEVICES[:1]))
    for eval_steps, steps in ((0, whole), (1, 1), (whole + 5, whole)):
        assert validation.Validation(replace(cfg, eval_steps=eval_steps), placement).steps == steps
    with pytest.raises(ConfigError, match="no eval_path: set it in the dataset config to evaluate"):
        validation.Validation(tiny_config(), placement)
