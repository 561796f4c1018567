"""Training behaviour: equivalence across mesh layouts, resume, and what a checkpoint holds."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from tiny import random_tokens, tiny_config, train

LAYOUTS = [
    ("all:1", ""),                          # one device
    ("x:2", "batch:x"),                     # data parallel over 2 devices
    ("x:2,y:2", "batch:x,heads:y"),         # data x model parallel, heads split
    ("x:2,y:2", "batch:x,embd:y"),          # data x model parallel, embedding split
]


def model_weights(model_path):
    checkpoint = tf.train.latest_checkpoint(model_path)
    return {name: tf.train.load_variable(checkpoint, name)
            for name, _ in tf.train.list_variables(checkpoint) if name.startswith("gpt2/") and "adam" not in name}


def test_layouts_give_the_same_losses_and_weights(tmp_path):
    data = random_tokens([16, 17], seed=10)
    results = {}
    for mesh_shape, layout in LAYOUTS:
        cfg = tiny_config(mesh_shape=mesh_shape, layout=layout, train_steps=3, lr=1e-3,
                          model_path=str(tmp_path / f"{mesh_shape}-{layout}".replace(":", "_").replace(",", "_")))
        results[(mesh_shape, layout)] = (train(cfg, data), model_weights(cfg.model_path))
    reference_losses, reference_weights = results[LAYOUTS[0]]
    assert len(reference_losses) == 3
    for key, (losses, weights) in results.items():
        np.testing.assert_allclose(losses, reference_losses, atol=1e-5, err_msg=str(key))
        assert weights.keys() == reference_weights.keys()
        for name, value in weights.items():
            # Split layouts sum in another order; Adam divides by sqrt(v), so for near-zero gradients that
            # rounding can move a weight by up to ~lr per step. 2e-5 bounds that at lr 1e-3 over 3 steps.
            np.testing.assert_allclose(value, reference_weights[name], atol=2e-5, rtol=0, err_msg=f"{key} {name}")
    # The weights moved (so equal weights mean equal updates, not untouched initial values).
    assert reference_losses[0] != reference_losses[-1]


def expected_variables(cfg):
    names = {"gpt2/wte", "gpt2/wpe", "gpt2/ln_f/g", "gpt2/ln_f/b"}
    for i in range(cfg.n_layer):
        names |= {f"gpt2/h{i}/{n}" for n in (
            "norm_1/g", "norm_1/b", "norm_2/g", "norm_2/b", "attn/q", "attn/k", "attn/v", "attn/o",
            "attn/compute_output_bias/o_b", "mlp/conv1d_main/c_fc/kernel", "mlp/conv1d_main/c_fc/bias",
            "mlp/conv1d_main/c_proj/kernel", "mlp/conv1d_main/c_proj/bias")}
    return names


def test_checkpoint_holds_gpt_neo_variables_with_their_shapes(tmp_path):
    cfg = tiny_config(model_path=str(tmp_path / "run"), train_steps=1)
    train(cfg, random_tokens([8, 17]))
    shapes = dict(tf.train.list_variables(tf.train.latest_checkpoint(cfg.model_path)))
    model_vars = {n for n in shapes if n.startswith("gpt2/") and "adam" not in n}
    assert model_vars == expected_variables(cfg)
    d = cfg.n_embd
    assert shapes["gpt2/wte"] == [cfg.n_vocab, d] and shapes["gpt2/wpe"] == [cfg.n_ctx, d]
    assert shapes["gpt2/h0/attn/q"] == [d, d] and shapes["gpt2/h1/attn/o"] == [d, d]
    assert shapes["gpt2/h0/mlp/conv1d_main/c_fc/kernel"] == [d, 4 * d]
    assert shapes["gpt2/h0/mlp/conv1d_main/c_proj/kernel"] == [4 * d, d]
    assert shapes["global_step"] == []
    # Adam's slots exist for every trainable variable (so resume restores optimizer state too).
    assert {n[:-len("/adam_m")] for n in shapes if n.endswith("/adam_m")} == expected_variables(cfg)


def test_resume_continues_step_count_and_loss_curve(tmp_path):
    data = random_tokens([40, 17], seed=11)
    straight = tiny_config(model_path=str(tmp_path / "straight"), train_steps=6, steps_per_checkpoint=3)
    straight_losses = train(straight, data)

    resumed = straight.replace(model_path=str(tmp_path / "resumed"))
    first = train(resumed, data, steps=3, start_step=0)
    assert int(tf.train.load_variable(tf.train.latest_checkpoint(resumed.model_path), "global_step")) == 3
    second = train(resumed, data, steps=6, start_step=3)  # a new estimator: restores weights and Adam state
    assert int(tf.train.load_variable(tf.train.latest_checkpoint(resumed.model_path), "global_step")) == 6
    assert len(first) == 3 and len(second) == 3
    np.testing.assert_allclose(first + second, straight_losses, atol=1e-5)


def test_training_reduces_loss_on_learnable_data(tmp_path):
    # A repeating sequence is learnable in a few steps; random tokens are not.
    pattern = np.tile(np.arange(8), 40)[:17 * 8].reshape(8, 17).astype(np.int32)
    cfg = tiny_config(model_path=str(tmp_path / "run"), train_steps=20, lr=1e-2)
    losses = train(cfg, pattern)
    assert np.mean(losses[-3:]) < 0.6 * np.mean(losses[:3])
