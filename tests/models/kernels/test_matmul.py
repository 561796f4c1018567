"""models/kernels/matmul.py gives mesh-tensorflow's values and gradients, on one device and on split layouts:
the projections' products, the fused q/k/v product, the bias add and bf16 products over long contractions."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kernels import matmul
from tests.models.kernels.test_common import LAYOUTS, dims, run


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS + [("x:2,y:2", "vocab:x,embd:y")])
def test_matmul_equals_mtf_einsum_with_gradients(mesh_shape, layout):
    """The projections' products: x [batch, seq, embd] times a kernel [embd, vocab] and times a tied table
    [vocab, embd] (transposed), values and both gradients, on layouts that split the free or the summed dims."""
    rng = np.random.RandomState(3)
    batch, seq, vocab, embd = dims(v=12)
    x_value = rng.randn(batch.size, seq.size, embd.size).astype(np.float32)
    kernel_value = rng.randn(embd.size, vocab.size).astype(np.float32)
    table_value = rng.randn(vocab.size, embd.size).astype(np.float32)
    upstream = rng.randn(2, batch.size, seq.size, vocab.size).astype(np.float32)

    def build(fast):
        product = matmul.matmul if fast else (lambda a, b, shape: mtf.einsum([a, b], output_shape=shape))

        def graph(mesh):
            x = mtf.import_tf_tensor(mesh, tf.constant(x_value), mtf.Shape([batch, seq, embd]))
            kernel = mtf.import_tf_tensor(mesh, tf.constant(kernel_value), mtf.Shape([embd, vocab]))
            table = mtf.import_tf_tensor(mesh, tf.constant(table_value), mtf.Shape([vocab, embd]))
            outputs = [product(x, kernel, [batch, seq, vocab]), product(x, table, [batch, seq, vocab])]
            loss = mtf.add_n([mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, tf.constant(u), y.shape))
                              for y, u in zip(outputs, upstream)])
            return outputs + mtf.gradients([loss], [x, kernel, table])
        return graph

    expected = run(build(False), "all:1", "")
    got = run(build(True), mesh_shape, layout)
    np.testing.assert_allclose(got[0], x_value @ kernel_value, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], x_value @ table_value.T, rtol=1e-5, atol=1e-5)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS + [("x:2,y:2", "vocab:x,embd:y")])
def test_stacked_matmul_equals_one_einsum_per_weight_with_gradients(mesh_shape, layout):
    """The fused q/k/v projection: x [batch, seq, embd] times three kernels [embd, vocab] stacked in the graph,
    against one mtf.einsum per kernel: the values and the gradients of x and of each kernel."""
    rng = np.random.RandomState(4)
    batch, seq, vocab, embd = dims(v=12)
    stacked = mtf.Dimension("qkv", 3)
    x_value = rng.randn(batch.size, seq.size, embd.size).astype(np.float32)
    kernel_values = rng.randn(3, embd.size, vocab.size).astype(np.float32)
    upstream = rng.randn(batch.size, seq.size, 3, vocab.size).astype(np.float32)

    def build(fast):
        def graph(mesh):
            x = mtf.import_tf_tensor(mesh, tf.constant(x_value), mtf.Shape([batch, seq, embd]))
            kernels = [mtf.import_tf_tensor(mesh, tf.constant(k), mtf.Shape([embd, vocab])) for k in kernel_values]
            if fast:
                y = matmul.stacked_matmul(x, kernels, stacked, [batch, seq, stacked, vocab])
                outputs = mtf.unstack(y, stacked)
            else:
                outputs = [mtf.einsum([x, k], output_shape=[batch, seq, vocab]) for k in kernels]
            loss = mtf.add_n([mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, tf.constant(upstream[:, :, i]), y.shape))
                              for i, y in enumerate(outputs)])
            return outputs + mtf.gradients([loss], [x] + kernels)
        return graph

    expected = run(build(False), "all:1", "")
    got = run(build(True), mesh_shape, layout)
    np.testing.assert_allclose(got[1], x_value @ kernel_values[1], rtol=1e-5, atol=1e-5)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS + [("x:2,y:2", "batch:x,vocab:y")])
def test_bias_add_equals_mtf_add_with_gradients(mesh_shape, layout):
    """The projections' bias: y [batch, seq, vocab] + b [vocab], the bias gradient summed over batch and sequence
    as a product with ones (all-reduced where the layout splits them), against mtf's broadcasting add."""
    rng = np.random.RandomState(5)
    batch, seq, vocab, _ = dims(v=12)
    y_value = rng.randn(batch.size, seq.size, vocab.size).astype(np.float32)
    b_value = rng.randn(vocab.size).astype(np.float32)
    upstream = rng.randn(batch.size, seq.size, vocab.size).astype(np.float32)

    def build(fast):
        def graph(mesh):
            y = mtf.import_tf_tensor(mesh, tf.constant(y_value), mtf.Shape([batch, seq, vocab]))
            b = mtf.import_tf_tensor(mesh, tf.constant(b_value), mtf.Shape([vocab]))
            out = matmul.bias_add(y, b) if fast else y + b
            loss = mtf.reduce_sum(out * mtf.import_tf_tensor(mesh, tf.constant(upstream), out.shape))
            return [out] + mtf.gradients([loss], [y, b])
        return graph

    expected = run(build(False), "all:1", "")
    got = run(build(True), mesh_shape, layout)
    np.testing.assert_allclose(got[2], upstream.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_bfloat16_product_over_a_long_contraction_in_pieces(transpose_a, transpose_b):
    """A bf16 product whose contraction is long (the tied output layer's gradient: the vocabulary) runs in pieces
    summed in fp32: the fp32 product of the same bf16 operands, to bf16 precision, with every transpose flag.
    The bugs it guards: a piece left out or counted twice (the edges), a piece sliced along the wrong axis."""
    k = 2 * matmul.LONG_CONTRACTION + 5  # three pieces
    rng = np.random.RandomState(5)
    a = rng.randn(*((k, 4) if transpose_a else (4, k))).astype(np.float32)
    b = rng.randn(*((6, k) if transpose_b else (k, 6))).astype(np.float32)
    with tf.Graph().as_default(), tf.Session() as session:
        a16, b16 = tf.cast(tf.constant(a), tf.bfloat16), tf.cast(tf.constant(b), tf.bfloat16)
        got, expected = session.run([tf.cast(matmul._product_2d(a16, b16, transpose_a, transpose_b), tf.float32),
                                     tf.matmul(tf.cast(a16, tf.float32), tf.cast(b16, tf.float32),
                                               transpose_a=transpose_a, transpose_b=transpose_b)])
        pieces = [op for op in tf.get_default_graph().get_operations() if op.type == "MatMul"]
    assert len(pieces) == 3 + 1
    np.testing.assert_allclose(got, expected, rtol=2 ** -7, atol=2 ** -7 * np.abs(expected).max())


def test_matmul_falls_back_to_einsum_where_it_is_not_one_matrix_product():
    mesh = mtf.Mesh(mtf.Graph(), "m")
    batch, heads, kv = mtf.Dimension("batch", 2), mtf.Dimension("heads", 3), mtf.Dimension("kv", 4)
    a = mtf.zeros(mesh, [batch, heads, kv])
    b = mtf.zeros(mesh, [batch, kv])
    y = matmul.matmul(a, b, [batch, heads])  # batch is in both inputs and the output: a batched product
    assert not isinstance(y.operation, matmul.MatmulOperation)
    with pytest.raises(ValueError, match="not one matrix product"):
        matmul.MatmulOperation(a, b, mtf.Shape([batch, heads]))
