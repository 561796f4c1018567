"""Fused element-wise kernels: GELU and LayerNorm, each one XLA-fused pass forward and one backward
(`tf.function(jit_compile=True)`, compiled once per shape) where mtf's op-by-op formulas make many passes over
the activations: mtf.gelu is ~8 element-wise ops forward and ~20 backward over [batch, sequence, 4 x embd].
They compute in fp32 and store in the input's dtype, and run as plain TF ops on small tensors
(models/kernels/common.py)."""
from __future__ import annotations

import math

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels.common import f32, fused, reduced_mesh_axes, row_sums, stored, widened, xla_function
from models.kernels.matmul import adds_as_bias, bias_add, bias_gradient


# ---------------------------------------------------------------------------------------------------------
# GELU


_GELU_C = math.sqrt(2 / math.pi)


def _gelu_value(y):
    """tanh-GELU of fp32 y."""
    return y * (0.5 * (1.0 + tf.tanh(_GELU_C * (y + 0.044715 * y * y * y))))


def _gelu_gradient(y, dy):
    """dy * GELU'(y), fp32."""
    t = tf.tanh(_GELU_C * (y + 0.044715 * y * y * y))
    return dy * (0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * (_GELU_C * (1.0 + 3 * 0.044715 * y * y)))


@xla_function
def _gelu_forward(x):
    return stored(_gelu_value(widened(x)), x.dtype)


@xla_function
def _gelu_backward(x, dy):
    return stored(_gelu_gradient(widened(x), widened(dy)), dy.dtype)


@xla_function
def _bias_gelu_forward(x, b):
    return stored(_gelu_value(widened(x) + widened(b)), x.dtype)


@xla_function
def _bias_gelu_backward(x, b, dy):
    return stored(_gelu_gradient(widened(x) + widened(b), widened(dy)), dy.dtype)


def gelu(x: mtf.Tensor, bias: mtf.Tensor | None = None) -> mtf.Tensor:
    """mtf.gelu's tanh approximation (GPT-Neo's, HF's "gelu_new") of x, or of x + bias (bias: x's last
    dimensions), forward and gradient each one XLA-fused pass over the [batch, sequence, 4 x embd] activations,
    where mtf.gelu's op-by-op formula makes ~8 passes forward and ~20 backward (a sixth of a step on the
    benchmark model). With a bias the add is in the forward kernel's pass, in fp32 (the MLP's c_fc bias: one
    pass over the widest activations fewer), the backward kernel adds it again rather than keep the sum, and the
    bias gradient is the input gradient's row sums (matmul.bias_gradient). Element-wise: any layout."""
    dims = x.shape.dims
    if bias is not None and not adds_as_bias(x, bias):
        x, bias = bias_add(x, bias), None
    if bias is None:
        def grad_function(op, dy):
            return [mtf.slicewise(lambda x_, dy_: fused(_gelu_backward, x_, dy_), [op.inputs[0], dy],
                                  output_shape=x.shape, output_dtype=x.dtype, splittable_dims=dims, grad_function=0,
                                  name="gelu_grad")]

        return mtf.slicewise(lambda x_: fused(_gelu_forward, x_), [x], output_shape=x.shape, output_dtype=x.dtype,
                             splittable_dims=dims, grad_function=grad_function, name="gelu")

    def biased_grad_function(op, dy):
        dx = mtf.slicewise(lambda x_, b_, dy_: fused(_bias_gelu_backward, x_, b_, dy_), [op.inputs[0], op.inputs[1], dy],
                           output_shape=x.shape, output_dtype=x.dtype, splittable_dims=dims, grad_function=0,
                           name="bias_gelu_grad")
        return [dx, bias_gradient(dx, bias)]

    return mtf.slicewise(lambda x_, b_: fused(_bias_gelu_forward, x_, b_), [x, bias], output_shape=x.shape,
                         output_dtype=x.dtype, splittable_dims=dims, grad_function=biased_grad_function,
                         name="bias_gelu")


# ---------------------------------------------------------------------------------------------------------
# Layer norm


@xla_function
def _layer_norm_forward(x, g, b, epsilon):
    """y, and each row's mean and 1/sqrt(var + eps) for the backward pass (which then reads x once instead of
    three times: its moments were two more passes over x)."""
    dtype, x, g, b = x.dtype, widened(x), widened(g), widened(b)
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    xc = x - mean
    r = tf.math.rsqrt(tf.reduce_mean(xc * xc, axis=-1, keepdims=True) + epsilon)
    return stored(xc * r * g + b, dtype), mean[..., 0], r[..., 0]


@xla_function
def _layer_norm_backward_fused(x, g, dy, mean, r):
    dtype, x, g, dy = x.dtype, widened(x), widened(g), widened(dy)
    r = r[..., None]
    x_hat = (x - mean[..., None]) * r
    d_hat = dy * g
    dx = r * (d_hat - tf.reduce_mean(d_hat, axis=-1, keepdims=True)
              - x_hat * tf.reduce_mean(d_hat * x_hat, axis=-1, keepdims=True))
    return stored(dx, dtype), stored(dy * x_hat, dtype)


