"""Self-attention: GPT-Neo's projections and one function per attention type, chosen per layer.

Adding an attention type is one function `fn(q, k, v, ctx) -> output` and one `@register("name")`; the
config accepts every registered name in `attention_types`.

Like GPT-Neo (and HF's GPTNeo), attention logits are NOT scaled by 1/sqrt(head_size): the query
projection's init absorbs that factor instead. Checkpoints trained either way load into the other, so
this must stay as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import mesh_tensorflow as mtf
import mesh_tensorflow.transformer.attention as mtf_attention
import tensorflow.compat.v1 as tf

from models import kv_cache
from models.config import GPTConfig
from models.layers import dropout, variable

ATTENTION: dict[str, Callable] = {}


def register(name: str):
    def add(fn):
        ATTENTION[name] = fn
        return fn
    return add


@dataclass(frozen=True)
class AttentionContext:
    cfg: GPTConfig
    train: bool
    sequence: mtf.Dimension
    memory_length: mtf.Dimension   # the key/value copy of `sequence`, so q and k can differ in length
    kv: mtf.Dimension              # features_per_head


def _mtf_attention_kwargs(ctx: AttentionContext) -> dict:
    """Dropout settings for mtf's `attention`, which reads only `context.train` and `context.model.layout /
    mesh_shape` (left None: no 2-D resharding of attention, as in GPT-Neo)."""
    rate = ctx.cfg.attn_dropout if ctx.train else 0.0
    context = SimpleNamespace(train=rate > 0, model=SimpleNamespace(layout=None, mesh_shape=None))
    return {"dropout_rate": rate, "context": context}


@register("global")
def global_attention(q, k, v, ctx: AttentionContext) -> mtf.Tensor:
    """Full causal attention: position t sees positions 0..t."""
    k = mtf.replace_dimensions(k, ctx.sequence, ctx.memory_length)
    v = mtf.replace_dimensions(v, ctx.sequence, ctx.memory_length)
    query_pos = mtf.range(q.mesh, ctx.sequence, tf.int32)
    memory_pos = mtf.range(q.mesh, ctx.memory_length, tf.int32)
    future = mtf.less(query_pos, memory_pos)  # [sequence, memory_length]
    bias = mtf.cast(future, q.dtype) * -1e10
    return mtf_attention.attention(q, k, v, memory_length_dim=ctx.memory_length, key_dim=ctx.kv,
                                   value_dim=ctx.kv, bias=bias, **_mtf_attention_kwargs(ctx))


@register("local")
def local_attention(q, k, v, ctx: AttentionContext) -> mtf.Tensor:
    """Sliding-window causal attention: position t sees t - radius + 1 .. t (mesh-tensorflow's blocked
    implementation, cost linear in sequence length)."""
    return mtf_attention.local_attention_1d(q, k, v, length_dim=ctx.sequence, key_dim=ctx.kv, value_dim=ctx.kv,
                                            radius=ctx.cfg.local_attention_radius, length_dim_num_splits=1,
                                            fully_autoregressive=True,
                                            attention_kwargs=_mtf_attention_kwargs(ctx))


def self_attention(x: mtf.Tensor, scope: str, attention_type: str, cfg: GPTConfig, dtype: mtf.VariableDType,
                   train: bool, cache: "kv_cache.DecodeState | None" = None) -> mtf.Tensor:
    """Projections q/k/v/o and output bias under GPT-Neo's names, around the chosen attention function.

    The weights are 2-D [embd, heads*kv] with the combined dimension named "heads", exactly as
    mesh-tensorflow's `attention_params_simple` lays them out, so a "heads:y" layout splits them by head.

    `cache` (sampling only, see models/kv_cache.py): in prefill mode this layer's keys and values are
    recorded; in step mode x is [batch, embd] and the one query attends over the cache.
    """
    embd = x.shape.dims[-1]
    heads = mtf.Dimension("heads", cfg.n_head)
    kv = mtf.Dimension("features_per_head", cfg.head_size)
    combined = mtf.Dimension("heads", cfg.n_head * cfg.head_size)
    with tf.variable_scope(scope):
        # Init as mesh-tensorflow's AttentionParams does, with the 1/sqrt(kv) scaling folded into q.
        wq = variable(x.mesh, "q", [embd, combined], dtype, stddev=(embd.size * kv.size) ** -0.5, seed=cfg.seed)
        wk = variable(x.mesh, "k", [embd, combined], dtype, stddev=embd.size ** -0.5, seed=cfg.seed)
        wv = variable(x.mesh, "v", [embd, combined], dtype, stddev=embd.size ** -0.5, seed=cfg.seed)
        wo = variable(x.mesh, "o", [combined, embd], dtype, stddev=combined.size ** -0.5, seed=cfg.seed)

        def project(w):
            y = mtf.einsum([x, w], reduced_dims=[embd])
            return mtf.replace_dimensions(y, combined, [heads, kv])

        q, k, v = project(wq), project(wk), project(wv)
        if cache is not None and cache.incremental:
            with tf.variable_scope("attention"):
                a = kv_cache.attend_step(q, k, v, attention_type, cfg, cache, kv)
        else:
            sequence = x.shape.dims[1]
            ctx = AttentionContext(cfg, train, sequence, mtf.Dimension("memory_length", sequence.size), kv)
            if cache is not None:
                kv_cache.record_prefill(cache, k, v, ctx.sequence, ctx.memory_length)
            with tf.variable_scope("attention"):
                a = ATTENTION[attention_type](q, k, v, ctx)
        a = mtf.replace_dimensions(a, [heads, kv], combined)
        out = mtf.einsum([a, wo], reduced_dims=[combined])
        with tf.variable_scope("compute_output_bias"):
            out += variable(x.mesh, "o_b", [embd], dtype, constant=0.0)
        return dropout(out, cfg.res_dropout, train)
