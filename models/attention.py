"""Self-attention: GPT-Neo's projections and one function per attention type, chosen per layer.

Adding an attention type is one function `fn(q, k, v, ctx) -> output` under one `@register(...)`, whose
arguments are everything the rest of the code asks of the type: how many keys a query covers (model FLOPs,
MFU, --dry_run), how incremental decoding treats it (a key/value cache window, or full recompute), its own
config checks, and the tensor dimensions it adds and its own checks of a mesh and layout (models/layout.py).
The config accepts every registered name in `attention_types`. Each type has a causal form (language
modelling: position t sees positions <= t) and a bidirectional one (`ctx.causal` false, for MLM). `none` is
registered without a function: such layers have no attention sub-layer (PAR transformer).

Like GPT-Neo (and HF's GPTNeo), attention logits are NOT scaled by 1/sqrt(head_size): the query
projection's init absorbs that factor instead. Checkpoints trained either way load into the other, so
this must stay as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models import kv_cache
from schema import ConfigError, GPTConfig, closest, dimension_is_split
from models.embeddings import rotary
from models.kernels import attention as attention_kernels
from models.kernels.attention import local_attention_blocks
from models.kernels.common import MASKED
from models.kernels.matmul import bias_add, matmul, stacked_matmul
from models.layers import dropout, variable

FULL_RECOMPUTE = "full recompute"  # decode_window of a type without an incremental (kv-cache) path


def _no_checks(cfg: GPTConfig) -> None:
    pass


def _no_dims(cfg: GPTConfig) -> dict[str, int]:
    return {}


def self_attention_dims(cfg: GPTConfig) -> dict[str, int]:
    """The dimensions every attention sub-layer has (`self_attention`'s projections, the keys and values an
    attention function and the kv cache see) that a layout may split."""
    return {"heads": cfg.n_head, "features_per_head": cfg.head_size, "memory_length": cfg.n_ctx}


# Groups of self-attention's dimensions that appear together in one tensor: a layout may not split two of a
# group over the same mesh dimension (models/layout.py).
SELF_ATTENTION_CO_OCCURRING_DIMS = (
    ("embd", "heads"), ("batch", "sequence", "heads", "features_per_head"),
    ("batch", "heads", "sequence", "memory_length"),
    ("batch", "heads", "memory_length", "features_per_head"),  # k and v over the keys, and the kv cache
)


@dataclass(frozen=True)
class AttentionType:
    """One registered attention type and everything the rest of the code asks of it."""
    name: str
    fn: Optional[Callable]  # (q, k, v, ctx) -> output like q; None: the layer has no attention sub-layer
    # (cfg) -> how many keys one query's score and value matmuls cover, on average (models/flops.py)
    keys_per_query: Callable[[GPTConfig], float]
    # (cfg) -> how many past positions a query sees in a kv-cache decoding step (None: all of them), or
    # FULL_RECOMPUTE: sampling runs the whole context again for every new token (models/sampling.py)
    decode_window: Callable[[GPTConfig], Any] = lambda cfg: FULL_RECOMPUTE
    check: Callable[[GPTConfig], None] = _no_checks  # raises ConfigError for configs the type cannot run
    # (cfg) -> {dimension: size} the type adds to self_attention_dims (or resizes) that a layout may split
    layout_dims: Callable[[GPTConfig], dict] = _no_dims
    co_occurring_dims: tuple = ()  # groups of dimensions together in one of the type's tensors
    # raises ConfigError for a mesh_shape and layout the type cannot run on (models/layout.py calls it)
    check_layout: Callable[[GPTConfig], None] = _no_checks

    @property
    def has_attention(self) -> bool:
        return self.fn is not None


ATTENTION: dict[str, AttentionType] = {}


def register(name: str, keys_per_query: Callable[[GPTConfig], float],
             decode_window: Optional[Callable[[GPTConfig], Any]] = None,
             check: Optional[Callable[[GPTConfig], None]] = None,
             layout_dims: Optional[Callable[[GPTConfig], dict]] = None, co_occurring_dims: tuple = (),
             check_layout: Optional[Callable[[GPTConfig], None]] = None):
    """Registers the decorated `fn(q, k, v, ctx)` as attention type `name` (see AttentionType)."""
    def add(fn):
        ATTENTION[name] = AttentionType(name, fn, keys_per_query, decode_window or (lambda cfg: FULL_RECOMPUTE),
                                        check or _no_checks, layout_dims or _no_dims, tuple(co_occurring_dims),
                                        check_layout or _no_checks)
        return fn
    return add


def check_attention_types(cfg: GPTConfig) -> None:
    """Every name in attention_types is registered, some layer attends, and each type's own checks pass."""
    for kind in dict.fromkeys(cfg.attention_types):
        if kind not in ATTENTION:
            raise ConfigError(f"attention type {kind!r} is not known: choose from {', '.join(ATTENTION)}"
                              f"{closest(kind, ATTENTION)}")
    if not any(ATTENTION[kind].has_attention for kind in cfg.attention_types):
        used = " or ".join(map(repr, dict.fromkeys(cfg.attention_types)))
        attending = [name for name, kind in ATTENTION.items() if kind.has_attention]
        raise ConfigError(f"attention_types are all {used}, so no position sees another: make at least one layer "
                          f"{', '.join(attending[:-1])} or {attending[-1]}")
    if cfg.num_mem_kv and "global" not in cfg.attention_types:
        raise ConfigError("num_mem_kv adds memory key/values to global attention layers, and this model has "
                          "none: add a global layer or set num_mem_kv to 0")
    for kind in dict.fromkeys(cfg.attention_types):
        ATTENTION[kind].check(cfg)


