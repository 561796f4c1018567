"""models/layers.py: name-seeded initial weights, the projections' initial scale (GPT-Neo's scale_by_depth and
scale_by_in), and ScaleNorm computing in float32 under float16."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.layers import dense, scale_norm, seeded_normal
from tiny import run_mtf, tiny_config


def initial_value(scope, name, seed):
    with tf.Graph().as_default(), tf.Session() as session:
        with tf.variable_scope(scope):
            made = tf.get_variable(name, [64, 8], initializer=seeded_normal(0.02, name, seed))
        session.run(tf.global_variables_initializer())
        return session.run(made)


def test_initial_weights_are_seeded_by_the_variables_full_name_and_the_config_seed():
    """Every build (every layout, every run of one config) starts a variable from the same weights, and two
    layers' variables of one name from different ones. Bug it guards: the seed taken from the name without its
    scope (`full_name = name`): every layer's c_fc starts from the same weights."""
    first = initial_value("h0/mlp", "kernel", seed=0)
    np.testing.assert_array_equal(first, initial_value("h0/mlp", "kernel", seed=0))
    assert not np.allclose(first, initial_value("h1/mlp", "kernel", seed=0))
    assert not np.allclose(first, initial_value("h0/mlp", "kernel", seed=1))
    assert 0.018 < first.std() < 0.022


@pytest.mark.parametrize("scale_by_depth,scale_by_in,residual,stddev", [
    (False, False, True, 0.02), (True, False, False, 0.02), (True, False, True, 0.02 / 2),
    (False, True, False, 0.02 / 16), (True, True, True, 0.02 / 2 / 16)])
def test_projection_weights_start_at_gpt_neos_scale(scale_by_depth, scale_by_in, residual, stddev):
    """A dense layer's kernel starts with standard deviation 0.02, over sqrt(n_layer) for the projections into
    the residual stream with scale_by_depth (n_layer 4 here), over sqrt(fan_in) with scale_by_in (256 inputs).
    Bug it guards: a divisor without its square root (`stddev /= cfg.n_layer`)."""
    cfg = tiny_config(n_layer=4, attention_types=[[["global"], 4]], scale_by_depth=scale_by_depth,
                      scale_by_in=scale_by_in)
    rows, inputs, outputs = mtf.Dimension("batch", 2), mtf.Dimension("embd", 256), mtf.Dimension("out", 256)

    def build(mesh, x):
        y = dense(x, "c_proj", outputs, cfg, mtf.VariableDType(tf.float32), scale_for_residual=residual)
        kernel = mesh.graph.name_to_variable["conv1d_main/c_proj/kernel"].outputs[0]
        return {"y": y, "kernel": kernel}

    results, _ = run_mtf(build, {"x": np.ones([2, 256], np.float32)}, {"x": [rows, inputs]})
    assert results["kernel"].std() == pytest.approx(stddev, rel=0.02)  # 65536 draws: within 0.3% of it
    np.testing.assert_allclose(results["y"], np.ones([2, 256]) @ results["kernel"], rtol=1e-5, atol=1e-6)


def test_scale_norm_of_float16_activations_computes_in_float32():
    """float16 activations of order 1000: their mean square (about 1e6) is past float16's largest number (65504),
    so the statistics are computed in float32; the result is normalised x times the gain (1 at the start).
    Bug it guards: ScaleNorm computing in the activations' dtype (the casts dropped): inf and NaN."""
    rng = np.random.RandomState(0)
    x = (1000 * rng.randn(2, 64)).astype(np.float16).astype(np.float32)
    dims = [mtf.Dimension("batch", 2), mtf.Dimension("embd", 64)]
    dtype = mtf.VariableDType(tf.float32, tf.float32, tf.float16)

    def build(mesh, x):
        return {"y": mtf.cast(scale_norm(mtf.cast(x, tf.float16), "norm", dtype), tf.float32)}

    results, _ = run_mtf(build, {"x": x}, {"x": dims})
    centred = x - x.mean(-1, keepdims=True)
    expected = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(results["y"], expected, rtol=2 ** -10, atol=2 ** -10 * np.abs(expected).max())
