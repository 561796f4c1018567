"""The language-modelling loss. `mtf.layers.softmax_cross_entropy_with_logits` multiplies the log-softmax by a
one-hot of the targets and sums over the vocabulary, and GPT-Neo's z-loss takes a second logsumexp over the same
[batch, sequence, vocab] logits: a dozen passes over the largest tensor of the step, forward and back.
`cross_entropy_and_log_z` returns both from one logsumexp; its gradient is one XLA-fused pass. Both compute in
fp32 from logits in the activations' dtype, so that under bf16 no fp32 copy of the logits is made or kept. It
needs the vocabulary whole on each device: callers whose layout splits it keep mtf's formulation (models/gpt.py)."""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels.common import compiled, stored, widened, xla_function


@xla_function
def _xent_forward(logits: tf.Tensor, labels: tf.Tensor):
    log_z = tf.reduce_logsumexp(widened(logits), axis=-1)
    target = widened(tf.gather(logits, labels, axis=-1, batch_dims=len(labels.shape)))
    return log_z - target, log_z


@xla_function
def _xent_backward(logits: tf.Tensor, labels: tf.Tensor, log_z: tf.Tensor, d_xent: tf.Tensor, d_log_z: tf.Tensor):
    """d logits = softmax * (d_xent + d_log_z) - one_hot(label) * d_xent, one fused pass (XLA), computed in fp32
    and stored in the logits' dtype."""
    dtype, logits = logits.dtype, widened(logits)
    target = tf.one_hot(labels, logits.shape[-1], dtype=tf.float32)
    d_logits = tf.exp(logits - log_z[..., None]) * (d_xent + d_log_z)[..., None] - target * d_xent[..., None]
    return stored(d_logits, dtype)


def cross_entropy_and_log_z(logits: mtf.Tensor, labels: mtf.Tensor, vocab: mtf.Dimension):
    """logits [..., vocab] (any float dtype: computed in fp32), labels [...] int -> (log Z - logits[label], log Z),
    each [...] in fp32; the logits' gradient is in their dtype.

    The vocabulary must be whole on each device (callers check schema.dimension_is_split(cfg,
    "vocab"), and a split vocabulary keeps mtf's formulation)."""
    rest = logits.shape - vocab
    if logits.shape.dims[-1] != vocab:
        logits = mtf.transpose(logits, rest + vocab)
    if labels.shape != rest:
        labels = mtf.transpose(labels, rest)
    splittable = rest.dims

    def grad_function(op, d_xent, d_log_z):
        zeros = mtf.zeros(op.inputs[0].mesh, rest, dtype=tf.float32)
        inputs = [op.inputs[0], op.inputs[1], op.outputs[1], zeros if d_xent is None else d_xent,
                  zeros if d_log_z is None else d_log_z]
        d_logits = mtf.slicewise(lambda *a: compiled(_xent_backward, *a), inputs, output_shape=op.inputs[0].shape,
                                 output_dtype=op.inputs[0].dtype, splittable_dims=splittable, grad_function=0,
                                 name="xent_grad")
        return [d_logits, None]

    return mtf.slicewise(lambda *a: compiled(_xent_forward, *a), [logits, labels], output_shape=[rest, rest],
                         output_dtype=[tf.float32, tf.float32], splittable_dims=splittable,
                         grad_function=grad_function, name="xent_log_z")
