"""Faster formulations of the operations that dominated a training step after the matmuls (profiled with TF's
step timelines on the benchmark model, bench/bench_train.py). Each gives mesh-tensorflow's values (the same
formulas; only rounding differs), and tests/test_fast_ops.py checks values and gradients on split layouts.

* **Embedding lookup.** `mtf.gather(table, ids, dim)` is `einsum(one_hot(ids, dim), table)`: for the token
  embedding that is 2 x tokens x n_vocab x n_embd FLOPs forward and as many again for the table's gradient (12%
  of a step's work, for a lookup). `gather` is `tf.gather` forward and an `unsorted_segment_sum` of the output
  gradient backward, summed over the mesh axes that split the ids.
* **Cross-entropy and log Z.** `mtf.layers.softmax_cross_entropy_with_logits` multiplies the log-softmax by a
  one-hot of the targets and sums over the vocabulary, and GPT-Neo's z-loss takes a second logsumexp over the
  same [batch, sequence, vocab] logits: a dozen passes over the largest tensor of the step, forward and back.
  `cross_entropy_and_log_z` returns both from one logsumexp; its gradient is one XLA-fused pass.
* **Attention.** mtf lays the attention logits out like q ([batch, sequence, heads, memory]), so TF's einsum
  transposes them inside every attention matmul, forward and backward. `attention` transposes q, k, v once so
  that every einsum is a plain batched matmul, and uses one softmax kernel with an XLA-fused gradient
  (attention einsums 3x faster); `local_attention_1d` is mtf's blocked local attention on top of it.
* **Matrix products.** The projections are einsums of two tensors that are each one matrix product; `matmul`
  runs them as tf.matmul on 2-D reshapes (with transpose flags for the gradients), about 2x faster than TF's
  einsum kernel for decoding's matrix-vector products.
* **GELU.** mtf.gelu is ~8 element-wise ops forward and ~20 backward over [batch, sequence, 4 x embd]; `gelu`
  is one XLA-fused pass each way (`tf.function(jit_compile=True)`, compiled once per shape).

The embedding, cross-entropy and softmax need the dimension they look up or reduce over whole on each device;
callers pass whether the layout splits it (`dimension_is_split`), and a split dimension keeps mtf's
formulation, which reduces across devices.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import mesh_tensorflow as mtf
import mesh_tensorflow.transformer.attention as mtf_attention
import tensorflow.compat.v1 as tf

from models.config import GPTConfig


def dimension_is_split(cfg: GPTConfig, name: str) -> bool:
    """True if cfg.layout splits the tensor dimension `name` over a mesh dimension of size > 1."""
    mesh = dict(cfg.mesh_dims)
    return any(tensor_dim == name and mesh.get(mesh_dim, 1) > 1 for tensor_dim, mesh_dim in cfg.layout_rules)


def vocab_is_split(cfg: GPTConfig) -> bool:
    return dimension_is_split(cfg, "vocab")


def _f32(x):
    """The fused element-wise kernels compute in fp32 and store in the input's dtype: XLA's CPU code for bf16
    arithmetic ran GELU, LayerNorm and the softmax gradient ~3x slower than fp32 (bf16 training, 2026-11-23)."""
    return tf.cast(x, tf.float32)


XLA_MIN_ELEMENTS = 1 << 14


def _fused(fn, *args):
    """fn(*args) for a tf.function(jit_compile=True) `fn`; on a small first argument (decoding's one-token
    activations) its Python body as plain TF ops instead, where launching the compiled kernel costs more (~80 us)
    than the passes it saves."""
    size = args[0].shape.num_elements()
    if size is not None and size < XLA_MIN_ELEMENTS:
        return fn.python_function(*args)
    return fn(*args)


# ---------------------------------------------------------------------------------------------------------
# Matrix products


def _matmul_plan(a_dims, b_dims, out_dims):
    """How einsum(a, b) -> out is one tf.matmul per device: (swap, transpose_a, transpose_b, n_free_a, n_free_b),
    after swapping the operands if `swap`; None if it is not a single matrix product (a dimension in both inputs
    and the output, or dimensions out of order)."""
    contracted = [d for d in a_dims if d in b_dims]
    a_free = [d for d in a_dims if d not in contracted]
    b_free = [d for d in b_dims if d not in contracted]
    if not contracted or any(d in out_dims for d in contracted):
        return None
    if list(out_dims) == a_free + b_free:
        swap = False
    elif list(out_dims) == b_free + a_free:
        swap, a_dims, b_dims, a_free, b_free = True, b_dims, a_dims, b_free, a_free
    else:
        return None
    order = [d for d in a_dims if d in contracted]
    if order != [d for d in b_dims if d in contracted]:
        return None
    if list(a_dims) not in (a_free + order, order + a_free) or list(b_dims) not in (order + b_free, b_free + order):
        return None
    return swap, list(a_dims) == order + a_free, list(b_dims) == b_free + order, len(a_free), len(b_free)


class MatmulOperation(mtf.Operation):
    """mtf.einsum([a, b], output_shape) when it is one matrix product (`_matmul_plan`): a reshape of each slice
    to 2-D and one tf.matmul with transpose flags, summed over the mesh axes that split the contracted
    dimensions. TF's einsum (oneDNN's on x86) takes about twice as long for the same product on CPU: 2x for
    decoding's matrix-vector products (bench/bench_decode.py)."""

    def __init__(self, a: mtf.Tensor, b: mtf.Tensor, output_shape: mtf.Shape, name=None):
        super().__init__([a, b], name=name or "matmul")
        self._plan = _matmul_plan(a.shape.dims, b.shape.dims, output_shape.dims)
        if self._plan is None or a.dtype != b.dtype:
            raise ValueError(f"{a.shape} x {b.shape} -> {output_shape} is not one matrix product of equal dtypes")
        self._outputs = [mtf.Tensor(self, output_shape, a.dtype)]

    def gradient(self, grad_ys):
        dy = grad_ys[0]
        a, b = self.inputs
        return [matmul(dy, b, a.shape), matmul(a, dy, b.shape)]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        swap, transpose_a, transpose_b, n_free_a, n_free_b = self._plan
        out_shape = mesh_impl.slice_shape(self.outputs[0].shape)

        def product(a, b):
            if swap:
                a, b = b, a
            a_shape, b_shape = a.shape.as_list(), b.shape.as_list()
            m = math.prod(a_shape[len(a_shape) - n_free_a:] if transpose_a else a_shape[:n_free_a])
            n = math.prod(b_shape[:n_free_b] if transpose_b else b_shape[len(b_shape) - n_free_b:])
            a2 = tf.reshape(a, [-1, m] if transpose_a else [m, -1])
            b2 = tf.reshape(b, [n, -1] if transpose_b else [-1, n])
            return tf.reshape(tf.matmul(a2, b2, transpose_a=transpose_a, transpose_b=transpose_b), out_shape)

        a, b = self.inputs
        y = mesh_impl.slicewise(product, lowering.tensors[a], lowering.tensors[b])
        axes = _reduced_mesh_axes(mesh_impl, [d for d in a.shape.dims if d in b.shape.dims])
        if axes:
            y = mtf.LazyAllreduceSum(mesh_impl, y, axes)
        lowering.set_tensor_lowering(self.outputs[0], y)


