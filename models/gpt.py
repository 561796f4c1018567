"""The GPT model: token + learned position embeddings, pre-LayerNorm blocks, final LayerNorm, tied output.

Variables live under `gpt2/` with GPT-Neo's names and shapes (see docs/checkpoints.md, "Variable names and shapes"), so GPT-Neo's
released checkpoints load into this model and HF transformers' `load_tf_weights_in_gpt_neo` reads ours.
The model options (docs/models.md, "Model options") change pieces of this: the position embedding
(models/embeddings.py), the norms and the feed-forward (models/layers.py, models/moe.py), the attention
of each layer (models/attention.py), the output projection and the loss (here).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models import embeddings
from models.attention import ATTENTION, self_attention
from models.entmax import entmax_loss
from schema import GPTConfig, dimension_is_split
from models.kernels.lookups import gather
from models.kernels.loss import cross_entropy_and_log_z
from models.kernels.matmul import matmul
from models.kv_cache import DecodeState
from models.layers import dense, dropout, layer_norm, mlp, pre_norm, rezero, variable
from models.moe import moe_feed_forward


@dataclass(frozen=True)
class Dims:
    batch: mtf.Dimension
    sequence: mtf.Dimension
    embd: mtf.Dimension
    vocab: mtf.Dimension
    embed_sequence: mtf.Dimension  # rows of wpe; separate from `sequence` so layouts can treat them apart

    @classmethod
    def of(cls, cfg: GPTConfig, batch_size: int, sequence_length: Optional[int] = None) -> "Dims":
        """The model's dimensions; `sequence_length` (default n_ctx) may be shorter for scoring shorter rows (a
        causal model's logits at a position do not depend on the positions after it); wpe keeps n_ctx rows."""
        return cls(mtf.Dimension("batch", batch_size), mtf.Dimension("sequence", sequence_length or cfg.n_ctx),
                   mtf.Dimension("embd", cfg.n_embd), mtf.Dimension("vocab", cfg.n_vocab),
                   mtf.Dimension("embed_sequence", cfg.n_ctx))


def variable_dtype(cfg: GPTConfig) -> mtf.VariableDType:
    """fp32 master weights; bf16 or fp16 activations when precision is bfloat16 or float16 (float16 trains with
    dynamic loss scaling: train/loss_scale.py). "auto" is resolved per device by every job that runs a model
    (devices/precision.py: training's for_training, the evaluations', sampling's and export's for_inference); where
    it reaches a model unresolved (planning, hand-built graphs) it builds in float32."""
    activation = {"bfloat16": tf.bfloat16, "float16": tf.float16}.get(cfg.precision, tf.float32)
    return mtf.VariableDType(master_dtype=tf.float32, slice_dtype=tf.float32, activation_dtype=activation)


@dataclass(frozen=True)
class ModelOutput:
    # [batch, sequence, vocab] in the activations' dtype: the loss computes in fp32 from bf16 logits without an
    # fp32 copy of them (GPT-Neo 125M at context 2048: 0.4 GB, and its gradient as much); `logits()` is float32
    logits: mtf.Tensor
    moe_loss: Optional[mtf.Tensor]    # the MoE layers' summed load-balancing loss; None without MoE layers


def block(x: mtf.Tensor, layer: int, cfg: GPTConfig, dtype: mtf.VariableDType, train: bool,
          cache: DecodeState | None = None, num_microbatches: int = 1) -> tuple[mtf.Tensor, Optional[mtf.Tensor]]:
    """x + attn(norm_1(x)), then + mlp(norm_2(x)); returns (x, MoE load-balancing loss or None).

    Options: `macaron` adds a half-weighted feed-forward (`mlp_macaron`) before attention and halves the
    last one; `none` layers have no attention sub-layer; a layer in `moe_layers` has a mixture of experts
    for its feed-forward; `rezero` drops the norms and scales each branch by `norm_rezero_*/g`;
    `share_parameters` puts every layer's variables in one scope (GPT-Neo: no `h{i}`), so all layers share them.
    """
    moe_loss = None

    def residual(x, norm_scope, rezero_scope, branch, weight=1.0):
        y = branch(pre_norm(x, norm_scope, cfg, dtype))
        if weight != 1.0:
            y = y * weight
        if cfg.rezero:
            y = rezero(y, rezero_scope, dtype)
        return x + y

    def feed_forward(h):
        nonlocal moe_loss
        if layer in cfg.moe_layers:
            out, moe_loss = moe_feed_forward(h, cfg, dtype, train, num_microbatches)
            return out
        return mlp(h, "mlp", cfg, dtype, train)

    last_weight = 1.0
    with contextlib.nullcontext() if cfg.share_parameters else tf.variable_scope(f"h{layer}"):
        if cfg.macaron:
            x = residual(x, "norm_macaron", "norm_rezero_macaron", lambda h: mlp(h, "mlp_macaron", cfg, dtype, train),
                         weight=0.5)
            last_weight = 0.5
        kind = cfg.attention_types[layer]
        if ATTENTION[kind].has_attention:
            x = residual(x, "norm_1", "norm_rezero_1",
                         lambda h: self_attention(h, "attn", kind, cfg, dtype, train, cache=cache))
        x = residual(x, "norm_2", "norm_rezero_2", feed_forward, weight=last_weight)
        return x, moe_loss


