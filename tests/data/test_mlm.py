"""Masked language modelling: the masking of input batches (data/mlm.py) and the loss on masked positions."""
import numpy as np
import pytest
import tensorflow as tf

from data.mlm import mask_dataset, mask_tokens, unmaskable_ids
from schema import ConfigError
from config import replace
from tiny import compute_logits, compute_losses, devices_for, random_tokens, tiny_config

PAD, MASK, CLS, SEP = 0, 63, 61, 62


def mlm_config(**changes):
    values = dict(mlm_training=True, mlm_mask_id=MASK, padding_id=PAD, mlm_mask_ignore_ids=[SEP], n_ctx=16,
                  attention_types=[[["global"], 2]])
    values.update(changes)
    return tiny_config(**values)


def masked(cfg, tokens, step):
    inputs, labels = mask_tokens(tf.constant(tokens), cfg, step)
    return inputs.numpy(), labels.numpy()


def test_masking_follows_the_probabilities_and_never_touches_special_tokens():
    cfg = mlm_config(mlm_mask_prob=0.3, mlm_same_token_prob=0.2, mlm_random_token_prob=0.2)
    tokens = random_tokens([400, cfg.n_ctx], seed=5)
    tokens[:, ::7] = SEP   # an ignored id
    tokens[:, 3] = PAD     # padding
    inputs, labels = masked(cfg, tokens, step=3)

    chosen = labels != PAD
    special = np.isin(tokens, unmaskable_ids(cfg))
    assert not np.any(chosen & special)                          # padding and ignored ids are never chosen
    np.testing.assert_array_equal(labels[chosen], tokens[chosen])  # labels: the original tokens where chosen
    np.testing.assert_array_equal(inputs[~chosen], tokens[~chosen])  # everything else is left alone
    assert abs(chosen.sum() / (~special).sum() - 0.3) < 0.02
    became_mask = chosen & (inputs == MASK)
    kept = chosen & (inputs == tokens)
    randomised = chosen & ~became_mask & ~kept
    assert abs(became_mask.sum() / chosen.sum() - 0.6) < 0.04
    # A random replacement can draw the original token, so "kept" gathers a little of the random share.
    assert abs(kept.sum() / chosen.sum() - (0.2 + 0.2 / 61)) < 0.04  # 61 ids may be drawn
    assert abs(randomised.sum() / chosen.sum() - 0.2 * 60 / 61) < 0.04
    assert not np.isin(inputs[randomised], unmaskable_ids(cfg) + [MASK]).any()


def test_masking_is_a_function_of_seed_and_step():
    cfg = mlm_config()
    tokens = random_tokens([8, cfg.n_ctx], seed=6)
    first, again = masked(cfg, tokens, 7), masked(cfg, tokens, 7)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert np.any(first[1] != masked(cfg, tokens, 8)[1])
    assert np.any(first[1] != masked(replace(cfg, seed=99), tokens, 7)[1])


def test_cls_token_is_prepended_and_never_masked():
    cfg = mlm_config(mlm_cls_token_id=CLS, mlm_mask_prob=0.5)
    window = random_tokens([32, cfg.n_ctx + 1], seed=7, vocab=60)  # an LM pipeline's n_ctx + 1 window
    inputs, labels = masked(cfg, window, 0)
    assert inputs.shape == labels.shape == (32, cfg.n_ctx)
    assert np.all(inputs[:, 0] == CLS) and np.all(labels[:, 0] == PAD)
    unchanged = labels[:, 1:] == PAD
    np.testing.assert_array_equal(inputs[:, 1:][unchanged], window[:, :cfg.n_ctx - 1][unchanged])


def test_mask_dataset_numbers_batches_from_the_step_it_starts_at():
    cfg = mlm_config()
    rows = random_tokens([6 * 4, cfg.n_ctx + 1], seed=8)
    batches = tf.data.Dataset.from_tensor_slices((rows[:, :-1], rows[:, 1:])).batch(4)
    whole = list(mask_dataset(batches, cfg))
    resumed = list(mask_dataset(batches.skip(2), cfg, first_step=2))
    for (a_in, a_lab), (b_in, b_lab) in zip(whole[2:], resumed):
        np.testing.assert_array_equal(a_in.numpy(), b_in.numpy())
        np.testing.assert_array_equal(a_lab.numpy(), b_lab.numpy())
    assert mask_dataset(batches, tiny_config()) is batches  # language modelling: untouched


def test_mask_dataset_traces_its_masking_without_autograph(autograph_conversions):
    """The masking mask_dataset hands tf.data is traced as written, as data/inputs.py's pipeline functions are
    (tests/data/test_inputs.py). (Bug: `.map(mask)` without `do_not_convert`: AutoGraph rewrites it and
    mask_tokens first.)"""
    cfg = mlm_config(mlm_cls_token_id=CLS)
    rows = random_tokens([4, cfg.n_ctx + 1], seed=8)
    batches = tf.data.Dataset.from_tensor_slices((rows[:, :-1], rows[:, 1:])).batch(4)
    assert len(list(mask_dataset(batches, cfg, first_step=3))) == 1
    assert autograph_conversions == []


def test_mlm_loss_is_the_mean_cross_entropy_over_masked_positions_only():
    cfg = mlm_config(z_loss=0.0)
    inputs, labels = masked(cfg, random_tokens([4, cfg.n_ctx], seed=9, vocab=60), 1)
    logits = compute_logits(cfg, inputs, devices_for(cfg)).astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    chosen = labels != PAD
    expected = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0][chosen].mean()
    assert chosen.sum() > 0
    np.testing.assert_allclose(compute_losses(cfg, inputs, labels, devices_for(cfg), train=False)["loss"],
                               expected, rtol=1e-5)


@pytest.mark.parametrize("changes, message", [
    (dict(mlm_mask_id=None), "needs mlm_mask_id"),
    (dict(padding_id=None), "set padding_id"),
    (dict(mlm_mask_id=PAD), "reserve another id"),
    (dict(mlm_mask_id=64), "below n_vocab"),
    (dict(mlm_mask_prob=0.0), "set it > 0"),
    (dict(mlm_same_token_prob=0.6, mlm_random_token_prob=0.6), "exceeds 1"),
    (dict(mlm_random_token_prob=1.5), "probability"),
    (dict(mlm_training=False), "mlm_training is false"),
])
def test_invalid_mlm_configs_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError) as info:
        mlm_config(**changes)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_mlm_trains_and_evaluates_through_main_and_refuses_to_sample(tmp_path):
    """The command line's input pipeline masks its batches (train and eval); sampling is refused."""
    from workspace import make_workspace, run_main_in_process

    config = make_workspace(tmp_path, mlm_training=True, mlm_mask_id=2, mlm_cls_token_id=3, mlm_mask_ignore_ids=[0],
                            eval_steps=2)
    trained = run_main_in_process("--model", config)
    assert trained.returncode == 0, trained.stderr[-2000:]
    eval_line = [line for line in trained.stdout.splitlines() if line.startswith("eval at step 2")]
    assert eval_line, trained.stdout[-2000:]
    # Two steps in, the loss on masked tokens is still about that of a uniform guess over the vocabulary.
    assert 0.5 * np.log(4096) < float(eval_line[0].split("loss ")[1].split()[0]) < 1.5 * np.log(4096)
    sampled = run_main_in_process("--model", config, "--predict")
    assert sampled.returncode != 0 and "masked language model" in sampled.stderr
    assert len(sampled.stderr.strip().splitlines()) == 1, sampled.stderr
