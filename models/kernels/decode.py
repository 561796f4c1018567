"""Incremental decoding's kernels: the key/value cache's writes and one query's attention over the cache.
mtf's formulations make several passes over the whole cache per layer and token (the one-hot write, einsum's
broadcast of the query); here a decoding step writes one row in place and reads only the rows the query can
see, with two batched matrix-vector products. models/kv_cache.py threads the caches through the steps."""
from __future__ import annotations

import math
from types import SimpleNamespace

import mesh_tensorflow as mtf
import mesh_tensorflow.transformer.attention as mtf_attention
import tensorflow.compat.v1 as tf

from models.kernels.common import compiled, xla_function


class WriteAtPositionOperation(mtf.Operation):
    """cache [lead..., memory, rest...] with cache[..., position, ...] = value [lead..., rest...], by a scatter of
    one row per leading index (TF updates in place when nothing else holds the cache), where the one-hot formula
    `cache * (1 - one_hot) + value * one_hot` makes ~6 passes over the whole cache."""

    def __init__(self, cache: mtf.Tensor, value: mtf.Tensor, position: mtf.Tensor, axis: int, name=None):
        super().__init__([cache, value, position], name=name or "write_at_position")
        self._axis = axis
        self._outputs = [mtf.Tensor(self, cache.shape, cache.dtype)]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        axis = self._axis

        def scatter(cache, value, position):
            shape = tf.shape(cache)
            rows = tf.reduce_prod(shape[:axis])
            flat = tf.reshape(cache, tf.concat([[rows], shape[axis:]], 0))        # [rows, memory, rest...]
            index = tf.stack([tf.range(rows), tf.fill([rows], position)], axis=1)
            written = tf.tensor_scatter_nd_update(flat, index, tf.reshape(value, tf.concat([[rows], shape[axis + 1:]], 0)))
            return tf.reshape(written, shape)

        y = mesh_impl.slicewise(scatter, *(lowering.tensors[t] for t in self.inputs))
        lowering.set_tensor_lowering(self.outputs[0], y)


def write_at_position(cache: mtf.Tensor, value: mtf.Tensor, position: mtf.Tensor, memory: mtf.Dimension,
                      split: bool) -> mtf.Tensor:
    """cache with its entry at `position` (a scalar) along `memory` replaced by `value` (cache's shape without
    `memory`). Needs `memory` whole on each device and not first (`split`: the layout splits it); otherwise the
    one-hot formula, which any layout runs."""
    dims = cache.shape.dims
    axis = dims.index(memory) if memory in dims else -1
    if split or axis < 1 or position.shape.dims:
        write = mtf.one_hot(position, memory, dtype=cache.dtype)
        return cache * (1.0 - write) + mtf.einsum([value, write], output_shape=cache.shape)
    value = mtf.transpose(mtf.cast(value, cache.dtype), mtf.Shape(dims[:axis] + dims[axis + 1:]))
    return WriteAtPositionOperation(cache, value, position, axis).outputs[0]


PREFIX_BLOCK = 128  # global attention reads the cache in prefixes of whole blocks (few distinct shapes)


