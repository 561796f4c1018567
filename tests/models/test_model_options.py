"""Every model option of the reference: it builds, trains with falling loss, gives every one of its variables a
gradient, computes the same loss on one device and on a 2x2 model-parallel mesh, and is causal (or, for MLM,
bidirectional). The options are tried in groups, each group one model that combines them, so that a test builds
one graph per group rather than per option (a graph build and its first session call are most of a test's cost;
issue #41). A group's options fit together and none hides another: rezero, whose branches start at zero (the
blocks then play no part in the losses at the initial weights, nor in the logits), is a group of its own, and an
option that sets the attention types is in a group with no other such option. Option-specific behaviour (linear
attention's formula and memory, rotary's relative positions, micro-batching, bf16, recompute, z-loss, MLM
masking and loss) is tested below and in tests/train/test_training_options.py."""
import numpy as np
import pytest

from config import replace
from tiny import compute_logits, compute_losses, devices_for, random_tokens, run_training, tiny_config

MOE = dict(moe_layers=[1], moe_params={"moe_num_experts": 4})
MLM = dict(mlm_training=True, mlm_mask_id=63, padding_id=0, mlm_mask_ignore_ids=[62])

# group of options -> (config overrides, model-parallel layout on mesh x:2,y:2 splitting the batch and the
# dimensions the group's options act on, variables its options add). Options that do not change the forward pass
# (Adafactor, recompute_grad) change what the group trains with; with all options together they also train on a
# 2x2 mesh in tests/train/test_training_options.py.
GROUPS = {
    "linear+rotary_emb+num_mem_kv+prelu": (
        dict(attention_types=[[["global", "linear"], 1]], rotary_emb=True, num_mem_kv=3, activation_function="prelu"),
        "batch:x,heads:y",
        ["gpt2/h0/attn/attention/memory_key_values/mem_k", "gpt2/h0/attn/attention/memory_key_values/mem_v",
         "gpt2/h0/mlp/activation/prelu_alpha"]),
    "par_none+share_parameters": (dict(attention_types=[[["global", "none"], 1]], share_parameters=True),
                                  "batch:x,heads:y", ["gpt2/attn/q", "gpt2/norm_1/g"]),
    "rezero": (dict(rezero=True), "batch:x,heads:y", ["gpt2/h0/norm_rezero_1/g", "gpt2/h1/norm_rezero_2/g"]),
    "linear_only+axial_pos_emb+selu": (
        dict(attention_types=[[["linear"], 2]], axial_pos_emb=[4, 4], activation_function="selu"),
        "batch:x,embd:y", ["gpt2/axial_wpe_1", "gpt2/axial_wpe_2"]),
    "moe+recompute_grad+mlp_glu+macaron": (
        dict(MOE, recompute_grad=True, mlp_glu=True, macaron=True), "batch:x,experts:y,intermediate_expanded:y",
        ["gpt2/h1/wi/kernel", "gpt2/h1/wo/kernel", "gpt2/h1/top_2_gating/kernel",
         "gpt2/h0/mlp_macaron/conv1d_main/c_fc/kernel", "gpt2/h1/norm_macaron/g"]),
    "no_weight_tie+z_loss+adafactor": (
        dict(no_weight_tie=True, z_loss=1e-2, opt_name="adafactor", lr=0.3, beta1=0.0), "batch:x,vocab:y",
        ["gpt2/wte_final_linear/conv1d_main/linear_out/kernel"]),
    "mlm": (dict(MLM, attention_types=[[["global", "linear"], 1]]), "batch:x,heads:y", []),
    "mlm_local+scalenorm": (dict(MLM, attention_types=[[["local"], 2]], mlm_cls_token_id=61, scalenorm=True),
                            "batch:x,embd:y", []),
}
CAUSAL = [name for name, (overrides, _, _) in GROUPS.items() if not overrides.get("mlm_training")]


def option_config(name, **changes):
    overrides = dict(GROUPS[name][0])
    overrides.setdefault("lr", 1e-2)
    overrides.update(changes)
    return tiny_config(**overrides)


# The repeating sequence's 7 tokens: spread over the vocabulary (both halves of a vocab split over 2 devices), clear
# of MLM's special ids (0 padding, 61 cls, 62 ignored, 63 mask).
PATTERN = np.array([3, 12, 21, 30, 39, 48, 57], np.int32)


def pattern_batches(cfg, count=2):
    """A repeating sequence (learnable in a few steps) as [(inputs, labels)] batches; for MLM, masked."""
    rows = cfg.train_batch_size * count
    windows = PATTERN[np.arange(rows * (cfg.n_ctx + 1)).reshape(rows, cfg.n_ctx + 1) % len(PATTERN)]
    windows = windows.reshape(count, cfg.train_batch_size, cfg.n_ctx + 1)
    if cfg.mlm_training:
        from data.mlm import mask_tokens
        return [tuple(t.numpy() for t in mask_tokens(w, cfg, step)) for step, w in enumerate(windows)]
    return [(w[:, :-1], w[:, 1:]) for w in windows]


