"""Cheaper lowerings of two operations that mesh-tensorflow spells as dense math.

* **Embedding lookup.** `mtf.gather(table, ids, dim)` is `einsum(one_hot(ids, dim), table)`: for the token
  embedding that is 2 x tokens x n_vocab x n_embd FLOPs forward and as many again for the table's gradient (on
  the benchmark model, 12% of a training step's work, for a lookup). `gather` here is `tf.gather` forward and
  an `unsorted_segment_sum` of the output gradient backward, summed over the mesh axes that split the ids.
* **Cross-entropy and log Z.** `mtf.layers.softmax_cross_entropy_with_logits` multiplies the log-softmax by a
  one-hot of the targets and sums over the vocabulary, and GPT-Neo's z-loss takes a second logsumexp over the
  same [batch, sequence, vocab] logits; through mtf's gradients that is a dozen passes over the largest tensor
  of the step. `cross_entropy_and_log_z` returns both from one logsumexp, and its gradient is one fused
  `softmax * (d_xent + d_log_z) - one_hot * d_xent`.

Both need the dimension they look up / reduce over (`vocab`, `embed_sequence`) to be whole on every device; with
a layout that splits it, `vocab_is_split` is true and callers keep mtf's formulation (which all-reduces across
the split). Values are those of the mtf formulations (the same formulas: a lookup instead of a one-hot product;
log Z - logit[target] instead of -sum(one_hot * (logits - log Z))); gradients differ only in summation order.
"""
from __future__ import annotations

import math

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.config import GPTConfig


def dimension_is_split(cfg: GPTConfig, name: str) -> bool:
    """True if cfg.layout splits the tensor dimension `name` over a mesh dimension of size > 1."""
    mesh = dict(cfg.mesh_dims)
    return any(tensor_dim == name and mesh.get(mesh_dim, 1) > 1 for tensor_dim, mesh_dim in cfg.layout_rules)


def vocab_is_split(cfg: GPTConfig) -> bool:
    return dimension_is_split(cfg, "vocab")


# ---------------------------------------------------------------------------------------------------------
# Embedding lookup


def _reduced_mesh_axes(mesh_impl, dims) -> list[int]:
    axes = [mesh_impl.tensor_dimension_to_mesh_axis(d) for d in dims]
    return sorted({a for a in axes if a is not None})


class GatherOperation(mtf.Operation):
    """table [dim, rest...] gathered at ids [ids...] -> [ids..., rest...] (tf.gather on each device's slices)."""

    def __init__(self, table: mtf.Tensor, ids: mtf.Tensor, dim: mtf.Dimension, name=None):
        super().__init__([table, ids], name=name or "gather")
        if table.shape.dims[0] != dim:
            raise ValueError(f"gather looks up the first dimension of the table; {dim} is not first in {table.shape}")
        self._dim = dim
        self._outputs = [mtf.Tensor(self, mtf.Shape(ids.shape.dims + table.shape.dims[1:]), table.dtype)]

    def gradient(self, grad_ys):
        table, ids = self.inputs
        return [GatherGradOperation(grad_ys[0], ids, table.shape).outputs[0], None]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        if mesh_impl.tensor_dimension_to_mesh_axis(self._dim) is not None:
            raise ValueError(f"fast gather needs {self._dim.name} whole on each device; the layout splits it")
        table, ids = self.inputs
        y = mesh_impl.slicewise(lambda t, i: tf.gather(t, i, axis=0), lowering.tensors[table], lowering.tensors[ids])
        lowering.set_tensor_lowering(self.outputs[0], y)


class GatherGradOperation(mtf.Operation):
    """d table [dim, rest...] = segment sums of d output [ids..., rest...] by id, all-reduced over the mesh axes
    that split the ids (data parallelism: each device holds the gradient of its own rows)."""

    def __init__(self, dy: mtf.Tensor, ids: mtf.Tensor, table_shape: mtf.Shape, name=None):
        super().__init__([dy, ids], name=name or "gather_grad")
        self._outputs = [mtf.Tensor(self, table_shape, dy.dtype)]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        dy, ids = self.inputs
        size = self.outputs[0].shape.dims[0].size
        n_ids = ids.shape.ndims

        def segment_sum(dy_slice, ids_slice):
            rest = dy_slice.shape[n_ids:].as_list()
            flat = tf.reshape(dy_slice, [-1] + rest)
            summed = tf.math.unsorted_segment_sum(tf.cast(flat, tf.float32), tf.reshape(ids_slice, [-1]), size)
            return tf.cast(summed, dy_slice.dtype)

        y = mesh_impl.slicewise(segment_sum, lowering.tensors[dy], lowering.tensors[ids])
        axes = _reduced_mesh_axes(mesh_impl, ids.shape.dims)
        if axes:
            y = mtf.LazyAllreduceSum(mesh_impl, y, axes)
        lowering.set_tensor_lowering(self.outputs[0], y)


def gather(table: mtf.Tensor, ids: mtf.Tensor, dim: mtf.Dimension, split: bool) -> mtf.Tensor:
    """Rows of `table` (whose first dimension is `dim`) at `ids`; `split`: the layout splits `dim` (then
    mtf.gather's one-hot product, which handles a split table)."""
    if split or table.shape.dims[0] != dim:
        return mtf.gather(table, ids, dim)
    return GatherOperation(table, ids, dim).outputs[0]


# ---------------------------------------------------------------------------------------------------------
# Cross-entropy with log Z