def _global_keys(cfg: GPTConfig) -> float:
    """Causal: half the context on average; bidirectional: all of it; plus the memory key/values."""
    return (cfg.n_ctx / 2 if cfg.causal else cfg.n_ctx) + cfg.num_mem_kv


def _local_keys(cfg: GPTConfig) -> float:
    return min(cfg.local_attention_radius * (1 if cfg.causal else 2), cfg.n_ctx)


def _check_local(cfg: GPTConfig) -> None:
    """Local attention cuts the sequence into blocks that keep the name 'sequence': a layout splitting
    'sequence' must divide their count."""
    mesh, mapping = dict(cfg.mesh_dims), dict(cfg.layout_rules)
    if "sequence" in mapping:
        blocks = local_attention_blocks(cfg.n_ctx, cfg.local_attention_radius)
        ways = mesh[mapping["sequence"]]
        if blocks % ways:
            raise ConfigError(f"local attention cuts the sequence into {blocks} blocks, which {ways}-way splitting of "
                              f"'sequence' over {mapping['sequence']!r} does not divide: split 'sequence' over a mesh "
                              f"dimension dividing {blocks}, or leave it whole")


@dataclass(frozen=True)
class AttentionContext:
    cfg: GPTConfig
    train: bool
    sequence: mtf.Dimension
    memory_length: mtf.Dimension   # the key/value copy of `sequence`, so q and k can differ in length
    kv: mtf.Dimension              # features_per_head
    causal: bool = True            # False for masked language modelling: every position sees every other
    dtype: Optional[mtf.VariableDType] = None  # for attention types with variables of their own


def _mtf_attention_kwargs(ctx: AttentionContext) -> dict:
    """Dropout settings for mtf's `attention`, which reads only `context.train` and `context.model.layout /
    mesh_shape` (left None: no 2-D resharding of attention, as in GPT-Neo)."""
    rate = ctx.cfg.attn_dropout if ctx.train else 0.0
    context = SimpleNamespace(train=rate > 0, model=SimpleNamespace(layout=None, mesh_shape=None))
    return {"dropout_rate": rate, "context": context}


def _blocked_causal_attention_fits(ctx: AttentionContext, memory_length: mtf.Dimension) -> bool:
    """Whether models/kernels/attention.causal_attention can run here: it needs each device to hold whole
    sequences (neither length split over the mesh), and it has no attention dropout."""
    split = dimension_is_split(ctx.cfg, ctx.sequence.name) or dimension_is_split(ctx.cfg, memory_length.name)
    return not split and not _mtf_attention_kwargs(ctx)["dropout_rate"]


