"""models/optimizers.py: the fused Adam step equals mesh-tensorflow's AdamWeightDecayOptimizer; which weights
weight decay shrinks on the real model; the learning-rate schedule, and the step whose rate each update
applies."""
import functools
import math
import shutil

import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from config import replace
from models.kernels import common
from tiny import cpu_mesh_impl, fixed_batches, model_weights, placement_for, random_tokens, tiny_config
from execution.callbacks import EachStep
from train import loop
from models import optimizers
from models.optimizers import NO_DECAY, AdamWeightDecay
from train.optimizer import autostack_allowed


def initial_values(seed=0) -> dict:
    """Two decayed matrices of one shape (autostack combines them on a mesh of several devices), an undecayed
    bias, and their gradients, as float32."""
    rng = np.random.RandomState(seed)
    return {"w": rng.randn(8, 6), "w2": rng.randn(8, 6), "o_b": rng.randn(6),
            "g_w": rng.randn(8, 6), "g_w2": rng.randn(8, 6), "g_o_b": rng.randn(6)}


def two_steps(optimizer_class, mesh_shape, layout, activation_dtype=tf.float32, lr=0.01, steps=2, weight_decay=0.1):
    """`steps` Adam steps on the variables of initial_values with fp32 masters and activations (what the model
    reads) in `activation_dtype`; returns their values and slots, read from the masters after the last step.
    `optimizer_class` may be AdamWeightDecay with fused=False: its update per variable, as on TPU meshes
    (train/step.py)."""
    start = {k: v.astype(np.float32) for k, v in initial_values().items()}
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "m")
        impl = cpu_mesh_impl(mesh_shape, layout)
        rows, cols = mtf.Dimension("rows", 8), mtf.Dimension("cols", 6)
        dtype = mtf.VariableDType(tf.float32, tf.float32, activation_dtype)
        shapes = {"w": mtf.Shape([rows, cols]), "w2": mtf.Shape([rows, cols]), "o_b": mtf.Shape([cols])}
        variables = [mtf.get_variable(mesh, name, shape, dtype=dtype,
                                      initializer=tf.constant_initializer(start[name])).operation
                     for name, shape in shapes.items()]
        grads = [mtf.import_tf_tensor(mesh, tf.constant(start["g_" + name]), shape) for name, shape in shapes.items()]
        lr = mtf.import_fully_replicated(mesh, tf.constant(lr), mtf.Shape([]))
        optimizer = optimizer_class(learning_rate=lr, weight_decay_rate=weight_decay, beta_1=0.9, beta_2=0.95,
                                    epsilon=1e-8, exclude_from_weight_decay=NO_DECAY)
        updates = optimizer.apply_grads(grads, variables)
        lowering = mtf.Lowering(mtf_graph, {mesh: impl}, autostack=autostack_allowed(updates))  # as training lowers
        step = tf.group([lowering.lowered_operation(op) for op in updates])
        names = [n for name in shapes for n in (name, name + "/adam_m", name + "/adam_v")]
        with tf.Session(config=tf.ConfigProto(device_count={"CPU": 4})) as session:
            session.run(tf.global_variables_initializer())
            session.run(lowering.copy_masters_to_slices())
            for _ in range(steps):
                session.run(step)
            session.run(lowering.copy_slices_to_masters())
            masters = {v.name.split(":")[0]: v for v in tf.global_variables()}
            return {n: session.run(masters[n]) for n in names}


def adam_oracle(lr, steps, weight_decay=0.1, beta_1=0.9, beta_2=0.95, epsilon=1e-8) -> dict:
    """The same steps in float64 NumPy from the float32 start: m, v, w -= lr * (m / (sqrt(v) + eps) + decay * w),
    decay on the matrices only (mesh-tensorflow's AdamWeightDecay, no bias correction)."""
    start = {k: v.astype(np.float32).astype(np.float64) for k, v in initial_values().items()}
    out = {}
    for name in ("w", "w2", "o_b"):
        w, g = start[name], start["g_" + name]
        m, v = np.zeros_like(w), np.zeros_like(w)
        for _ in range(steps):
            m = beta_1 * m + (1 - beta_1) * g
            v = beta_2 * v + (1 - beta_2) * g * g
            w = w - lr * (m / (np.sqrt(v) + epsilon) + (weight_decay * w if name != "o_b" else 0.0))
        out.update({name: w, name + "/adam_m": m, name + "/adam_v": v})
    return out


