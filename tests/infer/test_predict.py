"""infer/predict.py, `--predict`'s own work without a model: prompts made into rows (the last tokens of a long
one, the end-of-text token for an empty one, a seed a sample), and a row's output made into its completion (cut
before the stop token). (The prompt files' refusals and each run's own output files: tests/scenarios/
test_bad_inputs.py; sampling through main.py: tests/scenarios/test_predict_export.py.)"""
import numpy as np
import pytest

from infer.predict import build_rows, completion, run_rows
from models.sampling import SamplingOptions
from tiny import tiny_config


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]


def test_rows_keep_a_long_prompts_last_tokens_start_an_empty_one_at_eos_and_seed_each_sample(capsys):
    """Every prompt gets num_samples rows in prompt order; a prompt longer than n_ctx - 1 keeps its last tokens
    (room for one new token) and says so once; an empty prompt starts at the end-of-text token; every row has its
    own seed, the same for the same run seed.
    Bugs caught: a long prompt keeping its first tokens (`ids[:n_ctx - 1]`), an empty prompt left with no token
    (`or [start_id]` gone: a row of length 0), one seed for every row."""
    cfg = tiny_config(eos_id=0, padding_id=1)
    long, prompts = "abcdefghijklmnopqrst", ["abcdefghijklmnopqrst", "", "xyz"]
    rows = build_rows(cfg, CharTokenizer(), prompts, 2, seed=7)
    kept = [ord(c) for c in long[-(cfg.n_ctx - 1):]]
    assert rows.prompt_index == [0, 0, 1, 1, 2, 2]
    assert rows.prompt_ids == [kept, kept, [0], [0], [120, 121, 122], [120, 121, 122]]
    assert rows.prompt_length.tolist() == [15, 15, 1, 1, 3, 3]
    for row, ids in zip(rows.tokens, rows.prompt_ids):
        assert row.tolist() == ids + [1] * (cfg.n_ctx - len(ids))
    assert capsys.readouterr().out == f"warning: a prompt of {len(long)} tokens keeps its last 15 (n_ctx is 16)\n"
    assert len(set(rows.seed.tolist())) == 6
    np.testing.assert_array_equal(build_rows(cfg, CharTokenizer(), prompts, 2, seed=7).seed, rows.seed)
    assert not set(build_rows(cfg, CharTokenizer(), prompts, 2, seed=8).seed.tolist()) & set(rows.seed.tolist())


def test_the_rows_are_sampled_with_the_prefill_over_the_longest_prompts_bucket(monkeypatch):
    """--predict's sampling options are the config's with the kv cache's prefill over the smallest power of two
    that holds the longest prompt (here 5 of n_ctx 16 -> 8), not all n_ctx positions.
    Bugs caught: the bucket of the first or shortest row (`prompt_length[0]`: 3 -> 4), options left None."""
    from infer import run
    cfg = tiny_config(eos_id=0, padding_id=1)
    rows = build_rows(cfg, CharTokenizer(), ["abc", "abcde", "a"], 1, seed=7)
    seen = []
    monkeypatch.setattr(run, "predict", lambda cfg, placement, features, batch_size, checkpoint, options=None,
                        **kwargs: seen.append(options) or {})
    run_rows(cfg, None, rows, "model.ckpt-1")
    assert seen == [SamplingOptions.from_config(cfg, prefill_length=8)]


@pytest.mark.parametrize("remove_partial_sequences", [False, True])
def test_a_completion_is_the_new_tokens_cut_before_the_stop_token(remove_partial_sequences):
    """The new tokens of an output row (after the prompt, or from the row's start where the graph removed the
    prompt), the stop token (eos here, or stop_token) left out and reported as `stopped`; stop_token -1 stops at
    nothing; a row with no new token is empty.
    Bugs caught: the stop token kept in the completion, the prompt's tokens counted as new."""
    prompt, new = [40, 41, 42], [50, 51]
    for stop_token, stop in ((None, 5), (9, 9), (-1, None)):
        cfg = tiny_config(eos_id=5, stop_token=stop_token, remove_partial_sequences=remove_partial_sequences)
        start = 0 if remove_partial_sequences else len(prompt)
        ended = ([] if remove_partial_sequences else prompt) + new + [5 if stop is None else stop, 1, 1]
        length = start + len(new) + 1
        assert completion(cfg, len(prompt), np.array(ended), length) == (
            (new, True) if stop is not None else (new + [5], False))
        assert completion(cfg, len(prompt), np.array(ended), length - 1) == (new, False)  # max_new_tokens reached
        assert completion(cfg, len(prompt), np.array(ended), start) == ([], False)
