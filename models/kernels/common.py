"""What several kernels share: fp32 compute for the fused element-wise kernels, XLA fusion that steps aside
for small tensors, and the mesh axes a kernel's gradient (or partial product) is summed over."""
from __future__ import annotations

import contextlib
import contextvars
import hashlib

import tensorflow.compat.v1 as tf

try:  # TensorFlow's internals (2.20, 2.21): without them kernels keep TF's names, and a cache finds fewer of them
    from tensorflow.python.eager.polymorphic_function import atomic_function
except ImportError:
    atomic_function = None


# The attention bias where a query may not see a key, added to fp32 logits: exp() of it is 0 in fp32, and it is
# finite, so a multiply by 0 and softmax over a fully masked row stay NaN-free (-1e10 is -inf in float16: biases
# are built in float32).
MASKED = -1e10


def f32(x):
    """The fused element-wise kernels compute in fp32 and store in the input's dtype: XLA's CPU code for bf16
    arithmetic ran GELU, LayerNorm and the softmax gradient ~3x slower than fp32 (bf16 training, 2026-11-23).
    Inside an XLA-compiled kernel, `widened` and `stored` convert instead."""
    return tf.cast(x, tf.float32)


def widened(x):
    """`f32(x)` inside an XLA-compiled kernel. A bf16 value is the upper half of its fp32 one, and the conversion
    is written as that (16-bit integer widened and shifted): XLA's own bf16 convert keeps a row reduction from
    vectorizing (the max over [2048, 50257] bf16 logits took 124 ms through it, 72 through the shift, 24 over
    fp32; one core, 2026-11-26). The same values exactly. As plain TF ops (tf.cast's one pass) it is slower."""
    if x.dtype != tf.bfloat16:
        return tf.cast(x, tf.float32)
    bits = tf.cast(tf.bitcast(x, tf.uint16), tf.uint32)
    return tf.bitcast(tf.bitwise.left_shift(bits, 16), tf.float32)


def stored(y, dtype):
    """fp32 `y` stored in `dtype` inside an XLA-compiled kernel; to bf16 as integer rounding to nearest even (tf.cast's result, NaN kept NaN):
    XLA's own bf16 convert made a fused pass storing bf16 slower than storing fp32 (the loss's gradient over
    [2048, 50257] logits: 161 ms, 68 ms this way, fp32 153)."""
    if dtype != tf.bfloat16:
        return tf.cast(y, dtype)
    bits = tf.bitcast(y, tf.uint32)
    rounded = bits + 0x7FFF + tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 16), 1)
    upper = tf.where(tf.math.is_nan(y), tf.fill(tf.shape(bits), tf.constant(0x7FC00000, tf.uint32)), rounded)
    return tf.bitcast(tf.cast(tf.bitwise.right_shift(upper, 16), tf.uint16), tf.bfloat16)


XLA_MIN_ELEMENTS = 1 << 14


def _named_by_content(from_func_graph):
    """TensorFlow's `atomic_function.from_func_graph`, naming every jit_compile function it makes after its body
    (`__inference_<python name>_<digest of its graph>`) instead of a process-wide counter (`_<uid>`, which grows
    with every tensor built before). XLA's compile caches are keyed by that name (with the argument shapes): under
    counter names the same kernel traced in another graph, or after anything else in a process, was a new one
    to TensorFlow's persistent compile cache (--tf_xla_persistent_cache_directory), which then compiled it again
    (a 2-device tiny training after a 1-device one: all 5 kernels missed, 4.5 CPU s). The digest covers the body
    and attributes, so two functions share a name only when they are the same function; the cache files are keyed
    by the compiled HLO's fingerprint besides."""
    def from_func_graph_named(name, graph, attrs, *args, **kwargs):
        must_compile = attrs and attrs.get("_XlaMustCompile")
        if must_compile is True or getattr(must_compile, "b", False):
            body = graph.as_graph_def().SerializeToString(deterministic=True)
            digest = hashlib.sha256(body + repr(sorted((k, str(v)) for k, v in attrs.items())).encode())
            name = f"__inference_{graph.name}_{digest.hexdigest()[:20]}"
        return from_func_graph(name, graph, attrs, *args, **kwargs)
    from_func_graph_named.named_by_content = True
    return from_func_graph_named


if (atomic_function is not None and hasattr(atomic_function, "from_func_graph")
        and not getattr(atomic_function.from_func_graph, "named_by_content", False)):
    atomic_function.from_func_graph = _named_by_content(atomic_function.from_func_graph)

# The fused kernels' path: XLA-compiled (the default) or plain TF ops (the same Python bodies, op by op), for
# devices where XLA cannot compile (XLA:GPU without ptxas/libdevice: devices/gpus.py probes it at start-up) or when
# forced (main.py --plain_kernels). It is a value given where a graph is built: execution/runner.py builds a job's
# step inside `kernels(placement.kernels)`, and each kernel reads it while the step is built and lowered. Outside
# any such block (the kernels' own tests, graphs built by hand) the kernels compile with XLA.
KERNEL_PATHS = ("xla", "plain")
_path = contextvars.ContextVar("fused_kernel_path", default="xla")


def kernel_path() -> str:
    """The fused kernels' path of the graph being built: that of the enclosing `kernels` block (XLA outside any)."""
    return _path.get()


def xla_kernels() -> bool:
    """Whether the fused kernels of the graph being built compile with XLA."""
    return kernel_path() == "xla"


@contextlib.contextmanager
def kernels(path: str):
    """Builds the fused kernels on `path` ("xla" or "plain") inside the block."""
    if path not in KERNEL_PATHS:
        raise ValueError(f"kernel path {path!r}: 'xla' or 'plain'")
    token = _path.set(path)
    try:
        yield
    finally:
        _path.reset(token)


def xla_function(fn):
    """`fn` as a tf.function(jit_compile=True), traced as plain Python (autograph off). The kernels' bodies branch
    and loop on Python values only (dtypes, lists of slices), so autograph's conversion changes nothing in the
    traced graph (the same body, the same content-digest name), but converting them (parsing and rewriting their
    source, and that of every function they call) cost each process ~1.5 CPU s on a 2-core EPYC before its first
    step (cProfile of a tiny training: Adam's update alone was most of it). A kernel that needs
    tensor-dependent control flow writes tf.cond / tf.while_loop."""
    return tf.function(fn, jit_compile=True, autograph=False)


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


def row_sums(t):
    """t summed over every axis but the last, in fp32, as a product with a row of ones: TF's column reduction
    (Sum over the leading axes) took 2.8 ms on a [2048, 2048] fp32 tensor on a 2-core AVX2 CPU, the product
    0.4 ms (the same for [2048, 512]: 0.42 against 0.25)."""
    n = t.shape[-1]
    rows = tf.reshape(f32(t), [-1, n])
    return tf.reshape(tf.matmul(tf.ones([1, tf.shape(rows)[0]], tf.float32), rows), [n])


def reduced_mesh_axes(mesh_impl, dims) -> list[int]:
    """The mesh axes that split any of `dims`, sorted: what a result summed over `dims` is all-reduced over."""
    axes = [mesh_impl.tensor_dimension_to_mesh_axis(d) for d in dims]
    return sorted({a for a in axes if a is not None})
