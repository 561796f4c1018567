"""Training-side options: bfloat16, recompute_grad, z_loss, all options together on a 2x2 mesh, the runner's path
(MoE loss logged, MLM input masking, Adafactor), sampling, and invalid combinations. Micro-batching's step is
train/objective.py's (tests/train/test_objective.py, with this file's helpers)."""
import glob

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from data.mlm import mask_dataset, mask_tokens
from modelpath import checkpoints
from evals import validation
from train import loop
from train.progress import Progress
from train.trackers import TensorBoard
from schema import ConfigError
from config import replace
from tiny import (compute_logits, compute_losses, devices_for, fixed_batches, placement_for,
                  random_tokens, run_predict, run_training, tiny_config)

MOE = dict(moe_layers=[1], moe_params={"moe_num_experts": 4})
MLM = dict(mlm_training=True, mlm_mask_id=63, padding_id=0)


def lm_batch(cfg, seed=0):
    window = random_tokens([cfg.train_batch_size, cfg.n_ctx + 1], seed=seed)
    return window[:, :-1], window[:, 1:]


def mlm_batch(cfg, seed=0):
    window = random_tokens([cfg.train_batch_size, cfg.n_ctx], seed=seed, vocab=60)
    return tuple(t.numpy() for t in mask_tokens(tf.constant(window), cfg, 0))


# Adam's first step with beta1 0 and an epsilon far above every gradient moves each weight by
# lr * g / (sqrt(1 - beta2) |g| + epsilon): about -g at lr 1 (within 0.03 |g|). Without clipping or decay, the weights
# after that step hold the step's gradients, so that comparing them compares the gradients themselves.
GRADIENT_STEP = dict(beta1=0.0, epsilon=1.0, lr=1.0, weight_decay=0.0, gradient_clipping=0.0, log_grads=True)


