"""models/kernels/loss.py: the cross-entropy and log Z give mesh-tensorflow's values and gradient on one device
and on split layouts, on both kernel paths, and compute in float32 from bf16 logits."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kernels.loss import cross_entropy_and_log_z
from tests.models.kernels.test_common import LAYOUTS, dims, kernel_path, run  # noqa: F401 (fixtures)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS)
@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_cross_entropy_and_log_z_match_mtf_with_gradient(mesh_shape, layout, z_loss):
    rng = np.random.RandomState(1)
    batch, seq, vocab, _ = dims()
    logits = (3 * rng.randn(batch.size, seq.size, vocab.size)).astype(np.float32)
    labels = rng.randint(0, vocab.size, [batch.size, seq.size]).astype(np.int32)

    def build(fast):
        def graph(mesh):
            lg = mtf.import_tf_tensor(mesh, tf.constant(logits), mtf.Shape([batch, seq, vocab]))
            lb = mtf.import_tf_tensor(mesh, tf.constant(labels), mtf.Shape([batch, seq]))
            if fast:
                xent, log_z = cross_entropy_and_log_z(lg, lb, vocab)
            else:
                xent = mtf.layers.softmax_cross_entropy_with_logits(lg, lb, vocab)
                log_z = mtf.reduce_logsumexp(lg, vocab)
            objective = mtf.reduce_mean(xent)
            if z_loss:
                objective += z_loss * mtf.reduce_mean(mtf.square(log_z))
            [grad] = mtf.gradients([objective], [lg])
            return [xent, log_z, grad]
        return graph

    expected = run(build(False), "all:1", "")
    got = run(build(True), mesh_shape, layout)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    shifted = logits - logits.max(-1, keepdims=True)
    reference = np.log(np.exp(shifted).sum(-1)) + logits.max(-1) - np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(got[0], reference, rtol=1e-5)


@pytest.mark.usefixtures("kernel_path")
def test_cross_entropy_of_bfloat16_logits_computes_in_float32():
    """bf16 logits (the training path under bf16 hands them over without an fp32 copy): the losses are fp32's of
    the same bf16 values and the gradient is fp32's rounded to bf16. The bug it guards: the kernel computing its
    logsumexp in the logits' own dtype (bf16 sums of 50k exponentials lose the loss to rounding)."""
    rng = np.random.RandomState(2)
    batch, seq, _, _ = dims()
    vocab = mtf.Dimension("vocab", 2048)
    logits = (3 * rng.randn(batch.size, seq.size, vocab.size)).astype(np.float32)
    labels = rng.randint(0, vocab.size, [batch.size, seq.size]).astype(np.int32)

    def build(dtype):
        def graph(mesh):
            lg = mtf.cast(mtf.cast(mtf.import_tf_tensor(mesh, tf.constant(logits), mtf.Shape([batch, seq, vocab])),
                                   tf.bfloat16), dtype)
            lb = mtf.import_tf_tensor(mesh, tf.constant(labels), mtf.Shape([batch, seq]))
            xent, log_z = cross_entropy_and_log_z(lg, lb, vocab)
            [grad] = mtf.gradients([mtf.reduce_mean(xent) + 1e-2 * mtf.reduce_mean(mtf.square(log_z))], [lg])
            assert xent.dtype == log_z.dtype == tf.float32 and grad.dtype == dtype
            return [xent, log_z, mtf.cast(grad, tf.float32)]
        return graph

    expected = run(build(tf.float32), "all:1", "")
    got = run(build(tf.bfloat16), "all:1", "")
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[2], expected[2], rtol=2 ** -8, atol=1e-9)