def matmul(a: mtf.Tensor, b: mtf.Tensor, output_shape) -> mtf.Tensor:
    """mtf.einsum([a, b], output_shape): as one tf.matmul per device where it is a single matrix product (the
    projections of every layer and the output layer), else mtf.einsum itself."""
    output_shape = mtf.convert_to_shape(output_shape)
    if a.dtype != b.dtype or _matmul_plan(a.shape.dims, b.shape.dims, output_shape.dims) is None:
        return mtf.einsum([a, b], output_shape=output_shape)
    return MatmulOperation(a, b, output_shape).outputs[0]


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
        # Gather from a dense read of the table: tf.gather on the variable itself (ResourceGather) would switch
        # it to copy-on-read, and every later read of the table (the tied output projection, Adam) would copy it.
        y = mesh_impl.slicewise(lambda t, i: tf.gather(tf.convert_to_tensor(t), i, axis=0), lowering.tensors[table],
                                lowering.tensors[ids])
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


@tf.function(jit_compile=True)
def _xent_forward(logits: tf.Tensor, labels: tf.Tensor):
    log_z = tf.reduce_logsumexp(logits, axis=-1)
    target = tf.gather(logits, labels, axis=-1, batch_dims=len(labels.shape))
    return log_z - target, log_z


@tf.function(jit_compile=True)
def _xent_backward(logits: tf.Tensor, labels: tf.Tensor, log_z: tf.Tensor, d_xent: tf.Tensor, d_log_z: tf.Tensor):
    """d logits = softmax * (d_xent + d_log_z) - one_hot(label) * d_xent, one fused pass (XLA)."""
    target = tf.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    return tf.exp(logits - log_z[..., None]) * (d_xent + d_log_z)[..., None] - target * d_xent[..., None]


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
        zeros = mtf.zeros(op.inputs[0].mesh, rest, dtype=op.inputs[0].dtype)
        inputs = [op.inputs[0], op.inputs[1], op.outputs[1], zeros if d_xent is None else d_xent,
                  zeros if d_log_z is None else d_log_z]
        d_logits = mtf.slicewise(_xent_backward, inputs, output_shape=op.inputs[0].shape,
                                 output_dtype=op.inputs[0].dtype, splittable_dims=splittable, grad_function=0,
                                 name="xent_grad")
        return [d_logits, None]

    return mtf.slicewise(_xent_forward, [logits, labels], output_shape=[rest, rest],
                         output_dtype=[logits.dtype, logits.dtype], splittable_dims=splittable,
                         grad_function=grad_function, name="xent_log_z")


