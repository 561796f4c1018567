"""Embedding lookups. `mtf.gather(table, ids, dim)` is `einsum(one_hot(ids, dim), table)`: for the token
embedding that is 2 x tokens x n_vocab x n_embd FLOPs forward and as many again for the table's gradient (12%
of a training step's work, for a lookup). `gather` is `tf.gather` forward and an `unsorted_segment_sum` of the
output gradient backward, summed over the mesh axes that split the ids. It needs the looked-up dimension whole
on each device; where the layout splits it, the caller says so (`split`) and gets mtf.gather."""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels.common import reduced_mesh_axes


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
        axes = reduced_mesh_axes(mesh_impl, ids.shape.dims)
        if axes:
            y = mtf.LazyAllreduceSum(mesh_impl, y, axes)
        lowering.set_tensor_lowering(self.outputs[0], y)


def gather(table: mtf.Tensor, ids: mtf.Tensor, dim: mtf.Dimension, split: bool) -> mtf.Tensor:
    """Rows of `table` (whose first dimension is `dim`) at `ids`; `split`: the layout splits `dim` (then
    mtf.gather's one-hot product, which handles a split table)."""
    if split or table.shape.dims[0] != dim:
        return mtf.gather(table, ids, dim)
    return GatherOperation(table, ids, dim).outputs[0]
