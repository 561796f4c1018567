"""data/eval_tasks.py: LAMBADA's examples (split at the last space, contexts cut from the left), the rows one
forward pass scores, the metrics from per-token scores, and the refusals of a bad file or config (the tasks run on
a checkpoint: tests/evals/test_tasks.py)."""
import math

import numpy as np
import pytest

from data import eval_tasks
from data.errors import DataError
from schema import ConfigError
from tiny import tiny_config


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]


def test_last_word_split_truncation_and_metrics():
    examples = eval_tasks.last_word_examples(["one two three", "x yy zzz "], CharTokenizer().encode, n_ctx=8)
    assert examples[0] == ([ord(c) for c in "two"], [ord(c) for c in " three"])  # context cut from the left
    assert examples[1] == ([ord(c) for c in "x yy"], [ord(c) for c in " zzz"])  # trailing space ignored
    tokens, targets, spans = eval_tasks.scoring_rows(examples, n_ctx=8, padding_id=0)
    assert spans == [(2, 8), (3, 7)]
    assert list(targets[0, 2:8]) == [ord(c) for c in " three"] and list(tokens[1, :7]) == [ord(c) for c in "x yy zz"]
    loss = np.zeros([2, 8], np.float32)
    loss[0, 2:8], loss[1, 3:7], loss[1, 0] = 0.5, 0.25, 9.0  # nll 3.0 and 1.0; position 0 is outside the word
    correct = np.ones([2, 8], np.int32)
    correct[1, 5] = 0
    metrics = eval_tasks.last_word_metrics(loss, correct, spans)
    assert metrics == {"lambada_acc": 0.5, "lambada_ppl": pytest.approx(math.exp(2.0)), "lambada_examples": 2}
    with pytest.raises(DataError, match="no context"):
        eval_tasks.last_word_examples(["single"], CharTokenizer().encode, n_ctx=8)


def test_lambada_file_and_config_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a b"}\n{"txt": "c d"}\n')
    with pytest.raises(DataError, match="line 2"):
        eval_tasks.read_lambada(str(bad))
    with pytest.raises(DataError, match="not found"):
        eval_tasks.read_lambada(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="lambada_path"):
        tiny_config(eval_tasks=["lambada"])
    with pytest.raises(ConfigError, match="not known"):
        tiny_config(eval_tasks=["lambda"], lambada_path="x.jsonl")
