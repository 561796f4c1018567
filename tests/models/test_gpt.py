"""The model's defining properties: causality, the local window's edge, and parity with HF's GPTNeo."""
import numpy as np
import pytest

from models.kernels.attention import causal_blocks_pay
from tiny import compute_logits, devices_for, random_tokens, tiny_config, train


def logits_of(cfg, tokens, checkpoint=None):
    return compute_logits(cfg, tokens, devices_for(cfg), checkpoint)


# Context 256: attention runs in blocks of queries (models/kernels/attention.causal_attention: 4 blocks of 64,
# global and local); the change at t = 140 is inside a block, past its first query.
@pytest.mark.parametrize("kind,n_ctx,t", [("global", 16, 7), ("local", 16, 7), ("global", 256, 140),
                                          ("local", 256, 140)])
def test_future_tokens_do_not_change_past_logits(kind, n_ctx, t):
    cfg = tiny_config(attention_types=[[[kind], 2]], n_ctx=n_ctx)
    radius = cfg.local_attention_radius if kind == "local" else None
    assert causal_blocks_pay(n_ctx, radius) == (n_ctx == 256)
    tokens = random_tokens([2, cfg.n_ctx], seed=1)
    changed = tokens.copy()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % cfg.n_vocab
    before, after = logits_of(cfg, tokens), logits_of(cfg, changed)
    np.testing.assert_allclose(before[:, :t + 1], after[:, :t + 1], atol=1e-5)
    # The change is visible from t+1 on, so the comparison above is not vacuous.
    assert np.abs(before[:, t + 1:] - after[:, t + 1:]).max() > 1e-3


@pytest.mark.parametrize("n_ctx,radius,t", [(16, 4, 12), (256, 100, 200)])  # 256: 4 blocks of 64 queries
def test_local_attention_sees_exactly_radius_positions(n_ctx, radius, t):
    cfg = tiny_config(n_layer=1, attention_types=[[["local"], 1]], local_attention_radius=radius, n_ctx=n_ctx)
    tokens = random_tokens([1, cfg.n_ctx], seed=2)
    base = logits_of(cfg, tokens)[0, t]

    def logits_at_t_after_changing(position):
        changed = tokens.copy()
        changed[0, position] = (changed[0, position] + 1) % cfg.n_vocab
        return logits_of(cfg, changed)[0, t]

    # Position t sees t - radius + 1 .. t (radius tokens, itself included), as GPT-Neo and HF's window_size.
    np.testing.assert_allclose(logits_at_t_after_changing(t - radius), base, atol=1e-6)
    assert np.abs(logits_at_t_after_changing(t - radius + 1) - base).max() > 1e-4


def test_global_attention_sees_the_first_token():
    cfg = tiny_config(n_layer=1, attention_types=[[["global"], 1]])
    tokens = random_tokens([1, cfg.n_ctx], seed=3)
    changed = tokens.copy()
    changed[0, 0] = (changed[0, 0] + 1) % cfg.n_vocab
    assert np.abs(logits_of(cfg, tokens)[0, -1] - logits_of(cfg, changed)[0, -1]).max() > 1e-4


@pytest.mark.slow  # a 4-layer training, transformers and torch imported: 30 s of CPU at context 16
@pytest.mark.parametrize("n_ctx", [16, 256], ids=["ctx16", "ctx256-causal-blocks"])
def test_logits_match_hf_gpt_neo_loading_our_checkpoint(tmp_path, n_ctx):
    """The external oracle: transformers' own reader of GPT-Neo mesh-tf checkpoints, on weights we trained. At
    context 256 the global layers attend in blocks of queries (models/kernels/attention.causal_attention)."""
    torch = pytest.importorskip("torch")
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    from transformers.models.gpt_neo.modeling_gpt_neo import load_tf_weights_in_gpt_neo

    cfg = tiny_config(n_layer=4, attention_types=[[["global", "local"], 2]], model_path=str(tmp_path / "run"),
                      train_steps=3, scale_by_depth=True, n_ctx=n_ctx)
    train(cfg, random_tokens([12, cfg.n_ctx + 1], seed=4))
    tokens = random_tokens([3, cfg.n_ctx], seed=5)
    ours = logits_of(cfg, tokens, cfg.model_path)

    hf_config = GPTNeoConfig(
        vocab_size=cfg.n_vocab, max_position_embeddings=cfg.n_ctx, hidden_size=cfg.n_embd, num_layers=cfg.n_layer,
        attention_types=[[["global", "local"], 2]], num_heads=cfg.n_head, window_size=cfg.local_attention_radius,
        activation_function="gelu_new", resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0)
    hf_model = GPTNeoForCausalLM(hf_config)
    import tensorflow.compat.v1 as tf
    load_tf_weights_in_gpt_neo(hf_model, hf_config, tf.train.latest_checkpoint(cfg.model_path))
    hf_model.eval()
    with torch.no_grad():
        theirs = hf_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    assert np.abs(ours).max() > 0.1  # real logits, not a degenerate zero model
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
