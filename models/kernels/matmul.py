"""Matrix products: the projections of every layer and the output layer are einsums of two tensors that are
each one matrix product. `matmul` runs them as tf.matmul on 2-D reshapes (with transpose flags for the
gradients), about 2x faster than TF's einsum kernel (oneDNN's on x86) for decoding's matrix-vector products
(bench/bench_decode.py); any other einsum goes to mtf.einsum."""
from __future__ import annotations

import math

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels.common import reduced_mesh_axes


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
        a, b = self.inputs
        _lower_product(self, lowering, self._plan, a.shape, b.shape, lowering.tensors[a], lowering.tensors[b])


# A bf16 product whose contraction is this many times longer than either free side, and longer than LONG_CONTRACTION,
# runs as products over pieces of at most LONG_CONTRACTION of it, summed in fp32 (_product_2d).
LONG_CONTRACTION = 8192
LONG_CONTRACTION_RATIO = 8


def _product_2d(a, b, transpose_a: bool, transpose_b: bool):
    """tf.matmul(a, b, transpose flags) of 2-D a and b. In bf16 a long contraction is cut into pieces: oneDNN's
    bf16 product of the tied output layer's gradient (GPT-Neo 125M: [2048, 50257] x [50257, 768]) ran at 375 GFLOP/s
    whole and 540 as 7 products of 7180 summed in fp32 (one core with AMX, 2026-11-26). In fp32 the pieces were
    slower (~8%, with and without AVX-512), so fp32 products stay whole."""
    k = a.shape[0 if transpose_a else 1]
    m, n = a.shape[1 if transpose_a else 0], b.shape[0 if transpose_b else 1]
    if a.dtype != tf.bfloat16 or k is None or m is None or n is None or k <= LONG_CONTRACTION or \
            k < LONG_CONTRACTION_RATIO * max(m, n):
        return tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    pieces = -(-k // LONG_CONTRACTION)
    edges = [k * i // pieces for i in range(pieces + 1)]
    total = None
    for start, end in zip(edges[:-1], edges[1:]):
        a_piece = a[start:end] if transpose_a else a[:, start:end]
        b_piece = b[:, start:end] if transpose_b else b[start:end]
        part = tf.cast(tf.matmul(a_piece, b_piece, transpose_a=transpose_a, transpose_b=transpose_b), tf.float32)
        total = part if total is None else total + part
    return tf.cast(total, a.dtype)


def _lower_product(op: mtf.Operation, lowering, plan, a_shape: mtf.Shape, b_shape: mtf.Shape, a_laid_out,
                   b_laid_out) -> None:
    """Lowers op's output as the product `plan` of two laid-out tensors: one tf.matmul per device on 2-D
    reshapes, summed over the mesh axes that split the contracted dimensions."""
    mesh_impl = lowering.mesh_impl(op)
    swap, transpose_a, transpose_b, n_free_a, n_free_b = plan
    out_shape = mesh_impl.slice_shape(op.outputs[0].shape)

    def product(a, b):
        if swap:
            a, b = b, a
        a_dims, b_dims = a.shape.as_list(), b.shape.as_list()
        m = math.prod(a_dims[len(a_dims) - n_free_a:] if transpose_a else a_dims[:n_free_a])
        n = math.prod(b_dims[:n_free_b] if transpose_b else b_dims[len(b_dims) - n_free_b:])
        a2 = tf.reshape(a, [-1, m] if transpose_a else [m, -1])
        b2 = tf.reshape(b, [n, -1] if transpose_b else [-1, n])
        return tf.reshape(_product_2d(a2, b2, transpose_a, transpose_b), out_shape)

    y = mesh_impl.slicewise(product, a_laid_out, b_laid_out)
    axes = reduced_mesh_axes(mesh_impl, [d for d in a_shape.dims if d in b_shape.dims])
    if axes:
        y = mtf.LazyAllreduceSum(mesh_impl, y, axes)
    lowering.set_tensor_lowering(op.outputs[0], y)


class StackedMatmulOperation(mtf.Operation):
    """matmul(x, stack(weights, stacked_dim, axis=1)): several projections of x in one product against their
    weights side by side ([contracted, stacked_dim, free...]), stacked per device while lowering. The stacked
    copy is not an mtf tensor, so the forward pass does not keep it for the backward one (a weight-sized copy
    per layer, held through the step): the gradient stacks the weights again, and its weight gradient is one
    product, unstacked."""

    def __init__(self, x: mtf.Tensor, weights: list, stacked_dim: mtf.Dimension, output_shape: mtf.Shape,
                 name=None):
        super().__init__([x] + list(weights), name=name or "stacked_matmul")
        w = weights[0]
        self._stacked_shape = mtf.Shape(w.shape.dims[:1] + [stacked_dim] + w.shape.dims[1:])
        self._stacked_dim = stacked_dim
        self._plan = _matmul_plan(x.shape.dims, self._stacked_shape.dims, output_shape.dims)
        if self._plan is None or any(t.dtype != x.dtype or t.shape != w.shape for t in weights):
            raise ValueError(f"{x.shape} x {len(weights)} stacked {w.shape} -> {output_shape} is not one matrix "
                             f"product of equal shapes and dtypes")
        self._outputs = [mtf.Tensor(self, output_shape, x.dtype)]

    def gradient(self, grad_ys):
        dy = grad_ys[0]
        x, weights = self.inputs[0], self.inputs[1:]
        d_x = matmul(dy, mtf.stack(weights, self._stacked_dim.name, axis=1), x.shape)
        return [d_x] + mtf.unstack(matmul(x, dy, self._stacked_shape), self._stacked_dim)

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        x, weights = self.inputs[0], self.inputs[1:]
        stacked = mesh_impl.slicewise(lambda *ws: tf.stack(ws, axis=1), *[lowering.tensors[w] for w in weights])
        _lower_product(self, lowering, self._plan, x.shape, self._stacked_shape, lowering.tensors[x], stacked)


def stacked_matmul(x: mtf.Tensor, weights: list, stacked_dim: mtf.Dimension, output_shape) -> mtf.Tensor:
    """x times each of `weights` (equal shapes [contracted, free...]) as one product: the output has
    `stacked_dim` (len(weights)) where the weights' free dimensions begin (StackedMatmulOperation)."""
    return StackedMatmulOperation(x, weights, stacked_dim, mtf.convert_to_shape(output_shape)).outputs[0]


def matmul(a: mtf.Tensor, b: mtf.Tensor, output_shape) -> mtf.Tensor:
    """mtf.einsum([a, b], output_shape): as one tf.matmul per device where it is a single matrix product (the
    projections of every layer and the output layer), else mtf.einsum itself."""
    output_shape = mtf.convert_to_shape(output_shape)
    if a.dtype != b.dtype or _matmul_plan(a.shape.dims, b.shape.dims, output_shape.dims) is None:
        return mtf.einsum([a, b], output_shape=output_shape)
    return MatmulOperation(a, b, output_shape).outputs[0]


def adds_as_bias(y: mtf.Tensor, bias: mtf.Tensor) -> bool:
    """Whether bias's dimensions are y's last ones (and there are others to sum its gradient over), same dtype."""
    summed = y.shape.dims[:y.shape.ndims - bias.shape.ndims]
    return bool(summed) and y.shape.dims[len(summed):] == bias.shape.dims and y.dtype == bias.dtype


def bias_gradient(dy: mtf.Tensor, bias: mtf.Tensor) -> mtf.Tensor:
    """dy summed over every dimension but bias's, as a product with a row of ones (MatmulOperation, all-reduced
    where the layout splits the summed dimensions): TF's column reduction of the MLP's [tokens, 4 x embd]
    gradient was 7x slower on a 2-core AVX2 CPU (models/kernels/common.row_sums)."""
    summed = dy.shape.dims[:dy.shape.ndims - bias.shape.ndims]
    return matmul(mtf.ones(dy.mesh, summed, dy.dtype), dy, bias.shape)


def bias_add(y: mtf.Tensor, bias: mtf.Tensor) -> mtf.Tensor:
    """y + bias, where bias's dimensions are y's last ones; its gradient is `bias_gradient`."""
    if not adds_as_bias(y, bias):
        return y + bias

    def grad_function(op, dy):
        return [dy, bias_gradient(dy, bias)]

    return mtf.slicewise(lambda y_, b_: y_ + b_, [y, bias], output_shape=y.shape, output_dtype=y.dtype,
                         splittable_dims=y.shape.dims, grad_function=grad_function, name="bias_add")