def _xent_forward(logits: tf.Tensor, labels: tf.Tensor):
    log_z = tf.reduce_logsumexp(logits, axis=-1)
    target = tf.gather(logits, labels, axis=-1, batch_dims=labels.shape.ndims)
    return log_z - target, log_z


def _xent_backward(logits: tf.Tensor, labels: tf.Tensor, d_xent: tf.Tensor, d_log_z):
    log_z = tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
    scale = d_xent if d_log_z is None else d_xent + d_log_z
    grad = tf.exp(logits - log_z) * scale[..., None]
    vocab = logits.shape[-1]
    flat = tf.reshape(grad, [-1, vocab])
    rows = tf.range(tf.shape(flat)[0])
    index = tf.stack([rows, tf.reshape(labels, [-1])], axis=1)
    flat = tf.tensor_scatter_nd_sub(flat, index, tf.reshape(d_xent, [-1]))
    return tf.reshape(flat, tf.shape(logits))


def cross_entropy_and_log_z(logits: mtf.Tensor, labels: mtf.Tensor, vocab: mtf.Dimension):
    """logits [..., vocab] float, labels [...] int -> (log Z - logits[label], log Z), each [...].

    The vocabulary must be whole on each device (see `vocab_is_split`)."""
    rest = logits.shape - vocab
    if logits.shape.dims[-1] != vocab:
        logits = mtf.transpose(logits, rest + vocab)
    if labels.shape != rest:
        labels = mtf.transpose(labels, rest)
    splittable = rest.dims

    def grad_function(op, d_xent, d_log_z):
        if d_xent is None:
            d_xent = mtf.zeros(op.inputs[0].mesh, rest, dtype=op.inputs[0].dtype)
        inputs = [op.inputs[0], op.inputs[1], d_xent] + ([d_log_z] if d_log_z is not None else [])
        d_logits = mtf.slicewise(
            lambda lg, lb, dx, dz=None: _xent_backward(lg, lb, dx, dz), inputs, output_shape=op.inputs[0].shape,
            output_dtype=op.inputs[0].dtype, splittable_dims=splittable, grad_function=0, name="xent_grad")
        return [d_logits, None]

    return mtf.slicewise(_xent_forward, [logits, labels], output_shape=[rest, rest],
                         output_dtype=[logits.dtype, logits.dtype], splittable_dims=splittable,
                         grad_function=grad_function, name="xent_log_z")


# ---------------------------------------------------------------------------------------------------------
# Attention


def softmax(logits: mtf.Tensor, dim: mtf.Dimension, split: bool) -> mtf.Tensor:
    """Softmax over `dim` (the last dimension), one tf.nn.softmax per slice and a 3-op gradient, instead of
    mtf.softmax's exp(x - logsumexp(x)) chain (a dozen passes forward and backward). `split`: the layout
    splits `dim` (then mtf.softmax, which reduces across the split)."""
    if split or logits.shape.dims[-1] != dim:
        return mtf.softmax(logits, dim)
    splittable = [d for d in logits.shape.dims if d != dim]

    def grad_function(op, dy):
        y = op.outputs[0]
        dx = mtf.slicewise(lambda y_, dy_: (dy_ - tf.reduce_sum(dy_ * y_, axis=-1, keepdims=True)) * y_, [y, dy],
                           output_shape=y.shape, output_dtype=y.dtype, splittable_dims=splittable, grad_function=0,
                           name="softmax_grad")
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
    of max(radius, 128) queries attend to their block and the `radius` positions before it (and after it when
    not fully autoregressive), through `attention` above. Same blocks, halo exchange and visibility mask."""
    block_length = max(radius, 128)
    while length_dim.size % block_length:
        block_length -= 1
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
    bias = mtf.cast(mtf.logical_not(visible), q.dtype) * -1e9
    padded = mtf.Dimension("memory_block_length", (1 if fully_autoregressive else 2) * radius + block_length)
    o = attention(q, k, v, padded, key_dim, value_dim, bias, **(attention_kwargs or {}))
    return mtf.replace_dimensions(o, [num_blocks, query_block], length_dim)


# ---------------------------------------------------------------------------------------------------------
# Fused element-wise functions


_GELU_C = math.sqrt(2 / math.pi)


@tf.function(jit_compile=True)
def _gelu_forward(x):
    return x * (0.5 * (1.0 + tf.tanh(_GELU_C * (x + 0.044715 * x * x * x))))


@tf.function(jit_compile=True)
def _gelu_backward(x, dy):
    t = tf.tanh(_GELU_C * (x + 0.044715 * x * x * x))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (_GELU_C * (1.0 + 3 * 0.044715 * x * x)))


def gelu(x: mtf.Tensor) -> mtf.Tensor:
    """mtf.gelu's tanh approximation (GPT-Neo's, HF's "gelu_new"), forward and gradient each one XLA-fused
    pass over the [batch, sequence, 4 x embd] activations, where mtf.gelu's op-by-op formula makes ~8 passes
    forward and ~20 backward (a sixth of a step on the benchmark model). Element-wise: any layout."""
    dims = x.shape.dims

    def grad_function(op, dy):
        return [mtf.slicewise(_gelu_backward, [op.inputs[0], dy], output_shape=x.shape, output_dtype=x.dtype,
                              splittable_dims=dims, grad_function=0, name="gelu_grad")]

    return mtf.slicewise(_gelu_forward, [x], output_shape=x.shape, output_dtype=x.dtype, splittable_dims=dims,
                         grad_function=grad_function, name="gelu")
