"""Autoregressive sampling inside the mesh-tensorflow graph (full recompute of the context each step).

Each row of `tokens` holds its prompt in positions [0, prompt_length); the loop fills one position per
step from the shortest prompt onwards, keeping longer prompts' own tokens where they still run.
"""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models import gpt
from models.config import GPTConfig


def top_k_filter(logits: mtf.Tensor, vocab: mtf.Dimension, k: int) -> mtf.Tensor:
    """Sets every logit below the k-th largest of its row to -1e10."""
    if not k or k >= vocab.size:
        return logits
    values, _ = mtf.top_k(logits, vocab, mtf.Dimension("top_k", k))
    kth = mtf.reduce_min(values, reduced_dim=values.shape.dims[-1])
    return mtf.where(mtf.less(logits, kth), mtf.zeros_like(logits) - 1e10, logits)


def sample(tokens: mtf.Tensor, prompt_lengths: mtf.Tensor, cfg: GPTConfig, dims: gpt.Dims,
           max_new_tokens: int, temperature: float, top_k: int, stop_id: int | None) -> mtf.Tensor:
    """tokens [batch, sequence] int32, prompt_lengths [batch] int32 -> tokens with the samples filled in."""
    mesh = tokens.mesh
    # Build the model once outside the loop: mtf variables must exist before a while_loop body reuses them.
    gpt.logits(tokens, cfg, dims, train=False)
    start = mtf.reduce_min(prompt_lengths)
    end = mtf.minimum(start + max_new_tokens, cfg.n_ctx)
    done = mtf.zeros(mesh, [dims.batch], tf.int32)

    def cond(position, tokens_, done_):
        return mtf.logical_and(mtf.less(position, end), mtf.less(mtf.reduce_min(done_), 1))

    def body(position, tokens_, done_):
        step_logits = mtf.gather(gpt.logits(tokens_, cfg, dims, train=False), position - 1, dims.sequence)
        step_logits = top_k_filter(step_logits, dims.vocab, top_k)
        new = mtf.sample_with_temperature(step_logits, dims.vocab, temperature)
        in_prompt = mtf.less(position, prompt_lengths)
        new = mtf.where(in_prompt, mtf.gather(tokens_, position, dims.sequence), new)
        write = mtf.one_hot(position, dims.sequence, dtype=tf.int32)
        tokens_ = tokens_ * (1 - write) + new * write
        if stop_id is not None:
            stopped = mtf.logical_and(mtf.equal(new, stop_id), mtf.logical_not(in_prompt))
            done_ = mtf.maximum(done_, mtf.cast(stopped, tf.int32))
        return position + 1, tokens_, done_

    _, tokens, _ = mtf.while_loop(cond, body, [start, tokens, done])
    return tokens