def _layer_norm_backward(x, g, dy, mean, r):
    """dx, and dg / db summed over this slice's rows (the caller all-reduces them over the other devices). The
    row sums run outside XLA, as products with a row of ones (common.row_sums): XLA's and TF's own column
    reductions are slower on CPU."""
    dx, dy_x_hat = fused(_layer_norm_backward_fused, x, g, dy, mean, r)
    return dx, tf.cast(row_sums(dy_x_hat), g.dtype), tf.cast(row_sums(dy), g.dtype)


def _split_moments(mesh_impl, x, axis: int, size: int, epsilon: float):
    """Each row's mean and 1/sqrt(var + eps) over a last dimension split along mesh axis `axis`, as laid-out
    tensors without that dimension."""
    total = mesh_impl.allreduce(mesh_impl.slicewise(lambda t: tf.reduce_sum(f32(t), -1), x), [axis], "SUM")
    mean = mesh_impl.slicewise(lambda s: s / size, total)
    squares = mesh_impl.allreduce(
        mesh_impl.slicewise(lambda t, m: tf.reduce_sum(tf.square(f32(t) - m[..., None]), -1), x, mean), [axis],
        "SUM")
    return mean, mesh_impl.slicewise(lambda s: tf.math.rsqrt(s / size + epsilon), squares)


class LayerNormOperation(mtf.Operation):
    """(x - mean) / sqrt(var + eps) * g + b over x's last dimension, as one XLA-fused pass per slice; when the
    layout splits that dimension, the means are all-reduced across it. Its second and third outputs are each
    row's mean and 1/sqrt(var + eps), which the gradient reads instead of recomputing them (tiny: one value per
    row)."""

    def __init__(self, x: mtf.Tensor, g: mtf.Tensor, b: mtf.Tensor, epsilon: float):
        super().__init__([x, g, b], name="layer_norm")
        self._epsilon = epsilon
        rows = x.shape - x.shape.dims[-1]
        self._outputs = [mtf.Tensor(self, x.shape, x.dtype), mtf.Tensor(self, rows, tf.float32),
                         mtf.Tensor(self, rows, tf.float32)]

    def gradient(self, grad_ys):
        x, g, _ = self.inputs
        _, mean, r = self.outputs
        dx, dg, db = LayerNormGradOperation(x, g, grad_ys[0], mean, r).outputs
        return [dx, dg, db]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        x, g, b = (lowering.tensors[t] for t in self.inputs)
        dim = self.inputs[0].shape.dims[-1]
        axis = mesh_impl.tensor_dimension_to_mesh_axis(dim)
        eps = self._epsilon
        if axis is None:
            y, mean, r = mesh_impl.slicewise(lambda x_, g_, b_: fused(_layer_norm_forward, x_, g_, b_, eps), x, g, b)
        else:
            mean, r = _split_moments(mesh_impl, x, axis, dim.size, eps)

            def normalized(x_, m, r_, g_, b_):
                return tf.cast((f32(x_) - m[..., None]) * r_[..., None] * f32(g_) + f32(b_), x_.dtype)

            y = mesh_impl.slicewise(normalized, x, mean, r, g, b)
        for output, value in zip(self.outputs, (y, mean, r)):
            lowering.set_tensor_lowering(output, value)


class LayerNormGradOperation(mtf.Operation):
    def __init__(self, x: mtf.Tensor, g: mtf.Tensor, dy: mtf.Tensor, mean: mtf.Tensor, r: mtf.Tensor):
        super().__init__([x, g, dy, mean, r], name="layer_norm_grad")
        self._outputs = [mtf.Tensor(self, x.shape, x.dtype), mtf.Tensor(self, g.shape, g.dtype),
                         mtf.Tensor(self, g.shape, g.dtype)]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        x_shape = self.inputs[0].shape
        x, g, dy, mean, r = (lowering.tensors[t] for t in self.inputs)
        dim = x_shape.dims[-1]
        axis = mesh_impl.tensor_dimension_to_mesh_axis(dim)
        if axis is None:
            dx, dg, db = mesh_impl.slicewise(_layer_norm_backward, x, g, dy, mean, r)
        else:
            x_hat = mesh_impl.slicewise(lambda x_, m, r_: (f32(x_) - m[..., None]) * r_[..., None], x, mean, r)
            d_hat = mesh_impl.slicewise(lambda d, g_: f32(d) * f32(g_), dy, g)
            mean_d = mesh_impl.allreduce(mesh_impl.slicewise(lambda d: tf.reduce_sum(d, -1, keepdims=True), d_hat),
                                         [axis], "SUM")
            mean_dx = mesh_impl.allreduce(
                mesh_impl.slicewise(lambda d, h: tf.reduce_sum(d * h, -1, keepdims=True), d_hat, x_hat), [axis], "SUM")
            n = dim.size
            x_dtype, g_dtype = self.inputs[0].dtype, self.inputs[1].dtype
            dx = mesh_impl.slicewise(lambda r_, d, h, m1, m2: tf.cast(r_[..., None] * (d - m1 / n - h * (m2 / n)),
                                                                      x_dtype), r, d_hat, x_hat, mean_d, mean_dx)
            rows = list(range(x_shape.ndims - 1))
            dg = mesh_impl.slicewise(lambda d, h: tf.cast(tf.reduce_sum(f32(d) * h, axis=rows), g_dtype), dy, x_hat)
            db = mesh_impl.slicewise(lambda d: tf.cast(tf.reduce_sum(f32(d), axis=rows), g_dtype), dy)
        row_axes = reduced_mesh_axes(mesh_impl, x_shape.dims[:-1])
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
