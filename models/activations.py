"""Activation functions of the feed-forward layers, by the names GPT-Neo's `activation_function` accepts.

Most are plain functions. The parametric ones (`aria`, `prelu`, `parcsinh`, `psoftplus`, `proottanh`) learn
scalar parameters; GPT-Neo named those after a random number drawn at graph build time, which gives every
build (and every mesh layout) different names. Here they are scalars named by their role under an
`activation/` scope beside the layer that uses them (e.g. `h0/mlp/activation/prelu_alpha`), so they are the
same on every layout and load from a checkpoint.
"""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels.elementwise import gelu
from models.kernels.matmul import bias_add


def _scalar(x: mtf.Tensor, name: str, init: float) -> mtf.Tensor:
    """A learned scalar in x's activation dtype, fp32 master (reused if the scope already has it)."""
    dtype = mtf.VariableDType(master_dtype=tf.float32, slice_dtype=tf.float32, activation_dtype=x.dtype)
    with tf.variable_scope("activation"):
        return mtf.get_variable(x.mesh, name, mtf.Shape([]), initializer=tf.constant_initializer(init), dtype=dtype)


def _positive(x: mtf.Tensor, name: str, offset: float) -> mtf.Tensor:
    """softplus(learned scalar, initially 0) + offset: a parameter that stays above `offset`."""
    return mtf.softplus(_scalar(x, name, 0.0)) + offset


def _pow(base, exponent):
    """base ** exponent for positive bases (mesh-tensorflow has no pow)."""
    return mtf.exp(mtf.log(base) * exponent)


def _arcsinh(x):
    return mtf.log(x + mtf.sqrt(1 + mtf.square(x)))


def _elish(x):
    positive = mtf.cast(mtf.greater(x, 0), x.dtype)
    exp = mtf.exp(x)
    return positive * x * mtf.sigmoid(x) + (1 - positive) * (exp - 1) * mtf.sigmoid(x)


def _aria(x):
    """ARiA (Richards curve times x), with its five parameters learned."""
    lower, upper = _scalar(x, "aria_lower", 0.0), _scalar(x, "aria_upper", 1.0)
    offset, growth = _positive(x, "aria_offset", 0.0), _scalar(x, "aria_growth", 1.0)
    rate, shape = _scalar(x, "aria_rate", -1.0), _positive(x, "aria_shape", 1.0)
    return x * (lower + upper / _pow(offset + growth * mtf.exp(rate * x), 1 / shape))


# RReLU's slope is random while training in the original; drawn once at graph build (as GPT-Neo did) it
# would differ between builds, so this uses the mean slope of its usual range [1/8, 1/3], as RReLU does at
# evaluation time.
_RRELU_SLOPE = (1 / 8 + 1 / 3) / 2

ACTIVATIONS = {
    "gelu": gelu,  # mtf.gelu's tanh approximation (GPT-Neo, HF's "gelu_new"), XLA-fused
    "relu": mtf.relu,
    "selu": mtf.selu,
    "elu": mtf.elu,
    "swish": mtf.swish,
    "silu": mtf.swish,
    "sigmoid": mtf.sigmoid,
    "tanh": mtf.tanh,
    "softplus": mtf.softplus,
    "abs": mtf.abs,
    "sin": mtf.sin,
    "cos": mtf.cos,
    "sign": mtf.sign,
    "lrelu001": lambda x: mtf.leaky_relu(x, alpha=0.01),
    "lrelu020": lambda x: mtf.leaky_relu(x, alpha=0.20),
    "id": lambda x: x,
    "triangle_relax": lambda x: mtf.sin(x) - mtf.sin(3 * x) / 9 + mtf.sin(5 * x) / 25 - mtf.sin(7 * x) / 49,
    "square_relax": lambda x: mtf.cos(x) - mtf.cos(3 * x) / 3 + mtf.cos(5 * x) / 5 - mtf.cos(7 * x) / 7,
    "spike": lambda x: 1 / (1 + mtf.square(x)),
    "spike2": lambda x: mtf.exp(-mtf.square(x)),
    "tanhshrink": lambda x: x - mtf.tanh(x),
    "softsign": lambda x: x / (mtf.abs(x) + 1),
    "softmax": lambda x: mtf.softmax(x, x.shape[-1]),
    "logsoftmax": lambda x: mtf.log_softmax(x, x.shape[-1]),
    "bipolarsigmoid": lambda x: mtf.sigmoid(x) * 2 - 1,
    "rrelu": lambda x: mtf.leaky_relu(x, alpha=_RRELU_SLOPE),
    "elish": _elish,
    "arcsinh": _arcsinh,
    "aria": _aria,
    "prelu": lambda x: mtf.relu(x) - _scalar(x, "prelu_alpha", 0.2) * mtf.relu(-x),
    "parcsinh": lambda x: _scalar(x, "parcsinh_scale", 1.0) * _arcsinh(x * _positive(x, "parcsinh_rate", 1.0)),
    "psoftplus": lambda x: (_scalar(x, "psoftplus_scale", 1.0) * mtf.softplus(x * _scalar(x, "psoftplus_rate", 1.0))
                            + _scalar(x, "psoftplus_shift", 0.0)),
    "proottanh": lambda x: (_pow(mtf.square(x) + _positive(x, "proottanh_offset", 1.0),
                                 1 / _positive(x, "proottanh_root", 3.0)) * mtf.tanh(x)),
    "maxsig": lambda x: mtf.maximum(x, mtf.sigmoid(x)),
    "cosid": lambda x: mtf.cos(x) - x,
    "minsin": lambda x: mtf.minimum(x, mtf.sin(x)),
    "maxtanh": lambda x: mtf.maximum(x, mtf.tanh(x)),
    "mish": lambda x: x * mtf.tanh(mtf.softplus(x)),
    "tanhexp": lambda x: x * mtf.tanh(mtf.exp(x)),
    "lisht": lambda x: x * mtf.tanh(x),
    "seagull": lambda x: mtf.log(1 + mtf.square(x)),
    "snake": lambda x: x + mtf.square(mtf.sin(x)),
    "roottanh": lambda x: _pow(mtf.square(x) + 1, 1 / 3) * mtf.tanh(x),
    "softplusmone": lambda x: mtf.softplus(x) - 1,
}


def activation_for(name: str, dtype: tf.DType):
    """ACTIVATIONS[name] for activations of `dtype`: under float16 computed in float32 (exp and squares leave
    float16's range above ~11 and ~256, and elish's exp(x) * 0 is then NaN), except GELU, whose fused kernel
    computes in float32 already. Other dtypes get the function itself."""
    fn = ACTIVATIONS[name]
    if dtype != tf.float16 or fn is gelu:
        return fn
    return lambda x: mtf.cast(fn(mtf.cast(x, tf.float32)), x.dtype)


def with_bias(fn, dtype: tf.DType):
    """`fn` of a biased product, as a function of (product, bias). Under 16-bit activations GELU's kernel adds the
    bias in its own pass, in fp32 (TF's separate bf16 add was a slow pass over the MLP's widest activations:
    docs/speed.md); in fp32 TF's add is as fast, so it stays a pass of its own, as for every other activation."""
    if fn is gelu and dtype != tf.float32:
        return gelu
    return lambda y, bias: fn(bias_add(y, bias))