@pytest.mark.parametrize("kernel_path", ["xla", "plain"])  # XLA-compiled, or plain ops where XLA:GPU cannot compile
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2", "cols:x"), ("x:4", "")])
def test_fused_adam_equals_adam_weight_decay(mesh_shape, layout, kernel_path):
    expected = two_steps(mtf.optimize.AdamWeightDecayOptimizer, "all:1", "")
    with common.kernels(kernel_path):
        got = two_steps(AdamWeightDecay, mesh_shape, layout)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    assert np.abs(expected["w/adam_m"]).max() > 0  # the step ran


def test_a_second_build_reads_adams_pass_back_and_another_weight_decay_traces_its_own(tmp_path, monkeypatch):
    """The fused pass's trace is kept beside XLA's compile cache (models/kernels/traces.py): a second build of
    the same update reads it back instead of tracing it again, and every build's steps are float64 NumPy's Adam.
    Bugs caught: the pass traced on every build (traces.call bypassed); the weight decay (or Adam's other
    constants) left out of what the trace is made from, so a run with another decay reads back a pass that
    decays by the first's."""
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path}")
    traced = []
    adam_pass = optimizers._adam_pass
    monkeypatch.setattr(optimizers, "_adam_pass", lambda *a: traced.append(1) or adam_pass(*a))
    lr, steps = 0.01, 2
    for weight_decay, traced_so_far in ((0.1, 1), (0.1, 1), (0.3, 2)):
        with common.kernels("xla"):
            got = two_steps(AdamWeightDecay, "all:1", "", lr=lr, steps=steps, weight_decay=weight_decay)
        assert len(traced) == traced_so_far, weight_decay
        for name, value in adam_oracle(lr, steps, weight_decay).items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} {weight_decay}")
    assert len(list((tmp_path / "traces").iterdir())) == 2


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per_variable"])
@pytest.mark.parametrize("activation_dtype", [tf.bfloat16, tf.float16, tf.float32])
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2", "cols:x"), ("x:4", "")])
def test_adam_updates_the_fp32_master_whatever_the_model_reads(activation_dtype, mesh_shape, layout, fused):
    """Updates far below half a bf16 (or fp16) ulp of their weights (lr 1e-6 on weights near 1, whose bf16 ulp
    is 2^-7) land on the fp32 masters: three steps move every weight as float64 NumPy's Adam moves it. Bug
    caught: the fused pass reading the weight through the activation dtype (as from `var.value`, the copy the
    model reads), so every step rounds the master to that grid and updates below half its ulp are lost; and
    (x:4, where autostack would stack w and w2) the step lowered with autostack on
    (train/optimizer.autostack_allowed returning True: the pass finds no variable w). The per-variable update of
    TPU meshes ([per_variable], lowered with autostack on: w and w2 stacked on x:4) holds the same: bug caught,
    `_per_variable` reading `mtf.to_float(var.outputs[0])` (the model's copy) in place of `master_value(var)`."""
    lr, steps = 1e-6, 3
    oracle = adam_oracle(lr, steps)
    start = initial_values()
    got = two_steps(functools.partial(AdamWeightDecay, fused=fused), mesh_shape, layout, activation_dtype, lr=lr,
                    steps=steps)
    for name in ("w", "w2", "o_b"):
        moved, expected = got[name] - start[name].astype(np.float32), oracle[name] - start[name]
        assert np.abs(expected).min() > 5e-7  # every weight moves, by far less than a bf16 ulp
        # fp32 arithmetic on weights near 1 resolves 6e-8 of the ~3e-6 move: 5% of it, with margin
        np.testing.assert_allclose(moved, expected, rtol=0.05, atol=2e-7, err_msg=name)
        np.testing.assert_allclose(got[name + "/adam_v"], oracle[name + "/adam_v"], rtol=1e-5, err_msg=name)


