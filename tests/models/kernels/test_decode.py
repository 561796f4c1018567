"""models/kernels/decode.py: the decoding step's writes into the key/value caches and its attention over them
give mesh-tensorflow's, on one device and on split layouts."""
import types

import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kernels import decode
from tests.models.kernels.test_common import kernel_path, reference, run  # noqa: F401 (fixtures)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2,y:2", "batch:x,heads:y")])
def test_write_at_position_in_a_cache_laid_out_for_decoding(mesh_shape, layout):
    """The decoding cache is [batch, heads, memory, kv]: the write is at axis 2, one row per (batch, head)."""
    rng = np.random.RandomState(6)
    batch, heads, memory, kv = (mtf.Dimension("batch", 2), mtf.Dimension("heads", 4),
                                mtf.Dimension("memory_length", 16), mtf.Dimension("features_per_head", 8))
    cache_value = rng.randn(2, 4, 16, 8).astype(np.float32)
    new_value = rng.randn(2, 4, 8).astype(np.float32)

    def graph(mesh):
        cache = mtf.import_tf_tensor(mesh, tf.constant(cache_value), mtf.Shape([batch, heads, memory, kv]))
        value = mtf.import_tf_tensor(mesh, tf.constant(new_value), mtf.Shape([batch, heads, kv]))
        position = mtf.import_fully_replicated(mesh, tf.constant(5), mtf.Shape([]))
        return [decode.write_at_position(cache, value, position, memory, split=False)]

    reference = cache_value.copy()
    reference[:, :, 5] = new_value
    np.testing.assert_array_equal(run(graph, mesh_shape, layout)[0], reference)


@pytest.mark.parametrize("memory_size,window,steps", [(16, None, [2, 10, 15]), (16, 4, [2, 10, 15]),
                                                      (512, None, [5, 255, 256, 300])])
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2,y:2", "batch:x,heads:y"),
                                               ("x:2", "memory_length:x"), ("x:2", "features_per_head:x")])
def test_decode_step_attention_writes_the_caches_and_equals_mtf_attention(mesh_shape, layout, memory_size, window,
                                                                          steps, kernel_path, reference):
    """A decoding step against [batch, heads, memory, kv] caches: the caches come back with this token's key and
    value at the position, and the output is mesh-tensorflow's attention over the written caches. A layout that
    splits memory or kv takes mtf's path, the others the in-place writes and batched products; several steps
    in a row check that each step's writes land in the caches the next step reads. With a local window only the
    last `window` positions are visible (and read: the window is clipped at both ends of the cache); global
    attention reads a prefix of whole blocks while it is at most half the cache (512: positions 5 and 255), then
    all of it. The attention over the written caches runs XLA-compiled and as plain TF ops (`kernel_path`)."""
    import mesh_tensorflow.transformer.attention as mtf_attention
    rng = np.random.RandomState(7)
    batch, heads, memory, kv = (mtf.Dimension("batch", 2), mtf.Dimension("heads", 4),
                                mtf.Dimension("memory_length", memory_size), mtf.Dimension("features_per_head", 8))
    q_value, k_value, v_value = rng.randn(3, len(steps), 2, 4, 8).astype(np.float32)
    k_cache_value, v_cache_value = rng.randn(2, 2, 4, memory_size, 8).astype(np.float32)
    memory_split, kv_split = "memory_length" in layout, "features_per_head" in layout

    def bias_for(position):
        hidden = np.arange(memory_size) > position  # later positions
        if window:
            hidden |= np.arange(memory_size) <= position - window
        return np.where(hidden, -1e10, 0.0).astype(np.float32)

    def build(fast):
        def graph(mesh):
            shape = mtf.Shape([batch, heads, memory, kv])
            k_cache = decode.private_copy(mtf.import_tf_tensor(mesh, tf.constant(k_cache_value), shape))
            v_cache = decode.private_copy(mtf.import_tf_tensor(mesh, tf.constant(v_cache_value), shape))
            outputs = []
            for i, position in enumerate(steps):
                q, k, v = (mtf.import_tf_tensor(mesh, tf.constant(x[i]), mtf.Shape([batch, heads, kv]))
                           for x in (q_value, k_value, v_value))
                bias = mtf.import_tf_tensor(mesh, tf.constant(bias_for(position)), mtf.Shape([memory]))
                at = mtf.import_fully_replicated(mesh, tf.constant(position), mtf.Shape([]))
                if fast:
                    out, k_cache, v_cache = decode.decode_step_attention(q, k, v, k_cache, v_cache, bias, at, memory,
                                                                         kv, memory_split, kv_split, window)
                else:
                    k_cache = decode.write_at_position(k_cache, k, at, memory, split=True)
                    v_cache = decode.write_at_position(v_cache, v, at, memory, split=True)
                    context = types.SimpleNamespace(train=False,
                                                    model=types.SimpleNamespace(layout=None, mesh_shape=None))
                    out = mtf_attention.attention(q, k_cache, v_cache, memory, kv, kv, bias=bias, context=context)
                outputs.append(out)
            return outputs + [k_cache, v_cache]
        return graph

    expected = reference((memory_size, window, tuple(steps)), build(False))  # mtf's, for every layout and path
    got = run(build(True), mesh_shape, layout)
    k_ref, v_ref = k_cache_value.copy(), v_cache_value.copy()
    for i, position in enumerate(steps):
        k_ref[:, :, position], v_ref[:, :, position] = k_value[i], v_value[i]
        weights = np.exp(np.einsum("bhk,bhmk->bhm", q_value[i], k_ref) + bias_for(position))
        weights /= weights.sum(-1, keepdims=True)
        np.testing.assert_allclose(got[i], expected[i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[i], np.einsum("bhm,bhmk->bhk", weights, v_ref), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[-2], k_ref)
    np.testing.assert_array_equal(got[-1], v_ref)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2,y:2", "batch:x,heads:y")])
def test_write_at_position_equals_the_one_hot_write(mesh_shape, layout):
    rng = np.random.RandomState(5)
    batch, memory, heads, kv = (mtf.Dimension("batch", 2), mtf.Dimension("memory_length", 16),
                                mtf.Dimension("heads", 4), mtf.Dimension("features_per_head", 8))
    cache_value = rng.randn(2, 16, 4, 8).astype(np.float32)
    new_value = rng.randn(2, 4, 8).astype(np.float32)

    def build(fast):
        def graph(mesh):
            cache = mtf.import_tf_tensor(mesh, tf.constant(cache_value), mtf.Shape([batch, memory, heads, kv]))
            value = mtf.import_tf_tensor(mesh, tf.constant(new_value), mtf.Shape([batch, heads, kv]))
            position = mtf.import_fully_replicated(mesh, tf.constant(11), mtf.Shape([]))
            return [decode.write_at_position(cache, value, position, memory, split=not fast)]
        return graph

    expected = run(build(False), "all:1", "")[0]
    got = run(build(True), mesh_shape, layout)[0]
    np.testing.assert_array_equal(got, expected)
    reference = cache_value.copy()
    reference[:, 11] = new_value
    np.testing.assert_array_equal(got, reference)
