"""models/kernels/elementwise.py: GELU and LayerNorm give mesh-tensorflow's values and gradients on one device
and on split layouts, on both kernel paths, and LayerNorm computes in float32 from bf16."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kernels import elementwise
from tests.models.kernels.test_common import dims, kernel_path, run  # noqa: F401 (fixtures)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("length", [6, 2048])  # plain ops for small slices, the XLA-fused kernels for large ones
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2,y:2", "batch:x,embd:y")])
def test_gelu_matches_mtf_gelu_with_gradient(mesh_shape, layout, length):
    rng = np.random.RandomState(3)
    batch, seq, _, embd = dims(s=length)
    x_value = (3 * rng.randn(batch.size, seq.size, embd.size)).astype(np.float32)
    upstream = rng.randn(batch.size, seq.size, embd.size).astype(np.float32)

    def build(fast):
        def graph(mesh):
            x = mtf.import_tf_tensor(mesh, tf.constant(x_value), mtf.Shape([batch, seq, embd]))
            u = mtf.import_tf_tensor(mesh, tf.constant(upstream), mtf.Shape([batch, seq, embd]))
            y = elementwise.gelu(x) if fast else mtf.gelu(x)
            return [y] + mtf.gradients([mtf.reduce_sum(y * u)], [x])
        return graph

    tol = 1e-5 if length < 100 else 1e-4  # sums over 8192 rows round differently
    expected = run(build(False), "all:1", "")
    got = run(build(True), mesh_shape, layout)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("length", [6, 2048])  # plain ops for small slices, the XLA-fused kernels for large ones
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2", "batch:x"), ("x:2,y:2", "batch:x,embd:y"),
                                               ("x:2,y:2", "sequence:x,embd:y")])
def test_layer_norm_matches_the_mtf_formula_with_gradients(mesh_shape, layout, length):
    rng = np.random.RandomState(4)
    batch, seq, _, embd = dims(s=length)
    x_value = (2 * rng.randn(batch.size, seq.size, embd.size) + 1).astype(np.float32)
    g_value, b_value = (rng.randn(embd.size).astype(np.float32) for _ in range(2))
    upstream = rng.randn(batch.size, seq.size, embd.size).astype(np.float32)

    def build(fast):
        def graph(mesh):
            x = mtf.import_tf_tensor(mesh, tf.constant(x_value), mtf.Shape([batch, seq, embd]))
            g = mtf.import_tf_tensor(mesh, tf.constant(g_value), mtf.Shape([embd]))
            b = mtf.import_tf_tensor(mesh, tf.constant(b_value), mtf.Shape([embd]))
            u = mtf.import_tf_tensor(mesh, tf.constant(upstream), mtf.Shape([batch, seq, embd]))
            if fast:
                y = elementwise.layer_norm(x, g, b, 1e-5)
            else:  # models/layers.py's formula before the fused kernel
                c = x - mtf.reduce_mean(x, reduced_dim=embd)
                y = c * mtf.rsqrt(mtf.reduce_mean(mtf.square(c), reduced_dim=embd) + 1e-5) * g + b
            return [y] + mtf.gradients([mtf.reduce_sum(y * u)], [x, g, b])
        return graph

    tol = 1e-5 if length < 100 else 1e-4  # sums over 8192 rows round differently
    expected = run(build(False), "all:1", "")
    got = run(build(True), mesh_shape, layout)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2,y:2", "batch:x,embd:y")])
def test_layer_norm_in_bfloat16_computes_in_float32_on_whole_and_split_rows(mesh_shape, layout):
    """bf16 activations and parameters: the statistics are fp32 on both paths (the fused kernel, and the
    all-reduced moments where the layout splits embd), so values and gradients are fp32's rounded to bf16."""
    rng = np.random.RandomState(6)
    batch, seq, _, embd = dims(s=512)
    values = [(2 * rng.randn(batch.size, seq.size, embd.size) + 1), rng.randn(embd.size), rng.randn(embd.size),
              rng.randn(batch.size, seq.size, embd.size)]

    def build(dtype):
        def graph(mesh):
            x, g, b, u = (mtf.import_tf_tensor(mesh, tf.constant(v.astype(np.float32)), shape)
                          for v, shape in zip(values, [[batch, seq, embd], [embd], [embd], [batch, seq, embd]]))
            x, g, b, u = (mtf.cast(t, dtype) for t in (x, g, b, u))
            y = elementwise.layer_norm(x, g, b, 1e-5)
            grads = mtf.gradients([mtf.reduce_sum(mtf.cast(y * u, tf.float32))], [x, g, b])
            return [mtf.cast(t, tf.float32) for t in [y] + grads]
        return graph

    expected = run(build(tf.float32), "all:1", "")
    got = run(build(tf.bfloat16), mesh_shape, layout)
    for g, e in zip(got, expected):
        scale = np.abs(e).max()
        np.testing.assert_allclose(g / scale, e / scale, atol=2e-2)