@register("global", keys_per_query=_global_keys,
          # memory key/values are not in the cache: such models decode by full recompute
          decode_window=lambda cfg: FULL_RECOMPUTE if cfg.num_mem_kv else None,
          layout_dims=lambda cfg: {"memory_length": cfg.n_ctx + cfg.num_mem_kv})  # the memory slots come first
def global_attention(q, k, v, ctx: AttentionContext) -> mtf.Tensor:
    """Full attention: position t sees positions 0..t (causal) or all of them. With num_mem_kv, learned
    memory key/values (all-attention, Sukhbaatar et al. 2019) come first and every query sees them."""
    k = mtf.replace_dimensions(k, ctx.sequence, ctx.memory_length)
    v = mtf.replace_dimensions(v, ctx.sequence, ctx.memory_length)
    memory_length, n_mem = ctx.memory_length, ctx.cfg.num_mem_kv
    if n_mem:
        k, v = _with_memory_key_values(k, v, ctx)
        memory_length = k.shape.get_dim_by_name(ctx.memory_length.name)
    if ctx.causal and not n_mem and _blocked_causal_attention_fits(ctx, memory_length) and \
            attention_kernels.causal_blocks_pay(ctx.sequence.size):
        # blocks of queries against the keys up to their own end: the masked half of the square is skipped
        return attention_kernels.causal_attention(q, k, v, ctx.sequence, memory_length, ctx.kv, ctx.kv)
    bias = None
    if ctx.causal:
        query_pos = mtf.range(q.mesh, ctx.sequence, tf.int32)
        memory_pos = mtf.range(q.mesh, memory_length, tf.int32) - n_mem  # memory slots sit at negative positions
        future = mtf.less(query_pos, memory_pos)  # [sequence, memory_length]
        bias = mtf.cast(future, tf.float32) * MASKED  # float32: MASKED is -inf in float16, and 0 * -inf is NaN
    # mtf's attention math, with the logits laid out for batched matmuls (models/kernels/attention.py)
    return attention_kernels.attention(q, k, v, memory_length_dim=memory_length, key_dim=ctx.kv, value_dim=ctx.kv,
                                       bias=bias, memory_split=dimension_is_split(ctx.cfg, memory_length.name),
                                       **_mtf_attention_kwargs(ctx))


def _with_memory_key_values(k: mtf.Tensor, v: mtf.Tensor, ctx: AttentionContext) -> tuple[mtf.Tensor, mtf.Tensor]:
    """Prepends num_mem_kv learned keys and values (per head) to k and v along memory_length. Variables as
    GPT-Neo's: `memory_key_values/mem_k`, `mem_v` of shape [mem_kv_sequence, heads, features_per_head]."""
    cfg = ctx.cfg
    slots = mtf.Dimension("mem_kv_sequence", cfg.num_mem_kv)
    heads = k.shape.get_dim_by_name("heads")
    with tf.variable_scope("memory_key_values"):
        stddev = ctx.kv.size ** -0.5
        mem_k = variable(k.mesh, "mem_k", [slots, heads, ctx.kv], ctx.dtype, stddev=stddev, seed=cfg.seed)
        mem_v = variable(k.mesh, "mem_v", [slots, heads, ctx.kv], ctx.dtype, stddev=stddev, seed=cfg.seed)
    memory_slots = mtf.Dimension(ctx.memory_length.name, cfg.num_mem_kv)
    shape = k.shape.resize_dimension(ctx.memory_length.name, cfg.num_mem_kv)

    def prepend(memory, x):
        memory = mtf.broadcast(mtf.replace_dimensions(memory, slots, memory_slots), shape)
        return mtf.concat([memory, x], ctx.memory_length.name)

    return prepend(mem_k, k), prepend(mem_v, v)


@register("local", keys_per_query=_local_keys, decode_window=lambda cfg: cfg.local_attention_radius,
          check_layout=_check_local)
