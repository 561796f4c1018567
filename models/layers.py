"""Small building blocks with named dimensions: seeded variables, layer norm, dense, MLP, activations.

Variable names and shapes follow GPT-Neo's checkpoints (`norm_1/g`, `conv1d_main/c_fc/kernel`, ...),
so released GPT-Neo checkpoints and ours are interchangeable.
"""
from __future__ import annotations

import math
import zlib

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.config import GPTConfig


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
        x = x - mtf.reduce_mean(x, reduced_dim=dim)
        variance = mtf.reduce_mean(mtf.square(x), reduced_dim=dim)
        return x * mtf.rsqrt(variance + epsilon) * g + b


def dense(x: mtf.Tensor, scope: str, new_dim: mtf.Dimension, cfg: GPTConfig, dtype: mtf.VariableDType,
          scale_for_residual: bool = False) -> mtf.Tensor:
    """GPT-Neo's `linear`: a biased dense layer under `conv1d_main/<scope>/kernel|bias`.

    scale_by_depth shrinks the init of projections that feed the residual stream by 1/sqrt(n_layer);
    scale_by_in shrinks every projection by 1/sqrt(fan_in), as GPT-2 and GPT-Neo do.
    """
    stddev = 0.02
    if cfg.scale_by_depth and scale_for_residual:
        stddev /= math.sqrt(cfg.n_layer)
    if cfg.scale_by_in:
        stddev /= math.sqrt(x.shape[-1].size)
    with tf.variable_scope("conv1d_main"):
        with tf.variable_scope(scope):
            init = seeded_normal(stddev, "kernel", cfg.seed)
        return mtf.layers.dense(x, new_dims=[new_dim], reduced_dims=[x.shape[-1]], name=scope, use_bias=True,
                                kernel_initializer=init, variable_dtype=dtype)


ACTIVATIONS = {
    "gelu": mtf.gelu,  # tanh approximation, as GPT-Neo and HF's "gelu_new"
    "relu": mtf.relu,
    "selu": mtf.selu,
    "elu": mtf.elu,
    "swish": mtf.swish,
    "silu": mtf.swish,
    "sigmoid": mtf.sigmoid,
    "tanh": mtf.tanh,
    "softplus": mtf.softplus,
}


def mlp(x: mtf.Tensor, scope: str, cfg: GPTConfig, dtype: mtf.VariableDType, train: bool) -> mtf.Tensor:
    """Feed-forward block: c_fc (4x wider), activation, c_proj back, residual dropout."""
    hidden = mtf.Dimension("intermediate_expanded", 4 * cfg.n_embd)
    with tf.variable_scope(scope):
        h = ACTIVATIONS[cfg.activation_function](dense(x, "c_fc", hidden, cfg, dtype))
        h = dense(h, "c_proj", x.shape[-1], cfg, dtype, scale_for_residual=True)
        return dropout(h, cfg.res_dropout, train)


def dropout(x: mtf.Tensor, rate: float, train: bool) -> mtf.Tensor:
    return mtf.dropout(x, is_training=True, rate=rate) if train and rate > 0 else x
