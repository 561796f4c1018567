"""The GPT model: token + learned position embeddings, pre-LayerNorm blocks, final LayerNorm, tied output.

Variables live under `gpt2/` with GPT-Neo's names and shapes (see README, "Checkpoints"), so GPT-Neo's
released checkpoints load into this model and HF transformers' `load_tf_weights_in_gpt_neo` reads ours.
"""
from __future__ import annotations

from dataclasses import dataclass

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models import fast_ops
from models.attention import self_attention
from models.config import GPTConfig
from models.kv_cache import DecodeState
from models.layers import dropout, layer_norm, mlp, variable


@dataclass(frozen=True)
class Dims:
    batch: mtf.Dimension
    sequence: mtf.Dimension
    embd: mtf.Dimension
    vocab: mtf.Dimension
    embed_sequence: mtf.Dimension  # rows of wpe; separate from `sequence` so layouts can treat them apart

    @classmethod
    def of(cls, cfg: GPTConfig, batch_size: int) -> "Dims":
        return cls(mtf.Dimension("batch", batch_size), mtf.Dimension("sequence", cfg.n_ctx),
                   mtf.Dimension("embd", cfg.n_embd), mtf.Dimension("vocab", cfg.n_vocab),
                   mtf.Dimension("embed_sequence", cfg.n_ctx))


def variable_dtype(cfg: GPTConfig) -> mtf.VariableDType:
    """fp32 master weights; bf16 activations when precision is bfloat16."""
    activation = tf.bfloat16 if cfg.precision == "bfloat16" else tf.float32
    return mtf.VariableDType(master_dtype=tf.float32, slice_dtype=tf.float32, activation_dtype=activation)


def block(x: mtf.Tensor, layer: int, cfg: GPTConfig, dtype: mtf.VariableDType, train: bool,
          cache: DecodeState | None = None) -> mtf.Tensor:
    """x + attn(norm_1(x)), then + mlp(norm_2(x))."""
    with tf.variable_scope(f"h{layer}"):
        a = self_attention(layer_norm(x, "norm_1", dtype), "attn", cfg.attention_types[layer], cfg, dtype, train,
                           cache=cache)
        x = x + a
        return x + mlp(layer_norm(x, "norm_2", dtype), "mlp", cfg, dtype, train)


def logits(tokens: mtf.Tensor, cfg: GPTConfig, dims: Dims, train: bool, cache: DecodeState | None = None) -> mtf.Tensor:
    """tokens [batch, sequence] int -> logits [batch, sequence, vocab] (float32).

    `cache` is for sampling (models/kv_cache.py): in step mode tokens are [batch], the token at
    cache.position - 1, and the logits [batch, vocab] are those for cache.position.
    """
    mesh = tokens.mesh
    dtype = variable_dtype(cfg)
    with tf.variable_scope("gpt2"):
        wpe = variable(mesh, "wpe", [dims.embed_sequence, dims.embd], dtype, stddev=0.01, seed=cfg.seed)
        wte = variable(mesh, "wte", [dims.vocab, dims.embd], dtype, stddev=0.02, seed=cfg.seed)
        with tf.variable_scope("token_embd"):
            h = dropout(fast_ops.gather(wte, tokens, dims.vocab, fast_ops.vocab_is_split(cfg)), cfg.embed_dropout,
                        train)
        with tf.variable_scope("pos_embd"):
            if cache is not None and cache.incremental:
                positions = cache.position - 1
            else:
                positions = mtf.range(mesh, dims.sequence, tf.int32)
            h += dropout(mtf.gather(wpe, positions, dims.embed_sequence), cfg.embed_dropout, train)

        for layer in range(cfg.n_layer):
            if cfg.recompute_grad and train:
                # Keep only block inputs for the backward pass; recompute the rest (memory for compute).
                h = mtf.recompute_grad(lambda x, layer=layer: block(x, layer, cfg, dtype, train), [h])
            else:
                h = block(h, layer, cfg, dtype, train, cache)

        h = layer_norm(h, "ln_f", dtype)
        with tf.variable_scope("wte_final_einsum"):
            out = mtf.einsum([h, wte], output_shape=h.shape.dims[:-1] + [dims.vocab])
        return mtf.cast(out, tf.float32)


def loss(logits_: mtf.Tensor, labels: mtf.Tensor, cfg: GPTConfig, dims: Dims) -> tuple[mtf.Tensor, mtf.Tensor]:
    """Mean next-token cross-entropy, and the training objective (cross-entropy plus GPT-Neo's z-loss)."""
    with tf.variable_scope("xentropy_final"):
        if fast_ops.vocab_is_split(cfg):
            per_token = mtf.layers.softmax_cross_entropy_with_logits(logits_, labels, dims.vocab)
            log_z = mtf.reduce_logsumexp(logits_, dims.vocab) if cfg.z_loss else None
        else:  # the same values from one logsumexp, with a fused gradient (models/fast_ops.py)
            per_token, log_z = fast_ops.cross_entropy_and_log_z(logits_, labels, dims.vocab)
        cross_entropy = mtf.reduce_mean(per_token)
        objective = cross_entropy
        if cfg.z_loss:
            objective += cfg.z_loss * mtf.reduce_mean(mtf.square(log_z))
    return cross_entropy, objective
