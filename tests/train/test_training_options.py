"""Training-side options: micro-batching, bfloat16, recompute_grad, z_loss, all options together on a 2x2
mesh, the runner's path (MoE loss logged, MLM input masking, Adafactor), sampling, and invalid combinations."""
import glob

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from data.mlm import mask_dataset, mask_tokens
from modelpath import checkpoints
from evals import validation
from execution import callbacks
from train import loop
from train.progress import Progress
from train.trackers import TensorBoard, Tracker
from schema import ConfigError, num_microbatches
from config import replace
from models import flops
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
@pytest.mark.parametrize("overrides", [{}, dict(MLM, **MOE)], ids=["lm", "mlm_moe"])
def test_a_step_in_micro_batches_equals_a_step_on_the_whole_batch(overrides):
    """Losses, objective and gradients (GRADIENT_STEP: the weights after the step) of four micro-batches of one
    sequence each equal the whole batch's, for the language model and for MLM with MoE (whose loss weights and
    load-balancing loss are each micro-batch's share). Bugs it guards (train/objective.py, models/moe.py): a
    micro-batch's objective not divided by their count, the MoE layers not told the count, the gradients taken of
    another value than the objective's share (its `loss` times 1.5)."""
    whole = tiny_config(**overrides, **GRADIENT_STEP)
    split = replace(whole, tokens_per_mb_per_replica=whole.n_ctx)  # one sequence per micro-batch
    assert num_microbatches(split, split.train_batch_size) == 4
    batch = (mlm_batch if whole.mlm_training else lm_batch)(whole)
    a = run_training(whole, [batch], devices_for(whole), steps=1)
    b = run_training(split, [batch], devices_for(split), steps=1)
    assert_same_step(a, b, atol=1e-5)


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


class Scalars(Tracker):
    """A stand-in tracker that keeps the scalars the trackers record."""

    def __init__(self, progress):
        super().__init__(progress)
        self.scalars = {}

    def record(self, step, scalars):
        self.scalars.update(scalars)


def logged_speed(cfg, peak_flops, seconds_per_step, monkeypatch):
    """The progress line and scalars of step 2, one step of `seconds_per_step` after an untimed step 1."""
    lines = []
    progress = Progress(cfg, every=1, peak_flops=peak_flops, print_fn=lambda line, **_: lines.append(line))
    tracker = Scalars(progress)
    for step, now in ((1, 100.0), (2, 100.0 + seconds_per_step)):
        values = {"loss": 1.0, "learning_rate": 1e-3}
        progress.step(step, values, now)
        tracker.on_step(None, step, values)
    return lines[-1], tracker.scalars


def test_mfu_divides_the_meshs_flops_per_device_by_one_devices_peak(monkeypatch):
    one = tiny_config(train_steps=10)
    four = replace(one, mesh_shape="x:4", layout="batch:x")
    flops_per_step = one.train_batch_size * one.n_ctx * flops.training_flops_per_token(one)
    peak = 2 * flops_per_step  # one device at this peak does a step in 0.5 s: MFU 50% at 1 s per step
    line_1, scalars_1 = logged_speed(one, peak, 1.0, monkeypatch)
    line_4, scalars_4 = logged_speed(four, peak, 1.0, monkeypatch)
    assert scalars_1["model_flops_per_sec"] == scalars_4["model_flops_per_sec"] == pytest.approx(flops_per_step)
    assert scalars_1["model_flops_per_sec_per_device"] == pytest.approx(flops_per_step)
    assert scalars_4["model_flops_per_sec_per_device"] == pytest.approx(flops_per_step / 4)
    assert scalars_1["mfu"] == pytest.approx(0.5)
    assert scalars_4["mfu"] == pytest.approx(scalars_1["mfu"] / 4)  # same step time on four devices: a quarter
    assert "| MFU 50.0% |" in line_1 and "| MFU 12.5% |" in line_4
    assert f"| {flops_per_step / 1e9:.2f} GFLOP/s/device |" in line_1
    assert f"| {flops_per_step / 4e9:.2f} GFLOP/s/device |" in line_4
    no_peak, scalars = logged_speed(four, 0.0, 1.0, monkeypatch)
    assert "MFU" not in no_peak and "mfu" not in scalars


def test_the_rate_leaves_out_the_time_of_an_evaluation_at_a_checkpoint(monkeypatch):
    """Steps 1 to 3 at 1 s each with a 10 s evaluation after step 2 (train/loop.py runs the on_checkpoint hooks
    inside Run.paused): the line at step 3 shows 1 step/s, not 2 steps in 12 s. (Bug: Run.training_seconds not
    leaving out the paused time.)"""
    now = [100.0]
    monkeypatch.setattr(callbacks, "clock", lambda: now[0])
    cfg = tiny_config(train_steps=10)
    run = callbacks.Run(cfg, placement=None, program=None, session=None, start=0, until=10)
    lines = []
    progress = Progress(cfg, every=1, peak_flops=0.0, print_fn=lambda line, **_: lines.append(line))
    progress.on_open(run)
    for step in (1, 2, 3):
        now[0] += 1.0
        progress.on_step(run, step, {"loss": 1.0, "learning_rate": 1e-3})
        if step == 2:
            with run.paused():  # the evaluation at step 2's checkpoint
                now[0] += 10.0
    assert "| 1.00 steps/s |" in lines[1] and "| 1.00 steps/s |" in lines[2]
