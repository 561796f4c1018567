"""models/kernels/lookups.py: the embedding lookup gives mesh-tensorflow's one-hot product and its gradient,
on one device and on split layouts."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kernels import lookups
from tests.models.kernels.test_common import LAYOUTS, dims, run


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS)
def test_gather_matches_one_hot_einsum_with_gradient(mesh_shape, layout):
    rng = np.random.RandomState(0)
    batch, seq, vocab, embd = dims()
    table = rng.randn(vocab.size, embd.size).astype(np.float32)
    ids = rng.randint(0, vocab.size, [batch.size, seq.size]).astype(np.int32)
    ids[0, :3] = 5  # repeated ids: their gradients add up
    upstream = rng.randn(batch.size, seq.size, embd.size).astype(np.float32)

    def build(fast):
        def graph(mesh):
            t = mtf.import_tf_tensor(mesh, tf.constant(table), mtf.Shape([vocab, embd]))
            i = mtf.import_tf_tensor(mesh, tf.constant(ids), mtf.Shape([batch, seq]))
            u = mtf.import_tf_tensor(mesh, tf.constant(upstream), mtf.Shape([batch, seq, embd]))
            out = lookups.gather(t, i, vocab, split=not fast)
            loss = mtf.reduce_sum(out * u)
            [grad] = mtf.gradients([loss], [t])
            return [out, grad]
        return graph

    expected = run(build(False), "all:1", "")
    got = run(build(True), mesh_shape, layout)
    np.testing.assert_array_equal(got[0], expected[0])  # a lookup: exactly the rows
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], table[ids])
