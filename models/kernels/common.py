"""What several kernels share: fp32 compute for the fused element-wise kernels, XLA fusion that steps aside
for small tensors, and the mesh axes a kernel's gradient (or partial product) is summed over."""
from __future__ import annotations

import tensorflow.compat.v1 as tf


def f32(x):
    """The fused element-wise kernels compute in fp32 and store in the input's dtype: XLA's CPU code for bf16
    arithmetic ran GELU, LayerNorm and the softmax gradient ~3x slower than fp32 (bf16 training, 2026-11-23)."""
    return tf.cast(x, tf.float32)


XLA_MIN_ELEMENTS = 1 << 14


def fused(fn, *args):
    """fn(*args) for a tf.function(jit_compile=True) `fn`; on a small first argument (decoding's one-token
    activations) its Python body as plain TF ops instead, where launching the compiled kernel costs more (~80 us)
    than the passes it saves."""
    size = args[0].shape.num_elements()
    if size is not None and size < XLA_MIN_ELEMENTS:
        return fn.python_function(*args)
    return fn(*args)


def reduced_mesh_axes(mesh_impl, dims) -> list[int]:
    """The mesh axes that split any of `dims`, sorted: what a result summed over `dims` is all-reduced over."""
    axes = [mesh_impl.tensor_dimension_to_mesh_axis(d) for d in dims]
    return sorted({a for a in axes if a is not None})
