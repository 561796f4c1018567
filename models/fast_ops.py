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
