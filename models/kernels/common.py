"""What several kernels share: fp32 compute for the fused element-wise kernels, XLA fusion that steps aside
for small tensors, and the mesh axes a kernel's gradient (or partial product) is summed over."""
from __future__ import annotations

import contextlib
import os

import tensorflow.compat.v1 as tf


def f32(x):
    """The fused element-wise kernels compute in fp32 and store in the input's dtype: XLA's CPU code for bf16
    arithmetic ran GELU, LayerNorm and the softmax gradient ~3x slower than fp32 (bf16 training, 2026-11-23)."""
    return tf.cast(x, tf.float32)


XLA_MIN_ELEMENTS = 1 << 14

# The fused kernels' path: XLA-compiled (the default) or plain TF ops (the same Python bodies, op by op), for
# devices where XLA cannot compile (XLA:GPU without ptxas/libdevice: runtime/gpus.py probes it at start-up and
# switches) or when forced: GPT_NEO_PLAIN_KERNELS=1 in the environment, or main.py --plain_kernels. It is read
# when a graph is built (each kernel call picks its path then), so set it before building.
PLAIN_KERNELS_ENV = "GPT_NEO_PLAIN_KERNELS"
_xla_kernels = None  # None: not chosen in this process (XLA unless the environment forces plain)


def plain_kernels_forced() -> bool:
    return os.environ.get(PLAIN_KERNELS_ENV, "").strip().lower() not in ("", "0", "false", "no")


def xla_kernels() -> bool:
    """Whether the fused kernels compile with XLA now."""
    if plain_kernels_forced():
        return False
    return True if _xla_kernels is None else _xla_kernels


def use_xla_kernels(enabled) -> None:
    """Chooses the fused kernels' path for graphs built from now on (None: back to the default)."""
    global _xla_kernels
    _xla_kernels = enabled


@contextlib.contextmanager
def kernels(path: str):
    """Builds with the fused kernels on `path` ("xla" or "plain") inside the block (the tests run both)."""
    if path not in ("xla", "plain"):
        raise ValueError(f"kernel path {path!r}: 'xla' or 'plain'")
    previous = _xla_kernels
    use_xla_kernels(path == "xla")
    try:
        yield
    finally:
        use_xla_kernels(previous)


def compiled(fn, *args):
    """fn(*args) for a tf.function(jit_compile=True) `fn`: XLA-compiled, or its Python body as plain TF ops where
    the kernels run plain (`xla_kernels`)."""
    return fn(*args) if xla_kernels() else fn.python_function(*args)


def fused(fn, *args):
    """`compiled(fn, *args)`; on a small first argument (decoding's one-token activations) its Python body as
    plain TF ops instead, where launching the compiled kernel costs more (~80 us) than the passes it saves."""
    size = args[0].shape.num_elements()
    if size is not None and size < XLA_MIN_ELEMENTS:
        return fn.python_function(*args)
    return compiled(fn, *args)


def reduced_mesh_axes(mesh_impl, dims) -> list[int]:
    """The mesh axes that split any of `dims`, sorted: what a result summed over `dims` is all-reduced over."""
    axes = [mesh_impl.tensor_dimension_to_mesh_axis(d) for d in dims]
    return sorted({a for a in axes if a is not None})