@pytest.mark.slow
def test_weight_decay_shrinks_matrices_and_embeddings_not_norms_or_biases(tmp_path):
    """On the real tiny model, independent of models/optimizers.NO_DECAY (the test above hands NO_DECAY to both
    optimizers, so it never tests the list): two runs resume from one checkpoint with nonzero biases and norm
    gains away from 1 and take one step on the same batch, one with weight decay and one without. Adam's update
    is the same in both; the decayed run's weights are lower by exactly lr * weight_decay * w where w is decayed.
    Which are, the test derives from the shapes: every weight of rank 2 or more (the attention and MLP matrices,
    wte and wpe), no vector (norm gains and biases, MLP and attention output biases).
    Bugs caught: "bias" dropped from NO_DECAY (MLP biases decayed), or "norm" (norm gains decayed); a pattern
    that also matches a matrix (it would not be decayed)."""
    data = random_tokens([16, 17], seed=3)
    cfg = tiny_config(model_path=str(tmp_path / "start"), train_steps=3, steps_per_checkpoint=2, lr=1e-2)
    first = []  # the update that makes step s+1 (global step s before it) runs at the schedule's value at s
    loop.train(cfg, placement_for(cfg), fixed_batches(data, cfg.train_batch_size), until=2,
               callbacks=[EachStep(lambda step, values: first.append(float(values["learning_rate"])))])
    np.testing.assert_allclose(first, [scheduled(cfg.lr, s, 0, 3, "cosine") for s in (0, 1)], rtol=1e-6)
    start = model_weights(cfg.model_path)
    assert all(np.abs(value).max() > 1e-3 for value in start.values())  # no zero bias: a decay would show

    after, learning_rates = {}, {}
    for decay in (0.0, 0.5):
        run = replace(cfg, model_path=str(tmp_path / f"decay_{decay}"), weight_decay=decay)
        shutil.copytree(cfg.model_path, run.model_path)
        loop.train(run, placement_for(run), fixed_batches(data, run.train_batch_size),
                   callbacks=[EachStep(lambda step, values: learning_rates.update({decay: float(values["learning_rate"])}))])
        after[decay] = model_weights(run.model_path)
    assert learning_rates[0.0] == learning_rates[0.5] == pytest.approx(scheduled(cfg.lr, 2, 0, 3, "cosine"), rel=1e-6)
    shrink = learning_rates[0.5] * 0.5

    decayed = {name for name, value in start.items() if value.ndim >= 2}
    assert decayed and {"gpt2/wte", "gpt2/wpe", "gpt2/h0/attn/q", "gpt2/h1/mlp/conv1d_main/c_fc/kernel"} <= decayed
    assert any(name.endswith("/bias") for name in start) and any("/norm_" in name for name in start)
    for name, value in start.items():
        expected = shrink * value if name in decayed else np.zeros_like(value)
        np.testing.assert_allclose(after[0.0][name] - after[0.5][name], expected, rtol=1e-3, atol=1e-7, err_msg=name)


def rates_at(cfg, steps) -> list:
    """models/optimizers.py's learning rate for the update that starts at each global step of `steps`."""
    from models.optimizers import learning_rate
    with tf.Graph().as_default(), tf.Session() as session:
        step = tf.placeholder(tf.int64, [])  # the global step's dtype
        rate = learning_rate(cfg, step)
        return [float(session.run(rate, {step: s})) for s in steps]