# ---------------------------------------------------------------------------------------------------------
# Attention


@tf.function(jit_compile=True)
def _softmax_backward(y, dy):
    dtype, y, dy = y.dtype, _f32(y), _f32(dy)
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
        dx = mtf.slicewise(_softmax_backward, [y, dy], output_shape=y.shape, output_dtype=y.dtype,
                           splittable_dims=splittable, grad_function=0, name="softmax_grad")
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
    y = _f32(x)
    return tf.cast(y * (0.5 * (1.0 + tf.tanh(_GELU_C * (y + 0.044715 * y * y * y)))), x.dtype)


@tf.function(jit_compile=True)
def _gelu_backward(x, dy):
    x, dtype, dy = _f32(x), dy.dtype, _f32(dy)
    t = tf.tanh(_GELU_C * (x + 0.044715 * x * x * x))
    return tf.cast(dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (_GELU_C * (1.0 + 3 * 0.044715 * x * x))), dtype)


def gelu(x: mtf.Tensor) -> mtf.Tensor:
    """mtf.gelu's tanh approximation (GPT-Neo's, HF's "gelu_new"), forward and gradient each one XLA-fused
    pass over the [batch, sequence, 4 x embd] activations, where mtf.gelu's op-by-op formula makes ~8 passes
    forward and ~20 backward (a sixth of a step on the benchmark model). Element-wise: any layout."""
    dims = x.shape.dims

    def grad_function(op, dy):
        return [mtf.slicewise(lambda x_, dy_: _fused(_gelu_backward, x_, dy_), [op.inputs[0], dy],
                              output_shape=x.shape, output_dtype=x.dtype, splittable_dims=dims, grad_function=0,
                              name="gelu_grad")]

    return mtf.slicewise(lambda x_: _fused(_gelu_forward, x_), [x], output_shape=x.shape, output_dtype=x.dtype,
                         splittable_dims=dims, grad_function=grad_function, name="gelu")


# ---------------------------------------------------------------------------------------------------------
# Layer norm


@tf.function(jit_compile=True)
def _layer_norm_forward(x, g, b, epsilon):
    dtype, x, g, b = x.dtype, _f32(x), _f32(g), _f32(b)
    xc = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    return tf.cast(xc * tf.math.rsqrt(tf.reduce_mean(xc * xc, axis=-1, keepdims=True) + epsilon) * g + b, dtype)


@tf.function(jit_compile=True)
def _layer_norm_backward_fused(x, g, dy, epsilon):
    dtype, x, g, dy = x.dtype, _f32(x), _f32(g), _f32(dy)
    xc = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    r = tf.math.rsqrt(tf.reduce_mean(xc * xc, axis=-1, keepdims=True) + epsilon)
    x_hat = xc * r
    d_hat = dy * g
    dx = r * (d_hat - tf.reduce_mean(d_hat, axis=-1, keepdims=True)
              - x_hat * tf.reduce_mean(d_hat * x_hat, axis=-1, keepdims=True))
    return tf.cast(dx, dtype), tf.cast(dy * x_hat, dtype)


def _layer_norm_backward(x, g, dy, epsilon):
    """dx, and dg / db summed over this slice's rows (the caller all-reduces them over the other devices). The
    row sums run outside XLA: its column reductions are slower on CPU than TF's own."""
    dx, dy_x_hat = _fused(_layer_norm_backward_fused, x, g, dy, epsilon)
    rows = list(range(len(x.shape) - 1))
    return dx, tf.reduce_sum(dy_x_hat, axis=rows), tf.reduce_sum(dy, axis=rows)


def _split_moments(mesh_impl, x, axis: int, size: int, epsilon: float):
    """(x - mean, 1/sqrt(var + eps)) over a last dimension split along mesh axis `axis`, as laid-out tensors."""
    total = mesh_impl.allreduce(mesh_impl.slicewise(lambda t: tf.reduce_sum(t, -1, keepdims=True), x), [axis], "SUM")
    xc = mesh_impl.slicewise(lambda t, s: t - s / size, x, total)
    squares = mesh_impl.allreduce(mesh_impl.slicewise(lambda t: tf.reduce_sum(t * t, -1, keepdims=True), xc), [axis],
                                  "SUM")
    return xc, mesh_impl.slicewise(lambda s: tf.math.rsqrt(s / size + epsilon), squares)


