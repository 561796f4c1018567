"""models/kv_cache.py: what a decoding step's query may see (each window's visibility bias, built once per
window and step), and the decode state handing each attention layer its own caches in order."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kv_cache import PREFILL, STEP, DecodeState
from tiny import run_mtf


def test_each_window_gets_its_own_visibility_bias_built_once_per_step():
    """At position p the step's query is token p - 1: it sees the cache up to p - 1 (global layers), and with a
    window w only the last w of those (local layers). Layers of one window share one bias; another window gets
    its own. Bug it guards: the biases kept by memory length alone (`key = memory_length`): every layer held to
    the first layer's window (a global layer to the local window)."""
    memory = mtf.Dimension("memory_length", 16)
    position, window = 11, 4

    def build(mesh):
        state = DecodeState(STEP, mtf.import_fully_replicated(mesh, tf.constant(position), mtf.Shape([])))
        local = state.visibility_bias(window, memory)
        whole = state.visibility_bias(None, memory)
        assert state.visibility_bias(window, memory) is local and state.visibility_bias(None, memory) is whole
        return {"local": local, "whole": whole}

    results, _ = run_mtf(build, {}, {})
    keys, query = np.arange(memory.size), position - 1
    np.testing.assert_array_equal(results["whole"], np.where(keys <= query, 0.0, -1e10).astype(np.float32))
    np.testing.assert_array_equal(results["local"], np.where((keys <= query) & (keys > query - window), 0.0,
                                                             -1e10).astype(np.float32))


def test_each_layer_takes_its_own_caches_in_order():
    """A step's layers take their (k, v) caches in layer order, and a state holding fewer than the model's layers
    ask for is an error, not a layer reading another's cache. Bug it guards: `take` not advancing (`_next`): every
    layer reads the first layer's caches."""
    state = DecodeState(STEP, position="p", states=["k0", "v0", "k1", "v1"])
    assert state.incremental and state.take(2) == ["k0", "v0"] and state.take(2) == ["k1", "v1"]
    with pytest.raises(ValueError, match="fewer caches than the model has attention layers"):
        state.take(2)
    with pytest.raises(ValueError, match="step mode needs the position"):
        DecodeState(STEP)
    with pytest.raises(ValueError, match="mode must be"):
        DecodeState("decode")
    assert not DecodeState(PREFILL).incremental