def scheduled(lr, step, warmup, decay_end, decay, share=0.2) -> float:
    """README's schedule: a linear warmup from 0 to lr over warmup_steps (update s, counted from 0, at lr * s /
    warmup_steps), then from lr at step 0 down to 10% of lr at lr_decay_end, cosine or linear in the progress
    step / lr_decay_end, and 10% of lr after it; "wsd" holds lr until the progress reaches 1 - share, then falls
    linearly to 10% at lr_decay_end."""
    if step < warmup:
        return lr * step / warmup
    progress = min(step / decay_end, 1.0)
    if decay == "wsd":
        return lr * (1 - 0.9 * min(max((progress - (1 - share)) / share, 0.0), 1.0))
    fraction = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)) if decay == "cosine" else 1 - 0.9 * progress
    return lr * fraction


@pytest.mark.parametrize("decay", ["cosine", "linear"])
@pytest.mark.parametrize("warmup, decay_end", [(10, None), (0, None), (10, 40)])
def test_the_learning_rate_schedule_at_its_boundaries(decay, warmup, decay_end):
    """No test covered the schedule: a warmup off by one step, or a cosine that decays to 0 instead of 10% of
    lr, passed the suite. The steps around each boundary: the first updates, the last of the warmup and the first
    after it, the middle of the decay, its end (lr_decay_end, default train_steps) and beyond."""
    cfg = tiny_config(lr=2e-3, warmup_steps=warmup, lr_decay=decay, lr_decay_end=decay_end, train_steps=100)
    end = decay_end or cfg.train_steps
    steps = [0, 1, 9, 10, 11, end // 4, end // 2, end - 1, end, end + 1, 1000]
    expected = [scheduled(cfg.lr, s, warmup, end, decay) for s in steps]
    np.testing.assert_allclose(rates_at(cfg, steps), expected, rtol=1e-5)
    if warmup:
        assert rates_at(cfg, [0, warmup])[0] == 0.0  # the first update of a warmup is at lr 0 (GPT-Neo's)
    assert rates_at(cfg, [end, 10 * end]) == pytest.approx([0.1 * cfg.lr] * 2, rel=1e-6)  # 10% of lr, kept


@pytest.mark.parametrize("share, warmup, decay_end", [(0.2, 10, None), (0.5, 0, 40), (1.0, 0, None)])
def test_wsd_holds_lr_until_its_decay_share_then_falls_to_the_floor(share, warmup, decay_end):
    """lr_decay "wsd" (warmup-stable-decay): lr itself from the warmup's end until the last `lr_decay_share` of
    lr_decay_end, then linearly down to the floor of the other decays (10% of lr) at lr_decay_end, and 10% after it;
    share 1 is the linear decay. The steps around each boundary: the warmup's, the last step at lr and the first
    below it, the middle of the decay, its end and beyond. (Bug it catches: the decay starting at progress `share`
    instead of 1 - share, `(p - cfg.lr_decay_share) / cfg.lr_decay_share` in LR_DECAYS["wsd"].)"""
    cfg = tiny_config(lr=2e-3, warmup_steps=warmup, lr_decay="wsd", lr_decay_share=share, lr_decay_end=decay_end,
                      train_steps=100)
    end = decay_end or cfg.train_steps
    stable = round((1 - share) * end)  # the last step at lr (a whole step for these shares)
    steps = sorted({0, 1, 9, 10, 11, end // 4, max(stable - 1, 0), stable, stable + 1, (stable + end) // 2, end - 1,
                    end, end + 1, 1000})
    expected = [scheduled(cfg.lr, s, warmup, end, "wsd", share) for s in steps]
    np.testing.assert_allclose(rates_at(cfg, steps), expected, rtol=1e-5)
    held = [s for s in range(warmup, stable + 1)]
    assert rates_at(cfg, held) == pytest.approx([cfg.lr] * len(held), rel=1e-6)  # the stable phase: lr itself
    assert rates_at(cfg, [stable + 1])[0] < cfg.lr
    assert rates_at(cfg, [end, 10 * end]) == pytest.approx([0.1 * cfg.lr] * 2, rel=1e-6)  # the floor, kept
    if share == 1.0:  # no stable phase: the linear decay's schedule
        linear = replace(cfg, lr_decay="linear")
        np.testing.assert_allclose(rates_at(cfg, steps), rates_at(linear, steps), rtol=1e-6)