def local_attention(q, k, v, ctx: AttentionContext) -> mtf.Tensor:
    """Sliding-window attention (cost linear in sequence length). Causal: position t sees t - radius + 1 .. t,
    in blocks of queries against only the keys they see where neither the sequence is split nor attention
    dropped out (models/kernels/attention.causal_attention); else, and bidirectional (t - radius + 1 .. t + radius),
    mesh-tensorflow's blocked implementation with its halo exchange."""
    radius = ctx.cfg.local_attention_radius
    if ctx.causal and _blocked_causal_attention_fits(ctx, ctx.sequence) and \
            attention_kernels.causal_blocks_pay(ctx.sequence.size, radius):
        return attention_kernels.causal_attention(q, k, v, ctx.sequence, ctx.sequence, ctx.kv, ctx.kv, radius)
    return attention_kernels.local_attention_1d(q, k, v, length_dim=ctx.sequence, key_dim=ctx.kv, value_dim=ctx.kv,
                                                radius=radius, fully_autoregressive=ctx.causal,
                                                attention_kwargs=_mtf_attention_kwargs(ctx))


# A [head_size, head_size] state per head read and written, plus half a chunk.
@register("linear", keys_per_query=lambda cfg: 1.5 * cfg.head_size)
def linear_attention(q, k, v, ctx: AttentionContext) -> mtf.Tensor:
    """Efficient attention (Shen et al. 2018, arXiv:1812.01243), GPT-Neo's `linear`: queries are a softmax
    over their features, keys a softmax over the positions a query sees, and

        out[t] = sum_d q[t, d] * sum_{s <= t} exp(k[s, d]) v[s] / sum_{s <= t} exp(k[s, d])

    (all s when bidirectional). Cost and memory are linear in sequence length: no attention matrix, and
    the causal form runs in chunks (see `_causal_linear_attention`), never holding GPT-Neo's
    [batch, sequence, heads, d, d] running sums. Computed in float32 (exp and long sums lose too much in
    bfloat16); no attention dropout, as there are no attention weights to drop.
    """
    dtype = q.dtype
    q, k, v = (mtf.cast(t, tf.float32) for t in (q, k, v))
    value = mtf.Dimension("linear_value_features", ctx.kv.size)  # v's features, apart from q and k's
    v = mtf.rename_dimension(v, ctx.kv.name, value.name)
    q = mtf.softmax(q, ctx.kv)
    if ctx.causal:
        out = _causal_linear_attention(q, k, v, ctx, value)
    else:
        k = mtf.softmax(k, ctx.sequence)
        context = mtf.einsum([k, v], reduced_dims=[ctx.sequence])  # [batch, heads, d, value]
        out = mtf.einsum([q, context], output_shape=q.shape.rename_dimension(ctx.kv.name, value.name))
    return mtf.cast(mtf.rename_dimension(out, value.name, ctx.kv.name), dtype)


def linear_attention_chunk(sequence_length: int, head_size: int) -> int:
    """Chunk length of causal linear attention: the largest divisor of the sequence length up to head_size.
    Memory is sequence * chunk (within chunks) plus (sequence / chunk) * head_size**2 (the running sums at
    chunk boundaries), least near chunk = head_size."""
    return max(c for c in range(1, min(sequence_length, head_size) + 1) if sequence_length % c == 0)


