"""Small building blocks with named dimensions: seeded variables, norms, dense, MLP (activations live in
models/activations.py).

Variable names and shapes follow GPT-Neo's checkpoints (`norm_1/g`, `conv1d_main/c_fc/kernel`, ...),
so released GPT-Neo checkpoints and ours are interchangeable.
"""
from __future__ import annotations

import math
import zlib

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels import elementwise
from models.kernels.matmul import bias_add, matmul
from models.activations import activation_for, with_bias
from schema import GPTConfig


def seeded_normal(stddev: float, name: str, seed: int) -> tf.keras.initializers.Initializer:
    """A normal initializer whose seed comes from the variable's full name.

    mesh-tensorflow creates master variables while lowering, so TF's op-counter seeds would differ between
    layouts; a name-derived seed gives every layout (and every run with the same config seed) the same
    initial weights.
    """
    scope = tf.get_variable_scope().name
    full_name = f"{scope}/{name}" if scope else name
    return tf.random_normal_initializer(stddev=stddev, seed=(zlib.crc32(full_name.encode()) + seed) % (2 ** 31))


def variable(mesh: mtf.Mesh, name: str, shape, dtype: mtf.VariableDType, stddev: float | None = None,
             constant: float | None = None, seed: int = 0) -> mtf.Tensor:
    """mtf.get_variable with either a seeded normal or a constant initializer."""
    if constant is not None:
        init = tf.constant_initializer(constant)
    else:
        init = seeded_normal(stddev, name, seed)
    return mtf.get_variable(mesh, name, mtf.Shape(shape), initializer=init, dtype=dtype)


def layer_norm(x: mtf.Tensor, scope: str, dtype: mtf.VariableDType, epsilon: float = 1e-5) -> mtf.Tensor:
    """LayerNorm over the last dimension with gain `g` and bias `b` (GPT-Neo's names, epsilon 1e-5)."""
    dim = x.shape[-1]
    with tf.variable_scope(scope):
        g = variable(x.mesh, "g", [dim], dtype, constant=1.0)
        b = variable(x.mesh, "b", [dim], dtype, constant=0.0)
        # x - mean, * rsqrt(mean square + eps) * g + b, fused forward and backward (models/kernels/elementwise.py)
        return elementwise.layer_norm(x, g, b, epsilon)


def scale_norm(x: mtf.Tensor, scope: str, dtype: mtf.VariableDType, epsilon: float = 1e-5) -> mtf.Tensor:
    """`scalenorm`: normalise as LayerNorm does, then one learned scalar gain `g` (init 1) instead of a gain
    and bias per feature (Nguyen & Salazar 2019; GPT-Neo's form and names)."""
    dim = x.shape[-1]
    with tf.variable_scope(scope):
        g = variable(x.mesh, "g", [], dtype, constant=1.0)
        # in float32, as LayerNorm's kernel: a float16 mean square overflows above 256
        out_dtype, x, g = x.dtype, mtf.cast(x, tf.float32), mtf.cast(g, tf.float32)
        x = x - mtf.reduce_mean(x, reduced_dim=dim)
        variance = mtf.reduce_mean(mtf.square(x), reduced_dim=dim)
        return mtf.cast(x * mtf.rsqrt(variance + epsilon) * g, out_dtype)


def rezero(x: mtf.Tensor, scope: str, dtype: mtf.VariableDType) -> mtf.Tensor:
    """`rezero`: a residual branch times a learned scalar `g` that starts at 0, so every block starts as the
    identity (Bachlechner et al. 2020, arXiv:2003.04887; GPT-Neo's `norm_rezero_*/g`)."""
    with tf.variable_scope(scope):
        return x * variable(x.mesh, "g", [], dtype, constant=0.0)


def pre_norm(x: mtf.Tensor, scope: str, cfg: GPTConfig, dtype: mtf.VariableDType) -> mtf.Tensor:
    """The norm in front of a residual branch: LayerNorm, ScaleNorm, or none with ReZero."""
    if cfg.rezero:
        return x
    if cfg.scalenorm:
        return scale_norm(x, scope, dtype)
    return layer_norm(x, scope, dtype)


def dense(x: mtf.Tensor, scope: str, new_dim: mtf.Dimension | list, cfg: GPTConfig, dtype: mtf.VariableDType,
          scale_for_residual: bool = False, activation=None) -> mtf.Tensor:
    """GPT-Neo's `linear`: a biased dense layer under `conv1d_main/<scope>/kernel|bias`, then
    `activation(product, bias)` if given (activations.with_bias: GELU adds the bias in its own kernel).

    scale_by_depth shrinks the init of projections that feed the residual stream by 1/sqrt(n_layer);
    scale_by_in shrinks every projection by 1/sqrt(fan_in), as GPT-2 and GPT-Neo do.
    """
    stddev = 0.02
    if cfg.scale_by_depth and scale_for_residual:
        stddev /= math.sqrt(cfg.n_layer)
    if cfg.scale_by_in:
        stddev /= math.sqrt(x.shape[-1].size)
    new_dims = new_dim if isinstance(new_dim, list) else [new_dim]
    with tf.variable_scope("conv1d_main"), tf.variable_scope(scope):
        # mtf.layers.dense's variables (kernel [in, new...], bias [new...]), its product as one matmul
        kernel = variable(x.mesh, "kernel", [x.shape[-1]] + new_dims, dtype, stddev=stddev, seed=cfg.seed)
        y = matmul(x, mtf.cast(kernel, x.dtype), x.shape.dims[:-1] + new_dims)
        bias = variable(x.mesh, "bias", new_dims, dtype, constant=0.0)
        if activation is None:
            return bias_add(y, bias)
    return activation(y, bias)  # outside the scope: parametric activations' scalars sit beside the layer


def mlp(x: mtf.Tensor, scope: str, cfg: GPTConfig, dtype: mtf.VariableDType, train: bool) -> mtf.Tensor:
    """Feed-forward block: c_fc (4x wider), activation, c_proj back, residual dropout.

    With mlp_glu, c_fc is twice as wide, [embd, glu=2, intermediate_expanded] (GPT-Neo's [embd, 8*embd]
    reshaped: the first half is the value, the second the gate), and the hidden layer is value * act(gate).
    The two halves are a dimension of their own, not a slice, so any layout of intermediate_expanded works.
    """
    hidden = mtf.Dimension("intermediate_expanded", 4 * cfg.n_embd)
    activation = activation_for(cfg.activation_function, x.dtype)
    with tf.variable_scope(scope):
        if cfg.mlp_glu:
            glu = mtf.Dimension("glu", 2)
            both = dense(x, "c_fc", [glu, hidden], cfg, dtype)
            h = mtf.gather(both, 0, glu) * activation(mtf.gather(both, 1, glu))
        else:
            h = dense(x, "c_fc", hidden, cfg, dtype, activation=with_bias(activation, x.dtype))
        h = dense(h, "c_proj", x.shape[-1], cfg, dtype, scale_for_residual=True)
        return dropout(h, cfg.res_dropout, train)


def dropout(x: mtf.Tensor, rate: float, train: bool) -> mtf.Tensor:
    return mtf.dropout(x, is_training=True, rate=rate) if train and rate > 0 else x
