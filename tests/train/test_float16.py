"""precision "float16": float16 activations with float32 master weights and dynamic loss scaling
(train/loss_scale.py, its own tests in tests/train/test_loss_scale.py), for GPUs without bfloat16; its numerics
checked on CPU as bfloat16's are."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from conftest import CPU_DEVICES
from config import replace
from models import layers
from models.activations import activation_for
from models.attention import ATTENTION, AttentionContext
from models.kernels import attention, elementwise
from models.sampling import SamplingOptions
from modelpath import checkpoints
from tests.train.test_loss_scale import stored, train_logged
from tiny import compute_logits, devices_for, random_tokens, run_predict, tiny_config


@pytest.mark.slow
def test_float16_trains_close_to_float32(tmp_path):
    """Same run as bfloat16's test. float16 keeps 11 significant bits (a rounding unit of 2**-11 = 4.9e-4),
    bfloat16 8 (3.9e-3): bfloat16's test allows 2% (5 of its units), this one 5 of float16's, 0.25% (measured
    on this run: float16 4e-4, bfloat16 3e-3). The first step's gradient norm (same weights, same batch) is
    float32's: the gradients are unscaled. The loss scale stays at its initial 2**15: nothing overflows."""
    fp32 = tiny_config(lr=1e-2, model_path=str(tmp_path / "fp32"), train_steps=6, steps_per_checkpoint=6)
    fp16 = replace(fp32, precision="float16", model_path=str(tmp_path / "fp16"))
    a, b = train_logged(fp32, 6), train_logged(fp16, 6)
    losses_32, losses_16 = ([v["loss"] for v in run] for run in (a, b))
    assert losses_16[-1] < 0.7 * losses_16[0]
    np.testing.assert_allclose(losses_16, losses_32, rtol=2.5e-3)
    np.testing.assert_allclose(b[0]["grad_norm"], a[0]["grad_norm"], rtol=2.5e-3)
    assert [v["loss_scale"] for v in b] == [2.0 ** 15] * 6 and "loss_scale" not in a[0]
    weights = stored(checkpoints.latest(fp16.model_path))
    assert all(w.dtype == np.float32 for name, w in weights.items() if name.startswith("gpt2/"))  # float32 masters
    tokens = random_tokens([2, fp32.n_ctx])
    logits_32, logits_16 = (compute_logits(c, tokens, devices_for(c)) for c in (fp32, fp16))
    assert 1e-5 < np.abs(logits_16 - logits_32).max() < 0.01  # activations really are float16


def run_mesh(build):
    """build(mesh) -> mtf tensors, on one CPU; their values as float32 numpy arrays."""
    graph = tf.Graph()
    with graph.as_default():
        mesh = mtf.Mesh(mtf.Graph(), "m")
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(mtf.Shape([]), mtf.convert_to_layout_rules(""),
                                                         CPU_DEVICES[:1])
        outputs = build(mesh)
        lowering = mtf.Lowering(mesh.graph, {mesh: impl})
        fetches = [tf.cast(lowering.export_to_tf_tensor(t), tf.float32) for t in outputs]
        with tf.Session() as session:
            session.run(tf.global_variables_initializer())
            session.run(lowering.copy_masters_to_slices())
            return session.run(fetches)


@pytest.mark.parametrize("kernel", ["gelu", "layer_norm", "softmax", "global_attention", "local_attention",
                                    "scale_norm", "elish"])
def test_kernels_compute_float16_in_float32(kernel):
    """Each fused kernel, attention with its mask bias, ScaleNorm and the activations outside the fused GELU on
    float16 inputs whose float16 arithmetic would overflow (squares of ~1e3, attention logits of ~1e5, elish's
    exp(x) * 0 = NaN above x = 11): finite, and the float32 values (of the same, float16-rounded inputs) to
    float16's precision, forward and backward."""
    rng = np.random.RandomState(0)
    batch, seq, heads, kv = (mtf.Dimension(n, s) for n, s in (("batch", 2), ("sequence", 16), ("heads", 2),
                                                                ("features_per_head", 8)))
    shape = mtf.Shape([batch, seq, heads, kv])
    scale, offset = {"gelu": (30, 0), "layer_norm": (300, 500), "scale_norm": (300, 500), "softmax": (5, 0),
                     "elish": (10, 0)}.get(kernel, (150, 0))
    x, k, v, u = (rng.randn(*shape.to_integer_list) for _ in range(4))
    values = [scale * x + offset, scale * k, v, u, 1 + 0.1 * rng.randn(kv.size)]
    values = [value.astype(np.float16).astype(np.float32) for value in values]  # both runs see the same inputs
    ctx = AttentionContext(tiny_config(), False, seq, mtf.Dimension("memory_length", seq.size), kv)

    def build(dtype):
        def graph(mesh):
            x, k, v, u = (mtf.import_tf_tensor(mesh, tf.cast(value, dtype), shape) for value in values[:4])
            if kernel == "gelu":
                y = elementwise.gelu(x)
            elif kernel == "layer_norm":
                g = mtf.import_tf_tensor(mesh, tf.cast(values[4], dtype), mtf.Shape([kv]))
                y = elementwise.layer_norm(x, g, mtf.zeros(mesh, mtf.Shape([kv]), dtype), 1e-5)
            elif kernel == "scale_norm":
                y = layers.scale_norm(x, "scale_norm", mtf.VariableDType(tf.float32, tf.float32, dtype))
            elif kernel == "elish":
                y = activation_for("elish", dtype)(x)
            elif kernel == "softmax":
                y = attention.softmax(x, kv, split=False)
            else:  # models/attention.py's, with its causal (global) or window (local) mask bias
                y = ATTENTION[kernel.split("_")[0]].fn(x, k, v, ctx)
            loss = mtf.reduce_sum(mtf.cast(y, tf.float32) * mtf.cast(u, tf.float32))
            return [y] + mtf.gradients([loss], [x])
        return graph

    expected = run_mesh(build(tf.float32))
    got = run_mesh(build(tf.float16))
    for g, e in zip(got, expected):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, e, rtol=0, atol=0.01 * np.abs(e).max())


@pytest.mark.slow
def test_float16_decodes_like_float32():
    """Greedy kv-cache sampling picks the float32 model's tokens (the decoding step's mask bias is float32: -1e10
    times a float16 mask is -inf * 0 = NaN where visible)."""
    fp32 = tiny_config(local_attention_radius=4)
    tokens = random_tokens([2, fp32.n_ctx], seed=1)
    outputs = []
    for cfg in (fp32, replace(fp32, precision="float16")):
        options = SamplingOptions.from_config(cfg, max_new_tokens=6, padding_id=0, temperature=0.0)
        features = {"tokens": tokens, "prompt_length": np.array([3, 5], np.int32), "seed": np.array([7, 7], np.int32)}
        outputs.append(run_predict(cfg, features, devices_for(cfg), options=options)["tokens"])
    np.testing.assert_array_equal(outputs[1], outputs[0])
