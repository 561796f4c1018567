"""models/kernels/ gives mesh-tensorflow's values and gradients, on one device and on split layouts."""
import types

import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from conftest import CPU_DEVICES
from schema import dimension_is_split
from models.kernels import attention, common, decode, elementwise, lookups, matmul
from models.kernels.loss import cross_entropy_and_log_z

LAYOUTS = [("all:1", ""), ("x:2", "batch:x"), ("x:2,y:2", "batch:x,embd:y"), ("x:2,y:2", "sequence:x,batch:y")]


@pytest.fixture(params=["xla", "plain"])
def kernel_path(request):
    """The kernels that XLA-compile (cross-entropy, softmax gradient, GELU, LayerNorm) on both of their paths:
    XLA (the default) and plain TF ops (where XLA:GPU cannot compile, or GPT_NEO_PLAIN_KERNELS=1)."""
    with common.kernels(request.param):
        yield request.param


def run(build, mesh_shape, layout):
    """build(mesh) -> (outputs, [(mtf tensor, tf variable-backed input)]) ; returns numpy outputs."""
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "m")
        shape = mtf.convert_to_shape(mesh_shape)
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(shape, mtf.convert_to_layout_rules(layout),
                                                         CPU_DEVICES[:shape.size])
        outputs = build(mesh)
        lowering = mtf.Lowering(mtf_graph, {mesh: impl})
        tf_outputs = [lowering.export_to_tf_tensor(t) for t in outputs]
        with tf.Session(config=tf.ConfigProto(device_count={"CPU": 4})) as session:
            return session.run(tf_outputs)


@pytest.fixture(scope="module")
def reference():
    """`reference(key, build)`: `run(build, "all:1", "")`, run the first time `key` is asked for and kept for the
    module. For mesh-tensorflow's own graphs, which a test compares every layout and both kernel paths with: they
    depend on neither, so each is built once per case (key: what its values depend on), not once per layout."""
    results = {}

    def get(key, build):
        if key not in results:
            results[key] = run(build, "all:1", "")
        return results[key]
    return get


def dims(b=4, s=6, v=11, e=8):
    return (mtf.Dimension("batch", b), mtf.Dimension("sequence", s), mtf.Dimension("vocab", v),
            mtf.Dimension("embd", e))


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


def test_bfloat16_widened_and_stored_are_tf_casts():
    """The fused kernels' integer conversions to and from bf16 (common.widened, common.stored) give tf.cast's
    values: every bf16 bit pattern widened, and fp32 values rounded to nearest even (ties both ways, values that
    round to infinity, infinities, NaN of any payload kept NaN). The bugs they guard: a rounding that truncates
    or breaks ties away from even, and a NaN whose payload carries into the sign bit (stored as +0: a diverged
    gradient hidden)."""
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F807FFF, 0x3F808001, 0x7F7FFFFF, 0x7F7F8000, 0xFF7FFFFF,
                     0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 0x7F800001, 0x7FFFFFFF, 0x00000001, 0x80008000],
                    np.uint32)
    values = np.concatenate([ties, np.random.RandomState(4).randint(0, 1 << 32, 100000, dtype=np.uint32)])
    with tf.Graph().as_default(), tf.Session() as session:
        bf16 = tf.bitcast(tf.constant(patterns), tf.bfloat16)
        f32 = tf.bitcast(tf.constant(values), tf.float32)
        widened, widened_cast, stored, stored_cast = session.run(
            [tf.bitcast(t, tf.uint32) if t.dtype == tf.float32 else tf.bitcast(t, tf.uint16)
             for t in (common.widened(bf16), tf.cast(bf16, tf.float32), common.stored(f32, tf.bfloat16),
                       tf.cast(f32, tf.bfloat16))])
    np.testing.assert_array_equal(widened, widened_cast)
    nan = (stored_cast & 0x7F80 == 0x7F80) & (stored_cast & 0x7F != 0)
    assert nan[:16].sum() == 4 and ((stored & 0x7F80 == 0x7F80) & (stored & 0x7F != 0) == nan).all()
    np.testing.assert_array_equal(stored[~nan], stored_cast[~nan])


def test_split_vocab_is_detected():
    from tiny import tiny_config
    assert not dimension_is_split(tiny_config(), "vocab")
    assert not dimension_is_split(tiny_config(mesh_shape="x:2", layout="batch:x"), "vocab")
    assert dimension_is_split(tiny_config(mesh_shape="x:2", layout="vocab:x"), "vocab")


ATTENTION_LAYOUTS = [("all:1", ""), ("x:2", "batch:x"), ("x:2,y:2", "batch:x,heads:y"), ("x:2", "sequence:x"),
                     ("x:2", "memory_length:x")]


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


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("length", [6, 2048])  # plain ops for small slices, the XLA-fused kernels for large ones
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2,y:2", "batch:x,embd:y")])
def test_gelu_matches_mtf_gelu_with_gradient(mesh_shape, layout, length):
    rng = np.random.RandomState(3)
    batch, seq, _, embd = dims(s=length)
    x_value = (3 * rng.randn(batch.size, seq.size, embd.size)).astype(np.float32)
    upstream = rng.randn(batch.size, seq.size, embd.size).astype(np.float32)

    def build(fast):
        def graph(mesh):
            x = mtf.import_tf_tensor(mesh, tf.constant(x_value), mtf.Shape([batch, seq, embd]))
            u = mtf.import_tf_tensor(mesh, tf.constant(upstream), mtf.Shape([batch, seq, embd]))
            y = elementwise.gelu(x) if fast else mtf.gelu(x)
            return [y] + mtf.gradients([mtf.reduce_sum(y * u)], [x])
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