@pytest.fixture(scope="module")
def trained():
    """`trained(name)`: the group's 8 training steps on one device (run_training on pattern_batches), run once
    for the module: the training test reads all of it, the mesh test its first step's losses."""
    runs = {}

    def run(name):
        if name not in runs:
            cfg = option_config(name, log_grads=True)  # every variable's gradient norm, logged with each step
            runs[name] = run_training(cfg, pattern_batches(cfg), devices_for(cfg), steps=8)
        return runs[name]
    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GROUPS))
def test_option_trains_and_every_variable_gets_a_gradient(name, trained):
    """Finite objectives, the loss of the last steps below 0.8 of the first, the variables the group's options add,
    and a gradient for every variable (with MoE, its loss in the objective). Bug it guards, seen in a group of
    several options: prelu's alpha cut from the gradient (models/activations.py:
    `mtf.stop_gradient(_scalar(x, "prelu_alpha", 0.2))`) fails `linear+rotary_emb+num_mem_kv+prelu`."""
    cfg, run = option_config(name), trained(name)
    assert np.all(np.isfinite(run.objectives))
    assert np.mean(run.losses[-2:]) < 0.8 * run.losses[0], run.losses
    for variable in GROUPS[name][2]:
        assert variable in run.weights, f"{variable} missing; have {sorted(run.weights)}"
    assert run.gradient_norms.keys() == run.weights.keys()
    without_gradient = [v for v, norm in run.gradient_norms.items() if not norm > 0]
    assert not without_gradient, f"variables without gradient: {without_gradient}"
    if cfg.moe_layers:
        assert len(run.moe_losses) == 8 and all(loss > 0 for loss in run.moe_losses)
        np.testing.assert_array_less(run.losses, run.objectives)  # the MoE loss is part of the objective


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GROUPS))
def test_option_gives_the_same_loss_on_a_model_parallel_mesh(name, trained):
    """The first batch's losses at the seeded initial weights on a 2x2 mesh that splits the batch and the
    dimensions the group's options act on are those of the first step of the group's training on one device.
    Bug it guards: LayerNorm's mean taken over each device's part of embd where the layout splits it
    (models/kernels/elementwise.py's LayerNormOperation.lower: `if axis is None` made `if True`), in the
    embd-split group `linear_only+axial_pos_emb+selu`."""
    cfg = option_config(name)
    inputs, labels = pattern_batches(cfg)[0]
    run = trained(name)  # its first step: the first batch's losses before any update
    one = {"loss": run.losses[0], "objective": run.objectives[0]}
    if run.moe_losses:
        one["moe_loss"] = run.moe_losses[0]
    split = replace(cfg, mesh_shape="x:2,y:2", layout=GROUPS[name][1])
    four = compute_losses(split, inputs, labels, devices_for(split))
    assert one.keys() == four.keys()
    for key in one:
        np.testing.assert_allclose(four[key], one[key], rtol=0, atol=1e-5, err_msg=key)


def changed_after(tokens, t, vocab):
    changed = tokens.copy()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % vocab
    return changed


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_option_does_not_let_future_tokens_change_past_logits(name):
    changes = {}
    if "moe_layers" in GROUPS[name][0]:
        # Top-2 routing is causal while experts have room for every token: a capacity factor of
        # num_experts guarantees it (with less, later tokens can take an earlier token's second expert).
        changes["moe_params"] = {"moe_num_experts": 4, "moe_capacity_factor_eval": 4.0}
    cfg = option_config(name, **changes)
    tokens = random_tokens([2, cfg.n_ctx], seed=1)
    t = 6
    logits = compute_logits(cfg, np.concatenate([tokens, changed_after(tokens, t, cfg.n_vocab)]), devices_for(cfg))
    before, after = logits[:2], logits[2:]
    np.testing.assert_allclose(before[:, :t + 1], after[:, :t + 1], atol=1e-5)
    assert np.abs(before[:, t + 1:] - after[:, t + 1:]).max() > 1e-3


@pytest.mark.parametrize("name", ["mlm", "mlm_local+scalenorm"])
def test_mlm_is_bidirectional(name):
    cfg = option_config(name)
    tokens = random_tokens([2, cfg.n_ctx], seed=1, vocab=60)
    t = 6
    logits = compute_logits(cfg, np.concatenate([tokens, changed_after(tokens, t, 60)]), devices_for(cfg))
    # Position t sees later positions (local attention: those within the radius).
    assert np.abs(logits[:2, t] - logits[2:, t]).max() > 1e-3