def assert_same_step(a, b, atol):
    """Two one-step runs of GRADIENT_STEP took the same step: losses, objective, which variables had a gradient,
    each one's norm, and every weight after the step (the gradient, see GRADIENT_STEP)."""
    np.testing.assert_allclose(b.losses, a.losses, rtol=0, atol=atol)
    np.testing.assert_allclose(b.objectives, a.objectives, rtol=0, atol=atol)
    assert a.gradient_norms.keys() == b.gradient_norms.keys() == a.weights.keys() == b.weights.keys()
    for name in a.weights:
        np.testing.assert_allclose(b.gradient_norms[name], a.gradient_norms[name], rtol=1e-5, atol=atol, err_msg=name)
        np.testing.assert_allclose(b.weights[name], a.weights[name], rtol=0, atol=atol, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("n_ctx", [16, 256], ids=["ctx16", "ctx256-causal-blocks"])  # 256: blocked attention
def test_bfloat16_trains_close_to_float32(n_ctx):
    fp32 = tiny_config(lr=1e-2, n_ctx=n_ctx)
    bf16 = replace(fp32, precision="bfloat16")
    pattern = (np.arange(2 * 4 * (n_ctx + 1)).reshape(2, 4, n_ctx + 1) % 7 + 1).astype(np.int32)
    batches = [(w[:, :-1], w[:, 1:]) for w in pattern]
    a = run_training(fp32, batches, devices_for(fp32), steps=6)
    b = run_training(bf16, batches, devices_for(bf16), steps=6)
    assert b.losses[-1] < 0.7 * b.losses[0]
    np.testing.assert_allclose(b.losses, a.losses, rtol=0.02)
    assert all(w.dtype == np.float32 for w in b.weights.values())  # float32 master weights
    tokens = random_tokens([2, fp32.n_ctx])
    logits_32, logits_16 = (compute_logits(c, tokens, devices_for(c)) for c in (fp32, bf16))
    assert 1e-4 < np.abs(logits_16 - logits_32).max() < 0.1  # activations really are bfloat16


@pytest.mark.slow
def test_recompute_grad_gives_the_same_gradients():
    """With MoE layers: the losses and gradients (GRADIENT_STEP: the weights after the step) of recomputed
    activations are those of kept ones. Bug it guards: a recomputed MoE layer's load-balancing loss cut off from
    the gradients (models/gpt.py: `mtf.stop_gradient(moe_loss)`), which leaves the objective as it was."""
    cfg = tiny_config(**MOE, **GRADIENT_STEP)
    batch = lm_batch(cfg)
    a = run_training(cfg, [batch], devices_for(cfg), steps=1)
    b = run_training(replace(cfg, recompute_grad=True), [batch], devices_for(cfg), steps=1)
    assert_same_step(a, b, atol=1e-6)


def test_z_loss_adds_the_mean_squared_log_partition_function():
    cfg = tiny_config(z_loss=0.01)
    inputs, labels = lm_batch(cfg)
    losses = compute_losses(cfg, inputs, labels, devices_for(cfg), train=False)
    logits = compute_logits(cfg, inputs, devices_for(cfg)).astype(np.float64)
    log_z = np.log(np.exp(logits).sum(-1))
    np.testing.assert_allclose(losses["objective"] - losses["loss"], 0.01 * np.mean(log_z ** 2), rtol=1e-4)


EVERYTHING = dict(attention_types=[[["linear", "global"], 1]], moe_layers=[1], moe_params={"moe_num_experts": 4},
                  rotary_emb=True, mlp_glu=True, num_mem_kv=2, macaron=True, scalenorm=True, no_weight_tie=True,
                  tokens_per_mb_per_replica=32, recompute_grad=True, opt_name="adafactor", beta1=0.0, z_loss=1e-3,
                  lr=1e-2)


@pytest.mark.slow
def test_all_options_together_train_alike_on_one_device_and_a_2x2_mesh():
    cfg = tiny_config(**EVERYTHING)
    batches = [lm_batch(cfg, seed) for seed in range(2)]
    one = run_training(cfg, batches, devices_for(cfg), steps=2)
    split = replace(cfg, mesh_shape="x:2,y:2", layout="batch:x,heads:y,experts:y")
    four = run_training(split, batches, devices_for(split), steps=2)
    np.testing.assert_allclose(four.losses, one.losses, rtol=0, atol=1e-5)
    np.testing.assert_allclose(four.moe_losses, one.moe_losses, rtol=0, atol=1e-5)
    for name in one.weights:
        np.testing.assert_allclose(four.weights[name], one.weights[name], rtol=0, atol=2e-5, err_msg=name)


@pytest.mark.slow
def test_runner_trains_and_evaluates_mlm_with_moe_micro_batches_and_adafactor(tmp_path):
    cfg = tiny_config(**MLM, **MOE, tokens_per_mb_per_replica=32, opt_name="adafactor", lr=0.1, beta1=0.0,
                      attention_types=[[["local", "none"], 1]], train_steps=2, model_path=str(tmp_path / "run"))
    rows = random_tokens([12, cfg.n_ctx + 1], seed=3, vocab=60)

    def batches(start_step):  # as main.py wraps its pipeline
        return mask_dataset(fixed_batches(rows, cfg.train_batch_size)(start_step), cfg, first_step=start_step)

    progress = Progress(cfg, every=1, peak_flops=0.0)
    assert loop.train(cfg, placement_for(cfg), batches, [progress, TensorBoard(progress)]) == 2
    checkpoint = checkpoints.latest(cfg.model_path)
    names = {name for name, _ in tf.train.list_variables(checkpoint)}
    assert {"gpt2/h1/wi/kernel", "gpt2/h1/wo/kernel", "gpt2/h1/top_2_gating/kernel"} <= names
    assert "gpt2/wte_slot_v" in names and not any("adam" in n for n in names)  # Adafactor's slots
    logged = {value.tag: value.simple_value for path in glob.glob(f"{cfg.model_path}/events.*")
              for event in tf.train.summary_iterator(path) for value in event.summary.value}
    assert logged["moe_loss"] > 0 and np.isfinite(logged["loss"])
    loss, step = validation.evaluate(cfg, placement_for(cfg), lambda: batches(0), steps=1)
    assert step == 2 and 0 < loss < 2 * np.log(cfg.n_vocab)


@pytest.mark.slow
def test_sampling_runs_on_a_model_with_options_and_refuses_mlm():
    cfg = tiny_config(**EVERYTHING, max_new_tokens=4, temperature=0.0)
    tokens = random_tokens([1, cfg.n_ctx], seed=4)
    out = run_predict(cfg, {"tokens": tokens, "prompt_length": np.array([5], np.int32)}, devices_for(cfg))
    assert out["tokens"].shape == (1, cfg.n_ctx) and int(out["lengths"][0]) == 9
    np.testing.assert_array_equal(out["tokens"][0, :5], tokens[0, :5])
    with pytest.raises(ConfigError, match="masked language model"):
        run_predict(tiny_config(**MLM), {"tokens": tokens, "prompt_length": np.array([5], np.int32)},
                    devices_for(cfg))


@pytest.mark.parametrize("changes, message", [
    (dict(rotary_emb=True, axial_pos_emb=[4, 4]), "set only one of them"),
    (dict(axial_pos_emb=[3, 4]), "make the product at least n_ctx"),
    (dict(axial_pos_emb=[16]), "two positive sizes"),
    (dict(n_embd=36, n_head=4, rotary_emb=True), "must be even"),
    (dict(moe_layers=[2]), "layers count from 0"),
    (dict(moe_layers=[1, 1]), "names a layer twice"),
    (dict(moe_params={"moe_num_experts": 4}), "moe_layers is empty"),
    (dict(moe_layers=[1], moe_params={"moe_num_expert": 4}), "did you mean 'moe_num_experts'"),
    (dict(moe_layers=[1], moe_params={"moe_hidden_size": 0}), "positive whole number"),
    (dict(moe_layers="1"), "list of whole numbers"),
    (dict(scalenorm=True, rezero=True), "set only one of them"),
    (dict(num_mem_kv=2, attention_types=[[["local"], 2]]), "add a global layer"),
    (dict(attention_types=[[["none"], 2]]), "at least one layer"),
    (dict(tokens_per_mb_per_replica=0), "positive number of tokens"),
    (dict(mesh_shape="x:2", layout="experts:x"), "not a dimension of this model"),
    (dict(moe_layers=[1], moe_params={"moe_num_experts": 3}, mesh_shape="x:2", layout="experts:x"),
     "does not divide it evenly"),
    (dict(mlm_mask_id=5), "mlm_training is false"),
])
def test_invalid_option_combinations_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError) as info:
        tiny_config(**changes)
    assert message in str(info.value) and "\n" not in str(info.value)