def forward(tokens: mtf.Tensor, cfg: GPTConfig, dims: Dims, train: bool, cache: DecodeState | None = None,
            num_microbatches: int = 1) -> ModelOutput:
    """tokens [batch, sequence] int -> logits [batch, sequence, vocab] (in the activations' dtype) and the MoE
    loss.

    `cache` is for sampling (models/kv_cache.py): in step mode tokens are [batch], the token at
    cache.position - 1, and the logits [batch, vocab] are those for cache.position. `num_microbatches`
    tells the MoE layers what share of the batch this is (train/objective.py).
    """
    mesh = tokens.mesh
    dtype = variable_dtype(cfg)
    with tf.variable_scope("gpt2"):
        wpe = embeddings.position_table(mesh, cfg, dims.embed_sequence, dims.embd, dtype)
        wte = variable(mesh, "wte", [dims.vocab, dims.embd], dtype, stddev=0.02, seed=cfg.seed)
        with tf.variable_scope("token_embd"):
            h = dropout(gather(wte, tokens, dims.vocab, dimension_is_split(cfg, "vocab")), cfg.embed_dropout, train)
        if wpe is not None:  # rotary positions act inside attention instead
            with tf.variable_scope("pos_embd"):
                if cache is not None and cache.incremental:
                    positions = cache.position - 1
                else:
                    positions = mtf.range(mesh, dims.sequence, tf.int32)
                h += dropout(gather(wpe, positions, wpe.shape[0], dimension_is_split(cfg, wpe.shape[0].name)),
                             cfg.embed_dropout, train)

        moe_losses = []
        for layer in range(cfg.n_layer):
            def run_block(x, layer=layer):
                return block(x, layer, cfg, dtype, train, cache, num_microbatches)
            if cfg.recompute_grad and train:
                # Keep only block inputs for the backward pass; recompute the rest (memory for compute).
                if layer in cfg.moe_layers:
                    h, moe_loss = mtf.recompute_grad(run_block, [h])
                else:
                    h, moe_loss = mtf.recompute_grad(lambda x: run_block(x)[0], [h]), None
            else:
                h, moe_loss = run_block(h)
            if moe_loss is not None:
                moe_losses.append(moe_loss)

        h = layer_norm(h, "ln_f", dtype)
        if cfg.no_weight_tie:
            with tf.variable_scope("wte_final_linear"):
                out = dense(h, "linear_out", dims.vocab, cfg, dtype)
        else:
            with tf.variable_scope("wte_final_einsum"):
                out = matmul(h, wte, h.shape.dims[:-1] + [dims.vocab])
        return ModelOutput(out, mtf.add_n(moe_losses) if moe_losses else None)


def logits(tokens: mtf.Tensor, cfg: GPTConfig, dims: Dims, train: bool, cache: DecodeState | None = None) -> mtf.Tensor:
    """tokens [batch, sequence] int -> logits [batch, sequence, vocab] (float32); see `forward`."""
    return mtf.cast(forward(tokens, cfg, dims, train, cache).logits, tf.float32)


def variable_shapes(cfg: GPTConfig) -> dict[str, list]:
    """{name: shape} of the model's variables (no optimizer slots), from building its graph once; nothing is
    allocated. What a checkpoint of this config must hold (tools/hf.py, train/job.py)."""
    with tf.Graph().as_default():
        mesh = mtf.Mesh(mtf.Graph(), "gpt_mesh")
        dims = Dims.of(cfg, 1)
        tokens = mtf.zeros(mesh, mtf.Shape([dims.batch, dims.sequence]), tf.int32)
        logits(tokens, cfg, dims, train=False)
        return {v.name: v.shape.to_integer_list for v in mesh.graph.all_variables}


def loss_weights(labels: mtf.Tensor, cfg: GPTConfig) -> Optional[mtf.Tensor]:
    """Per-position weights of the loss for MLM: 1/count at masked positions (label != padding_id), 0 at the
    rest (unmasked and padding). None for language modelling, whose loss is the mean over all positions.

    Computed on the whole batch, so that micro-batches' weighted sums add up to the whole batch's loss."""
    if cfg.causal:
        return None
    counts = mtf.cast(mtf.not_equal(labels, cfg.padding_id), tf.float32)
    return counts / mtf.maximum(mtf.reduce_sum(counts), 1.0)


def loss(logits_: mtf.Tensor, labels: mtf.Tensor, cfg: GPTConfig, dims: Dims,
         weights: Optional[mtf.Tensor] = None) -> tuple[mtf.Tensor, mtf.Tensor]:
    """The loss (cross-entropy, or with `entmax_loss` the entmax loss: models/entmax.py), and the training
    objective (the loss plus GPT-Neo's z-loss on log Z of the softmax), in float32 from logits of any float dtype.

    Both are means over all positions, or, given `weights` [batch, sequence] (see `loss_weights`), sums
    weighted by them."""
    with tf.variable_scope("xentropy_final"):
        if cfg.entmax_loss or dimension_is_split(cfg, "vocab"):
            logits_ = mtf.cast(logits_, tf.float32)
        if cfg.entmax_loss:
            per_token = entmax_loss(logits_, labels, dims.vocab, cfg.entmax_alpha)
            log_z = mtf.reduce_logsumexp(logits_, dims.vocab) if cfg.z_loss else None
        elif dimension_is_split(cfg, "vocab"):
            per_token = mtf.layers.softmax_cross_entropy_with_logits(logits_, labels, dims.vocab)
            log_z = mtf.reduce_logsumexp(logits_, dims.vocab) if cfg.z_loss else None
        else:  # the same values from one logsumexp, with a fused gradient (models/kernels/loss.py)
            per_token, log_z = cross_entropy_and_log_z(logits_, labels, dims.vocab)
        average = mtf.reduce_mean if weights is None else (lambda t: mtf.reduce_sum(t * weights))
        cross_entropy = average(per_token)
        objective = cross_entropy
        if cfg.z_loss:
            objective += cfg.z_loss * average(mtf.square(log_z))
    return cross_entropy, objective