class LayerNormOperation(mtf.Operation):
    """(x - mean) / sqrt(var + eps) * g + b over x's last dimension, as one XLA-fused pass per slice; when the
    layout splits that dimension, the means are all-reduced across it."""

    def __init__(self, x: mtf.Tensor, g: mtf.Tensor, b: mtf.Tensor, epsilon: float):
        super().__init__([x, g, b], name="layer_norm")
        self._epsilon = epsilon
        self._outputs = [mtf.Tensor(self, x.shape, x.dtype)]

    def gradient(self, grad_ys):
        x, g, _ = self.inputs
        dx, dg, db = LayerNormGradOperation(x, g, grad_ys[0], self._epsilon).outputs
        return [dx, dg, db]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        x, g, b = (lowering.tensors[t] for t in self.inputs)
        dim = self.inputs[0].shape.dims[-1]
        axis = mesh_impl.tensor_dimension_to_mesh_axis(dim)
        eps = self._epsilon
        if axis is None:
            y = mesh_impl.slicewise(lambda x_, g_, b_: _fused(_layer_norm_forward, x_, g_, b_, eps), x, g, b)
        else:
            xc, r = _split_moments(mesh_impl, x, axis, dim.size, eps)
            y = mesh_impl.slicewise(lambda c, r_, g_, b_: c * r_ * g_ + b_, xc, r, g, b)
        lowering.set_tensor_lowering(self.outputs[0], y)


class LayerNormGradOperation(mtf.Operation):
    def __init__(self, x: mtf.Tensor, g: mtf.Tensor, dy: mtf.Tensor, epsilon: float):
        super().__init__([x, g, dy], name="layer_norm_grad")
        self._epsilon = epsilon
        self._outputs = [mtf.Tensor(self, x.shape, x.dtype), mtf.Tensor(self, g.shape, g.dtype),
                         mtf.Tensor(self, g.shape, g.dtype)]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        x_shape = self.inputs[0].shape
        x, g, dy = (lowering.tensors[t] for t in self.inputs)
        dim = x_shape.dims[-1]
        axis = mesh_impl.tensor_dimension_to_mesh_axis(dim)
        eps = self._epsilon
        if axis is None:
            dx, dg, db = mesh_impl.slicewise(lambda x_, g_, dy_: _layer_norm_backward(x_, g_, dy_, eps), x, g, dy)
        else:
            xc, r = _split_moments(mesh_impl, x, axis, dim.size, eps)
            x_hat = mesh_impl.slicewise(lambda c, r_: c * r_, xc, r)
            d_hat = mesh_impl.slicewise(lambda d, g_: d * g_, dy, g)
            mean_d = mesh_impl.allreduce(mesh_impl.slicewise(lambda d: tf.reduce_sum(d, -1, keepdims=True), d_hat),
                                         [axis], "SUM")
            mean_dx = mesh_impl.allreduce(
                mesh_impl.slicewise(lambda d, h: tf.reduce_sum(d * h, -1, keepdims=True), d_hat, x_hat), [axis], "SUM")
            n = dim.size
            dx = mesh_impl.slicewise(lambda r_, d, h, m1, m2: r_ * (d - m1 / n - h * (m2 / n)), r, d_hat, x_hat,
                                     mean_d, mean_dx)
            rows = list(range(x_shape.ndims - 1))
            dg = mesh_impl.slicewise(lambda d, h: tf.reduce_sum(d * h, axis=rows), dy, x_hat)
            db = mesh_impl.slicewise(lambda d: tf.reduce_sum(d, axis=rows), dy)
        row_axes = _reduced_mesh_axes(mesh_impl, x_shape.dims[:-1])
        if row_axes:  # each device summed its own rows
            dg = mtf.LazyAllreduceSum(mesh_impl, dg, row_axes)
            db = mtf.LazyAllreduceSum(mesh_impl, db, row_axes)
        for output, value in zip(self.outputs, (dx, dg, db)):
            lowering.set_tensor_lowering(output, value)


def layer_norm(x: mtf.Tensor, g: mtf.Tensor, b: mtf.Tensor, epsilon: float = 1e-5) -> mtf.Tensor:
    """LayerNorm over x's last dimension with gain g and bias b (shape [that dimension]): the formula of
    models/layers.py's mtf version (mean, centred mean square, rsqrt(var + eps)), fused forward and backward."""
    if g.shape.dims != [x.shape.dims[-1]] or b.shape.dims != [x.shape.dims[-1]]:
        raise ValueError(f"layer_norm's gain and bias must be [{x.shape.dims[-1]}], got {g.shape} and {b.shape}")
    return LayerNormOperation(x, g, b, epsilon).outputs[0]


# ---------------------------------------------------------------------------------------------------------
# Key/value cache: writes and one query's attention


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
            out = _attend_one_query(q, k_cache, v_cache, bias, position, self._window)
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
