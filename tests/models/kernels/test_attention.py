"""models/kernels/attention.py gives mesh-tensorflow's attention, values and gradients, on one device and on
split layouts, on both kernel paths: global, local and the blocked causal attention, in float32 and bf16."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kernels import attention
from tests.models.kernels.test_common import kernel_path, reference, run  # noqa: F401 (fixtures)

# The fast tier keeps one device and the two splits of a length, where the kernels' own code differs (the softmax
# over a split memory, local attention's halos across the split sequence); batch and heads split nothing attention
# computes across, and their cases (40 of the 76 that run, the 2x2 mesh's the costliest) run in CI's full suite.
ATTENTION_LAYOUTS = [pytest.param("all:1", "", id="all:1-"),
                     pytest.param("x:2", "batch:x", id="x:2-batch:x", marks=pytest.mark.slow),
                     pytest.param("x:2,y:2", "batch:x,heads:y", id="x:2,y:2-batch:x,heads:y", marks=pytest.mark.slow),
                     pytest.param("x:2", "sequence:x", id="x:2-sequence:x"),
                     pytest.param("x:2", "memory_length:x", id="x:2-memory_length:x")]


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("mesh_shape,layout", ATTENTION_LAYOUTS)
@pytest.mark.parametrize("kind,length", [("global", 16), ("local_causal", 16), ("local_bidirectional", 16),
                                         ("local_causal", 512), ("local_bidirectional", 512),
                                         ("global_causal_blocks", 256), ("local_causal_blocks", 256),
                                         ("local_causal_blocks_radius_100", 256),
                                         ("global_causal_blocks_recomputed", 256),
                                         ("local_causal_blocks_radius_100_recomputed", 256)])
def test_attention_matches_mtf_attention_with_gradients(mesh_shape, layout, kind, length, monkeypatch, reference):
    """*_causal_blocks: `causal_attention`, global (4 blocks of 64 queries, each against the keys up to its
    end) against mtf's attention over the whole square with the causal bias; local (4 blocks of 64 queries, each
    against the keys its queries' windows reach, radius 4 and 100: every block's window starts before the block
    it carries its key gradients from) against mtf's local_attention_1d; *_recomputed: with the softmax weights
    recomputed in the backward pass (as above KEEPS_WEIGHTS_UP_TO), not kept. 512 positions for local_attention_1d
    (blocks of 128): two blocks on each half where the layout splits the sequence. Bugs it guards: the blocks'
    causal mask one position off (`offset <= 1`), the carried key gradient not summed (`carry_k = part_k`), the
    local window one key wider (`offset > -radius - 1`)."""
    import mesh_tensorflow.transformer.attention as mtf_attention
    if kind.endswith("_recomputed"):
        monkeypatch.setattr(attention, "KEEPS_WEIGHTS_UP_TO", 0)
        kind = kind[:-len("_recomputed")]
    if "causal_blocks" in kind and ("sequence" in layout or "memory_length" in layout):
        pytest.skip("the blocked causal attention runs where neither length is split (models/attention.py)")
    if kind != "global" and "sequence" in layout and length < 256:
        pytest.skip("blocks are max(radius, 128) long: 16 positions are one block, which cannot be split")
    rng = np.random.RandomState(2)
    batch, seq, heads, kv = (mtf.Dimension("batch", 2), mtf.Dimension("sequence", length), mtf.Dimension("heads", 4),
                             mtf.Dimension("features_per_head", 8))
    memory = mtf.Dimension("memory_length", seq.size)
    values = [rng.randn(batch.size, seq.size, heads.size, kv.size).astype(np.float32) for _ in range(4)]
    radius = 100 if kind.endswith("radius_100") else 4
    from types import SimpleNamespace
    context = SimpleNamespace(train=False, model=SimpleNamespace(layout=None, mesh_shape=None))

    def build(fast):
        def graph(mesh):
            q, k, v, upstream = [mtf.import_tf_tensor(mesh, tf.constant(x), mtf.Shape([batch, seq, heads, kv]))
                                 for x in values]
            if kind.startswith("global"):
                km, vm = (mtf.replace_dimensions(t, seq, memory) for t in (k, v))
                future = mtf.less(mtf.range(mesh, seq, tf.int32), mtf.range(mesh, memory, tf.int32))
                bias = mtf.cast(future, tf.float32) * -1e10
                if fast and kind == "global_causal_blocks":
                    assert attention.causal_blocks_pay(length)
                    out = attention.causal_attention(q, km, vm, seq, memory, kv, kv)
                elif fast:
                    out = attention.attention(q, km, vm, memory, kv, kv, bias, memory_split="memory_length" in layout)
                else:
                    out = mtf_attention.attention(q, km, vm, memory, kv, kv, bias, context=context)
            else:
                causal = kind.startswith("local_causal")
                if fast and "blocks" in kind:
                    assert attention.causal_blocks_pay(length, radius)
                    out = attention.causal_attention(q, k, v, seq, seq, kv, kv, radius)
                elif fast:
                    out = attention.local_attention_1d(q, k, v, seq, kv, kv, radius, fully_autoregressive=causal)
                else:
                    out = mtf_attention.local_attention_1d(q, k, v, seq, kv, kv, radius=radius,
                                                           fully_autoregressive=causal,
                                                           attention_kwargs={"context": context})
            loss = mtf.reduce_sum(out * upstream)
            return [out] + mtf.gradients([loss], [q, k, v])
        return graph

    expected = reference((kind, length), build(False))  # mtf's: the same for both kernel paths and kept weights
    got = run(build(True), mesh_shape, layout)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert np.abs(expected[0]).max() > 0.1


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
@pytest.mark.parametrize("radius", [None, 100])
def test_causal_attention_in_bfloat16_is_float32s_rounded_to_bfloat16(radius, recompute, monkeypatch):
    """bf16 q, k, v: the logits and their softmax are fp32, the weights multiply v in bf16 and the backward
    products take bf16 operands; values and gradients are fp32's (on the same bf16-rounded inputs) to bf16
    precision, with the weights kept or recomputed. The bug it guards: the weights handed to the bf16 products
    not being the softmax's (e.g. the logits cast), which the fp32 tests cannot see: there the fp32 weights are
    used directly."""
    monkeypatch.setattr(attention, "KEEPS_WEIGHTS_UP_TO", 0 if recompute else 512)
    rng = np.random.RandomState(3)
    batch, seq, heads, kv = (mtf.Dimension("batch", 1), mtf.Dimension("sequence", 256), mtf.Dimension("heads", 2),
                             mtf.Dimension("features_per_head", 8))  # 4 blocks of 64 queries
    values = [rng.randn(batch.size, seq.size, heads.size, kv.size).astype(np.float32) for _ in range(4)]

    def build(dtype):
        def graph(mesh):
            q, k, v, u = (mtf.cast(mtf.cast(mtf.import_tf_tensor(mesh, tf.constant(x), [batch, seq, heads, kv]),
                                            tf.bfloat16), dtype) for x in values)
            out = attention.causal_attention(q, k, v, seq, seq, kv, kv, radius)
            grads = mtf.gradients([mtf.reduce_sum(mtf.cast(out * u, tf.float32))], [q, k, v])
            return [mtf.cast(t, tf.float32) for t in [out] + grads]
        return graph

    expected = run(build(tf.float32), "all:1", "")
    got = run(build(tf.bfloat16), "all:1", "")
    for g, e in zip(got, expected):
        scale = np.abs(e).max()
        np.testing.assert_allclose(g / scale, e / scale, atol=2e-2)


def test_the_layers_of_a_graph_share_the_blocks_masks_and_a_while_loop_makes_its_own(monkeypatch):
    """Blocked causal attention's masks are made once per graph and block and read by every layer (125M's
    training graph: a sixth of its ops were masks), except inside a TF 1 while loop's body (TPU programs lower
    the step there), whose masks stay its own: a tensor made in a loop cannot be read outside it. Values and
    gradients are those of masks made per layer. Bugs caught: the loop left out of the masks' key (the layer
    after the loop reads the body's mask: TensorFlow refuses the graph); no sharing at all (the second layer
    makes its own ranges)."""
    rng = np.random.RandomState(0)
    inputs = [rng.randn(2, 256, 8).astype(np.float32) for _ in range(5)]

    def build(shared: bool):
        q, k_loop, v_loop, k, v = (tf.constant(x) for x in inputs)

        def layer(x, keys, values, radius=None):
            return attention._causal_blocks(x, keys, values, 64, radius, recompute=False)

        before = tf.control_flow_v2_enabled()
        tf.disable_control_flow_v2()
        try:
            looped = tf.while_loop(lambda i, x: i < 2, lambda i, x: (i + 1, layer(x, k_loop, v_loop)), [0, q])[1]
        finally:
            if before:
                tf.enable_control_flow_v2()
        graph = tf.get_default_graph()
        ranges = lambda: sum(op.type == "Range" for op in graph.get_operations())  # noqa: E731
        first = layer(looped, k, v)
        made = ranges()
        second = layer(first, k, v)
        assert (ranges() == made) == shared  # the second layer's blocks read the first's masks
        out = layer(second, k, v, radius=100)  # a window of its own: masks of its own
        assert ranges() > made
        return [out] + tf.gradients(tf.reduce_sum(out * out), [looped, k, v])

    with tf.Graph().as_default(), tf.Session() as session:
        shared = session.run(build(True))
    monkeypatch.setattr(attention, "_shared_mask", lambda device, *a: attention._mask(*a))
    with tf.Graph().as_default(), tf.Session() as session:
        each_its_own = session.run(build(False))
    for got, want in zip(shared, each_its_own):
        np.testing.assert_array_equal(got, want)


def test_the_shared_masks_keep_no_graph_alive():
    """The masks are shared per graph without holding it: a process building many graphs (a harness run's programs,
    the tests) frees each as before. (Bug: the map, keyed weakly by graph, holding the masks' tensors, each of
    which holds its graph: no graph would ever be freed.) The graph here has no custom gradient, which TensorFlow's
    gradient registry keeps alive by itself."""
    import gc
    import weakref
    graph = tf.Graph()
    with graph.as_default():
        first = attention._shared_mask("", 0, 64, 0, None)
        assert attention._shared_mask("", 0, 64, 0, None).name == first.name  # made once
    assert attention._MASKS.get(graph)
    released = weakref.ref(graph)
    del graph, first
    gc.collect()
    assert released() is None
