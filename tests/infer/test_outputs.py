"""infer/outputs.py, the PREDICT graph's scoring and logits: per-position cross-entropy and argmax hits are the
logits' own, and a row shorter than n_ctx (the harness scores short requests so) gets the outputs of the first
positions of a full row. (Sampling: tests/models/test_sampling.py.)"""
import os

import numpy as np

from tiny import checkpoint_of_order_one_weights, devices_for, random_tokens, run_predict, tiny_config


def test_scores_are_the_logits_cross_entropy_and_argmax_and_a_short_row_is_a_full_rows_start(tmp_path):
    """Weights of order one (logits far apart), half the targets the argmax.
    Bugs caught: `token_correct` comparing the argmax with the tokens instead of the targets, a short row's
    graph built for n_ctx (`gpt.Dims.of` without the rows' length: a shape error)."""
    cfg = tiny_config()
    checkpoint = checkpoint_of_order_one_weights(cfg, os.path.join(tmp_path, "model.ckpt-1"))
    devices = devices_for(cfg)
    tokens = random_tokens([4, cfg.n_ctx], seed=1)
    logits = run_predict(cfg, {"tokens": tokens}, devices, checkpoint)["logits"].astype(np.float64)
    # every other target the model's argmax, the others random: hits and misses both
    targets = np.where(np.arange(cfg.n_ctx) % 2 == 0, logits.argmax(-1), random_tokens([4, cfg.n_ctx], seed=2))
    targets = targets.astype(np.int32)
    scores = run_predict(cfg, {"tokens": tokens, "targets": targets}, devices, checkpoint)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    np.testing.assert_allclose(scores["token_loss"], -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0],
                               rtol=1e-5, atol=1e-5)
    hits = logits.argmax(-1) == targets
    np.testing.assert_array_equal(scores["token_correct"], hits.astype(np.int32))
    assert 0 < hits.sum() < hits.size and (logits.argmax(-1) != tokens).any()

    half = cfg.n_ctx // 2
    short = run_predict(cfg, {"tokens": tokens[:, :half], "targets": targets[:, :half]}, devices, checkpoint)
    assert short["token_loss"].shape == (4, half)
    np.testing.assert_allclose(short["token_loss"], scores["token_loss"][:, :half], rtol=1e-5, atol=1e-5)
    short_logits = run_predict(cfg, {"tokens": tokens[:, :half]}, devices, checkpoint)["logits"]
    np.testing.assert_allclose(short_logits, logits[:, :half], rtol=1e-5, atol=1e-5)
