"""models/kernels/elementwise.py: GELU and LayerNorm give mesh-tensorflow's values and gradients on one device
and on split layouts, on both kernel paths, and LayerNorm computes in float32 from bf16."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kernels import elementwise
from tests.models.kernels.test_common import dims, kernel_path, run  # noqa: F401 (fixtures)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("length", [6, 2048])  # plain ops for small slices, the XLA-fused kernels for large ones
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2,y:2", "batch:x,embd:y"),
                                               ("x:2,y:2", "sequence:x,embd:y")])
def test_gelu_matches_mtf_gelu_with_gradient(mesh_shape, layout, length, biased):
    """gelu(x) and gelu(x, bias) against mtf.gelu(x) and mtf.gelu(x + bias), with the gradients of x and bias
    (the bias's summed over every row, across devices where the layout splits the rows)."""
    rng = np.random.RandomState(3)
    batch, seq, _, embd = dims(s=length)
    x_value = (3 * rng.randn(batch.size, seq.size, embd.size)).astype(np.float32)
    bias_value = rng.randn(embd.size).astype(np.float32)
    upstream = rng.randn(batch.size, seq.size, embd.size).astype(np.float32)

    def build(fast):
        def graph(mesh):
            x = mtf.import_tf_tensor(mesh, tf.constant(x_value), mtf.Shape([batch, seq, embd]))
            u = mtf.import_tf_tensor(mesh, tf.constant(upstream), mtf.Shape([batch, seq, embd]))
            if not biased:
                y = elementwise.gelu(x) if fast else mtf.gelu(x)
                return [y] + mtf.gradients([mtf.reduce_sum(y * u)], [x])
            b = mtf.import_tf_tensor(mesh, tf.constant(bias_value), mtf.Shape([embd]))
            y = elementwise.gelu(x, b) if fast else mtf.gelu(x + b)
            return [y] + mtf.gradients([mtf.reduce_sum(y * u)], [x, b])
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


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2,y:2", "sequence:x,embd:y")])
def test_biased_gelu_in_bfloat16_rounds_float32_values_once(mesh_shape, layout):
    """bf16 x and bias: the sum, GELU and its gradient are computed in fp32 inside one kernel, so each output is
    within half a bf16 unit of the exact value (plus fp32's own error), where adding x and bias in bf16 first
    (the unfused path) is off by up to a unit; the bias gradient sums the bf16 input gradient in fp32 and
    rounds once. The
    oracle is numpy's float64 formula on the same bf16 inputs."""
    rng = np.random.RandomState(7)
    batch, seq, _, embd = dims(s=512)
    bf16 = tf.bfloat16.as_numpy_dtype
    x_value, bias_value, upstream = ((3 * rng.randn(*shape)).astype(bf16).astype(np.float32) for shape in
                                     [(batch.size, seq.size, embd.size), (embd.size,), (batch.size, seq.size, embd.size)])

    def graph(mesh):
        x, b, u = (mtf.cast(mtf.import_tf_tensor(mesh, tf.constant(v), shape), tf.bfloat16)
                   for v, shape in [(x_value, [batch, seq, embd]), (bias_value, [embd]), (upstream, [batch, seq, embd])])
        y = elementwise.gelu(x, b)
        # u is a constant factor of the summed y, so the upstream gradient is u itself: dx = u * gelu'(x + b)
        grads = mtf.gradients([mtf.reduce_sum(mtf.cast(y, tf.float32) * mtf.cast(u, tf.float32))], [x, b])
        return [mtf.cast(t, tf.float32) for t in [y] + grads]

    z = x_value.astype(np.float64) + bias_value
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (z + 0.044715 * z ** 3))
    y = 0.5 * z * (1 + t)
    dx = upstream * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z))

    def half_unit(v):  # half a bf16 unit in the last place of v (8 significant bits), plus fp32's rounding
        return 2.0 ** (np.floor(np.log2(np.abs(v) + 1e-30)) - 8) * 1.01 + 2e-6 * np.maximum(np.abs(v), 1)

    got_y, got_dx, got_db = run(graph, mesh_shape, layout)
    assert np.all(np.abs(got_y - y) <= half_unit(y))
    # below z = -3 fp32's 1 + tanh(...) cancels (the formula's own error, unfused or not): checked where it does not
    conditioned = np.abs(z) <= 3
    assert conditioned.mean() > 0.4
    assert np.all((np.abs(got_dx - dx) <= half_unit(dx))[conditioned])
    # summed in fp32 and rounded to the bias's bf16; where the layout splits the rows, each device's partial sum is
    # rounded too before the all-reduce (one more half unit of each of two partials)
    db = got_dx.astype(np.float64).sum(axis=(0, 1))
    roundings = 3 if layout.startswith("sequence") else 1
    assert np.all(np.abs(got_db - db) <= roundings * half_unit(db) + 1e-5 * np.abs(got_dx).sum(axis=(0, 1)))


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
