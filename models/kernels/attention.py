"""Attention. mtf lays the attention logits out like q ([batch, sequence, heads, memory]), so TF's einsum
transposes them inside every attention matmul, forward and backward. `attention` transposes q, k, v once so
that every einsum is a plain batched matmul, and uses one softmax kernel with an XLA-fused gradient (attention
einsums 3x faster); `local_attention_1d` is mtf's blocked local attention on top of it. The softmax needs the
memory dimension whole on each device; where the layout splits it, the caller says so (`memory_split`) and
the softmax is mtf's, which reduces across devices."""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels.common import compiled, f32


def local_attention_block_length(n_ctx: int, radius: int) -> int:
    """The block length local attention cuts the sequence into (mesh-tensorflow's local_attention_1d rule):
    the largest divisor of n_ctx not above max(radius, 128)."""
    block_length = max(radius, 128)
    while n_ctx % block_length:
        block_length -= 1
    return block_length


def local_attention_blocks(n_ctx: int, radius: int) -> int:
    """How many blocks local attention cuts the sequence into: the blocks keep the name 'sequence', so a
    layout that splits 'sequence' splits them."""
    return n_ctx // local_attention_block_length(n_ctx, radius)


@tf.function(jit_compile=True)
def _softmax_backward(y, dy):
    dtype, y, dy = y.dtype, f32(y), f32(dy)
    return tf.cast((dy - tf.reduce_sum(dy * y, axis=-1, keepdims=True)) * y, dtype)


def softmax(logits: mtf.Tensor, dim: mtf.Dimension, split: bool) -> mtf.Tensor:
    """Softmax over `dim` (the last dimension), one tf.nn.softmax per slice and an XLA-fused gradient, instead
    of mtf.softmax's exp(x - logsumexp(x)) chain (a dozen passes forward and backward). `split`: the layout
    splits `dim` (then mtf.softmax, which reduces across the split)."""
    if split or logits.shape.dims[-1] != dim:
        return mtf.softmax(logits, dim)
    splittable = [d for d in logits.shape.dims if d != dim]

    def grad_function(op, dy):
        y = op.outputs[0]
        dx = mtf.slicewise(lambda y_, dy_: compiled(_softmax_backward, y_, dy_), [y, dy], output_shape=y.shape,
                           output_dtype=y.dtype, splittable_dims=splittable, grad_function=0, name="softmax_grad")
        return [dx]

    return mtf.slicewise(lambda x: tf.nn.softmax(x, axis=-1), [logits], output_shape=logits.shape,
                         output_dtype=logits.dtype, splittable_dims=splittable, grad_function=grad_function,
                         name="softmax")


def attention(q, k, v, memory_length_dim, key_dim, value_dim, bias=None, dropout_rate=0.0, context=None,
              memory_split: bool = False) -> mtf.Tensor:
    """mesh-tensorflow's `transformer.attention.attention` (fp32 logits, bias, softmax over memory, dropout,
    weighted values), with the logits laid out [shared dims (batch, heads, ...), query dims, memory].

    mtf orders the logits like q ([batch, sequence, heads, memory]), so every attention einsum, forward and
    backward, makes TF transpose the [.., sequence, memory]-sized tensor to reach a batched matmul. Here q, k,
    v are transposed once to [batch, heads, length, features] and every einsum is a plain batched matmul
    (2x faster on the benchmark model); the softmax runs over the last dimension."""
    output_shape = q.shape - key_dim + value_dim
    shared = [d for d in q.shape.dims if d in k.shape.dims and d != key_dim]
    query_only = [d for d in q.shape.dims if d not in k.shape.dims]
    # Explicit transposes, once: [shared..., length, features] for q and k, [shared..., features, memory] for v.
    # Then each einsum here and in mtf's gradients (which put the output gradient first) is a batched matmul
    # whose result needs no transpose; TF's einsum would otherwise transpose inside every call, slower.
    q = mtf.transpose(mtf.cast(q, tf.float32), shared + query_only + [key_dim])
    k = mtf.transpose(mtf.cast(k, tf.float32), shared + [memory_length_dim, key_dim])
    v = mtf.transpose(v, shared + [value_dim, memory_length_dim])
    logits = mtf.einsum([q, k], output_shape=mtf.Shape(shared + query_only + [memory_length_dim]))
    if bias is not None:
        logits += mtf.cast(bias, logits.dtype)
    weights = mtf.cast(softmax(logits, memory_length_dim, memory_split), v.dtype)
    if context is not None and context.train and dropout_rate > 0:
        weights = mtf.dropout(weights, is_training=True, rate=dropout_rate)
    out = mtf.einsum([weights, v], output_shape=mtf.Shape(shared + query_only + [value_dim]))
    return mtf.transpose(out, output_shape)


def local_attention_1d(q, k, v, length_dim, key_dim, value_dim, radius: int, fully_autoregressive: bool = True,
                       attention_kwargs=None) -> mtf.Tensor:
    """mesh-tensorflow's `local_attention_1d` (one split of the length, no sequence ids or priorities): blocks
    of queries (local_attention_block_length above: the largest divisor of the length not above
    max(radius, 128)) attend to their block and the `radius` positions before it (and after it when not fully
    autoregressive), through `attention` above. Same blocks, halo exchange and visibility mask."""
    block_length = local_attention_block_length(length_dim.size, radius)
    query_block = mtf.Dimension("query_block_length", block_length)
    memory_block = mtf.Dimension("memory_block_length", block_length)
    num_blocks = mtf.Dimension(length_dim.name, length_dim.size // block_length)
    exchange = mtf.left_halo_exchange if fully_autoregressive else mtf.halo_exchange

    def as_query(x):
        return mtf.replace_dimensions(x, length_dim, [num_blocks, query_block])

    def as_memory(x):
        return exchange(mtf.replace_dimensions(x, length_dim, [num_blocks, memory_block]), num_blocks, memory_block,
                        radius)

    q, k, v = as_query(q), as_memory(k), as_memory(v)
    sequence_id = 1 + mtf.zeros(q.mesh, [length_dim], tf.int32)  # 0 in the halo's padding before the first block
    pos = mtf.range(q.mesh, length_dim, dtype=tf.int32)
    relative_position = as_memory(pos) - as_query(pos)
    visible = mtf.equal(as_query(sequence_id), as_memory(sequence_id))
    visible = mtf.logical_and(visible, mtf.greater(relative_position, -radius))
    visible = mtf.logical_and(visible, mtf.less_equal(relative_position, 0 if fully_autoregressive else radius))
    bias = mtf.cast(mtf.logical_not(visible), tf.float32) * -1e9  # float32 as the logits (-inf * 0 in float16)
    padded = mtf.Dimension("memory_block_length", (1 if fully_autoregressive else 2) * radius + block_length)
    o = attention(q, k, v, padded, key_dim, value_dim, bias, **(attention_kwargs or {}))
    return mtf.replace_dimensions(o, [num_blocks, query_block], length_dim)