def _causal_linear_attention(q, k, v, ctx: AttentionContext, value: mtf.Dimension) -> mtf.Tensor:
    """Causal linear attention in chunks of C positions (q already softmaxed over features; all float32).

    Folding the normaliser into the query, q'[t, d] = q[t, d] / Z[t, d] with Z[t, d] = sum_{s <= t} e[s, d]
    and e = exp(k), the output is sum_{s <= t} (q'[t] . e[s]) v[s]: for earlier chunks through their
    summed e[s] (x) v[s] ([d, value] per chunk), within a chunk through a masked C x C product. Largest
    tensors: [batch, chunks, heads, d, value] and [batch, chunks, heads, C, C], both O(sequence * d) for
    C = d, instead of O(sequence * d**2).

    exp(k) is stabilised by subtracting, per chunk, the running maximum of k over this and earlier chunks
    (never a later one, so nothing leaks from the future; earlier chunks' sums are rescaled to it). The
    result does not depend on the stabiliser, so it carries no gradient. Nothing overflows (GPT-Neo's
    unstabilised exp does for keys above 88). The one limit: a key more than ~85 above an earlier key of
    the same feature in the same chunk underflows that earlier position's sums to zero; per-position
    stabilisers would need the O(sequence * d**2) memory this avoids. The running maximum over chunks is a
    [chunks, chunks, d] product per batch and head, (sequence / d)**2 * d, below sequence * d while
    sequence < d**2.
    """
    mesh, sequence, d = q.mesh, ctx.sequence, ctx.kv
    length = linear_attention_chunk(sequence.size, d.size)
    chunks = mtf.Dimension(sequence.name, sequence.size // length)  # keeps the name: a sequence split carries over
    chunk = mtf.Dimension("linear_chunk", length)
    q, k, v = (mtf.replace_dimensions(t, sequence, [chunks, chunk]) for t in (q, k, v))

    earlier = mtf.Dimension("linear_earlier_chunks", chunks.size)  # the chunks a chunk draws on
    def as_earlier(t):
        return mtf.rename_dimension(t, chunks.name, earlier.name)
    chunk_index, earlier_index = mtf.range(mesh, chunks, tf.int32), mtf.range(mesh, earlier, tf.int32)

    chunk_max = mtf.stop_gradient(mtf.reduce_max(k, reduced_dim=chunk))          # [b, chunks, h, d]
    up_to_here = mtf.cast(mtf.less_equal(earlier_index, chunk_index), tf.float32)  # [chunks, earlier]
    running_max = mtf.reduce_max(as_earlier(chunk_max) * up_to_here - 1e30 * (1 - up_to_here), reduced_dim=earlier)
    e = mtf.exp(k - running_max)                                                  # <= 1

    # Sums over each chunk, then carried to later chunks, rescaled to the later chunk's stabiliser.
    chunk_kv = mtf.einsum([e, v], reduced_dims=[chunk])                          # [b, chunks, h, d, value]
    chunk_z = mtf.reduce_sum(e, reduced_dim=chunk)                                # [b, chunks, h, d]
    before = mtf.cast(mtf.less(earlier_index, chunk_index), tf.float32)           # [chunks, earlier]
    rescale = mtf.exp(mtf.minimum(as_earlier(running_max) - running_max, 0.0)) * before
    carried_kv = mtf.einsum([rescale, as_earlier(chunk_kv)], reduced_dims=[earlier])
    carried_z = mtf.einsum([rescale, as_earlier(chunk_z)], reduced_dims=[earlier])

    z = carried_z + mtf.cumsum(e, chunk)                                          # Z[t] >= e[t] > 0
    q = q / mtf.maximum(z, 1e-30)
    out_shape = q.shape.rename_dimension(d.name, value.name)
    from_earlier = mtf.einsum([q, carried_kv], output_shape=out_shape)
    key_in_chunk = mtf.Dimension("linear_memory_chunk", length)
    scores = mtf.einsum([q, mtf.rename_dimension(e, chunk.name, key_in_chunk.name)], reduced_dims=[d])
    seen = mtf.cast(mtf.less_equal(mtf.range(mesh, key_in_chunk, tf.int32), mtf.range(mesh, chunk, tf.int32)),
                    tf.float32)
    within = mtf.einsum([scores * seen, mtf.rename_dimension(v, chunk.name, key_in_chunk.name)],
                        output_shape=out_shape)
    return mtf.replace_dimensions(from_earlier + within, [chunks, chunk], sequence)


# Feed-forward-only layers (PAR transformer, Mandava et al. 2020): `gpt.block` skips attention for them.
ATTENTION["none"] = AttentionType("none", None, keys_per_query=lambda cfg: 0.0, decode_window=lambda cfg: None)


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

        # q, k and v in one product with the three weights side by side (the checkpoint keeps GPT-Neo's three
        # variables): a 3x wider matmul runs nearer the CPU's peak than three, above all the weights' gradient,
        # x^T dy (oneDNN on AVX2: 111 GFLOP/s at 512 columns, 173 at 1536), and decoding launches one
        # matrix-vector product where it launched three (each ~60 us of overhead on a 2-core CPU).
        qkv = mtf.Dimension("qkv", 3)
        free = [d for d in x.shape.dims if d != embd]
        if cache is not None and cache.incremental:  # a step: the weights as prefill stacked them, once
            (stacked,) = cache.take(1)
            cache.record(stacked)
            y = matmul(x, stacked, free + [qkv, combined])
        else:  # stacked in the graph, for the forward and again for the backward pass (StackedMatmulOperation)
            y = stacked_matmul(x, [wq, wk, wv], qkv, free + [qkv, combined])
            if cache is not None:  # prefill: stacked once more, kept for the steps with the key/value caches
                cache.record(mtf.stack([wq, wk, wv], qkv.name, axis=1))
        y = mtf.replace_dimensions(y, combined, [heads, kv])
        if len(free) == 2:  # [batch, sequence]: one transpose to [qkv, batch, heads, sequence, kv], the layout
            # attention's batched matmuls take, whose split along qkv is free (TF unstacks a leading axis without
            # copying); three transposes of q, k and v otherwise
            y = mtf.transpose(y, [qkv, free[0], heads, free[1], kv])
        q, k, v = mtf.unstack(y, qkv)
        if cache is not None and cache.incremental:
            with tf.variable_scope("attention"):
                a = kv_cache.attend_step(q, k, v, ATTENTION[attention_type].decode_window(cfg), cfg, cache, kv)
        else:
            sequence = x.shape.dims[1]
            if cfg.rotary_emb:
                q, k = rotary(q, sequence, kv), rotary(k, sequence, kv)
            ctx = AttentionContext(cfg, train, sequence, mtf.Dimension("memory_length", sequence.size), kv,
                                   causal=cfg.causal, dtype=dtype)
            if cache is not None:
                kv_cache.record_prefill(cache, k, v, ctx.sequence, ctx.memory_length)
            with tf.variable_scope("attention"):
                a = ATTENTION[attention_type].fn(q, k, v, ctx)
        a = mtf.replace_dimensions(attention_kernels.laid_out(a, [d for d in a.shape.dims if d not in (heads, kv)]
                                                             + [heads, kv]), [heads, kv], combined)
        out = matmul(a, wo, [d for d in a.shape.dims if d != combined] + [embd])
        with tf.variable_scope("compute_output_bias"):
            out = bias_add(out, variable(x.mesh, "o_b", [embd], dtype, constant=0.0))
        return dropout(out, cfg.res_dropout, train)


def incremental_unsupported(cfg: GPTConfig) -> Optional[str]:
    """None if `cfg` can be decoded with the kv cache (models/sampling.py's loop or models/compiled_decoding.py),
    else why not (then the sampler recomputes in full): an
    attention type whose registry entry has no decode window, or a model option outside
    kv_cache.INCREMENTAL_SAFE_OPTIONS."""
    for kind in sorted(set(cfg.attention_types)):
        if ATTENTION[kind].decode_window(cfg) == FULL_RECOMPUTE:
            return f"attention type {kind!r} has no incremental path" + (
                " with num_mem_kv" if kind == "global" else "")
    extra = [option for option in cfg.model_options() if option.split("=")[0] not in kv_cache.INCREMENTAL_SAFE_OPTIONS]
    return f"option {extra[0]} has no incremental path" if extra else None


def uses_cache(cfg: GPTConfig, options) -> bool:
    """Whether a generation with sampling `options` (models/sampling.SamplingOptions) decodes `cfg` with the kv
    cache: asked for (`options.incremental`) and possible (`incremental_unsupported`)."""
    return options.incremental and incremental_unsupported(cfg) is None