def _attend_one_query(q, k_cache, v_cache, bias, position, window=None):
    """q [lead..., kv], caches [lead..., memory, kv], bias [memory] -> [lead..., kv]: two batched matrix-vector
    products, no transposes (the caches are laid out for them) and no [lead..., memory, kv] temporaries.

    Only the cache rows the bias can leave visible to the query at `position` are read: with a `window` (local
    attention) the last `window` rows up to it; without (global attention) the rows up to it, rounded up to
    whole blocks, while that prefix is at most half the cache (slicing copies the rows it keeps)."""
    def attend(k, v, b):
        logits = tf.matmul(tf.cast(q[..., None, :], tf.float32), tf.cast(k, tf.float32), transpose_b=True)
        weights = tf.nn.softmax(logits + tf.cast(b, tf.float32), axis=-1)              # [lead..., 1, memory]
        return tf.cast(tf.matmul(weights, tf.cast(v, tf.float32))[..., 0, :], q.dtype)

    def rows(start, size):
        lead = k_cache.shape.ndims - 2
        k, v = (tf.slice(t, [0] * lead + [start, 0], [-1] * lead + [size, -1]) for t in (k_cache, v_cache))
        return k, v, tf.slice(bias, [start], [size])

    memory = k_cache.shape.as_list()[-2]
    if window is not None:
        if window >= memory:
            return attend(k_cache, v_cache, bias)
        return attend(*rows(tf.clip_by_value(position - window + 1, 0, memory - window), window))
    if memory < 2 * PREFIX_BLOCK:
        return attend(k_cache, v_cache, bias)
    prefix = (position // PREFIX_BLOCK + 1) * PREFIX_BLOCK
    out = tf.cond(prefix <= memory // 2, lambda: attend(*rows(0, prefix)), lambda: attend(k_cache, v_cache, bias))
    return tf.ensure_shape(out, q.shape)


# One XLA launch for the slices, products and softmax: about a dozen small TF ops per layer and token, whose
# dispatch (oneDNN's above all, for [heads, 1, kv] products) cost more than the reads. 1.9 of 7.4 ms a token
# went to attention at prompt 16 on a 2-core AVX2 CPU (bench/bench_decode.py's model); compiled, 1.4.
_attend_one_query_compiled = xla_function(_attend_one_query)


def _write_row_in_place(cache, value, position):
    """cache [lead..., memory, kv] with row `position` of every [memory, kv] block set to value [lead..., kv],
    written into cache's own buffer (InplaceUpdate aliases its input; see DecodeStepAttentionOperation)."""
    shape = cache.shape.as_list()
    rows, memory, kv = math.prod(shape[:-2]), shape[-2], shape[-1]
    index = tf.range(rows) * memory + position
    flat = tf.raw_ops.InplaceUpdate(x=tf.reshape(cache, [rows * memory, kv]), i=index,
                                    v=tf.reshape(tf.cast(value, cache.dtype), [rows, kv]))
    return tf.reshape(flat, shape)


class DecodeStepAttentionOperation(mtf.Operation):
    """One decoding step of one attention layer, on each device's slices: writes this token's key and value into
    the caches at `position`, attends the one query over them (`_attend_one_query`) and hands the caches on.

    The writes are in place. A copying write (tensor_scatter_nd_update) copied the whole cache on every step
    (4 MB per layer and token on the benchmark model, a quarter of the step): TF's executor hands each
    consumer of a tensor its own reference, and the next step's write ran while this step's reads still held
    one. In place is safe because (1) the caches entering the loop are private copies (`private_copy`, at
    prefill) that only the loop holds, and (2) the caches are handed on only after this step's reads of them
    have finished (control dependencies on the output), so the next write never races a read."""

    def __init__(self, q, k, v, k_cache, v_cache, bias, position, window=None, name=None):
        super().__init__([q, k, v, k_cache, v_cache, bias, position], name=name or "decode_step_attention")
        self._window = window
        self._outputs = [mtf.Tensor(self, q.shape, q.dtype), mtf.Tensor(self, k_cache.shape, k_cache.dtype),
                         mtf.Tensor(self, v_cache.shape, v_cache.dtype)]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)

        def step(q, k, v, k_cache, v_cache, bias, position):
            k_cache = _write_row_in_place(k_cache, k, position)
            v_cache = _write_row_in_place(v_cache, v, position)
            out = compiled(_attend_one_query_compiled, q, k_cache, v_cache, bias, position, self._window)
            with tf.control_dependencies([out]):
                return out, tf.identity(k_cache), tf.identity(v_cache)

        outputs = mesh_impl.slicewise(step, *(lowering.tensors[t] for t in self.inputs))
        for output, value in zip(self.outputs, outputs):
            lowering.set_tensor_lowering(output, value)


def private_copy(x: mtf.Tensor) -> mtf.Tensor:
    """x in buffers of its own (a deep copy on each device): what DecodeStepAttentionOperation may write into."""
    return mtf.slicewise(lambda t: tf.raw_ops.DeepCopy(x=t), [x], output_shape=x.shape, output_dtype=x.dtype,
                         splittable_dims=x.shape.dims, name="private_copy")


def decode_step_attention(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor, k_cache: mtf.Tensor, v_cache: mtf.Tensor,
                          bias: mtf.Tensor, position: mtf.Tensor, memory: mtf.Dimension, kv: mtf.Dimension,
                          memory_split: bool, kv_split: bool, window: int | None = None):
    """One query per row against a key/value cache, after writing this token's key and value at `position`:
    q, k, v [lead..., kv], caches [lead..., memory, kv] (from `private_copy` or a previous step), bias [memory]
    -> (attention output [lead..., kv], k_cache, v_cache). mtf attention's values (fp32 logits plus bias, softmax
    over memory, weighted values); mtf.einsum would broadcast q over the whole cache, several passes over it per
    layer and token. `memory_split`, `kv_split`: the layout splits memory or kv; then `write_at_position` and
    mtf's attention, which reduce across devices. `window`: the bias hides every position but the last `window`
    up to `position` (local attention), so only those are read."""
    cache_dims = q.shape.dims[:-1] + [memory, kv]
    if (memory_split or kv_split or q.shape.dims[-1] != kv or k_cache.shape.dims != cache_dims
            or v_cache.shape.dims != cache_dims):
        k_cache = write_at_position(k_cache, k, position, memory, memory_split)
        v_cache = write_at_position(v_cache, v, position, memory, memory_split)
        no_dropout = SimpleNamespace(train=False, model=SimpleNamespace(layout=None, mesh_shape=None))
        out = mtf_attention.attention(q, k_cache, v_cache, memory_length_dim=memory, key_dim=kv, value_dim=kv,
                                      bias=bias, dropout_rate=0.0, context=no_dropout)
        return out, k_cache, v_cache
    k, v = (mtf.transpose(mtf.cast(t, k_cache.dtype), q.shape) for t in (k, v))
    return tuple(DecodeStepAttentionOperation(q, k, v, k_cache, v_cache, bias, position, window).outputs)
