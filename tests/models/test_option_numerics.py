"""The math of the model options against plain NumPy: activations, linear attention (causal and not, its
stability and its memory), rotary and axial position embeddings."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.activations import ACTIVATIONS
from models.attention import ATTENTION, AttentionContext, linear_attention_chunk
from models.embeddings import axial_position_table, rotary
from tiny import tiny_config


def run_mtf(build, arrays: dict, dims: dict):
    """Builds `build(mesh, **mtf_inputs) -> {name: mtf.Tensor}` on one device and returns NumPy results.
    dims maps each input's name to its list of mtf.Dimensions."""
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "test_mesh")
        inputs = {name: mtf.import_tf_tensor(mesh, tf.constant(value), mtf.Shape(dims[name]))
                  for name, value in arrays.items()}
        outputs = build(mesh, **inputs)
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(mtf.convert_to_shape("all:1"), [], ["/cpu:0"])
        lowering = mtf.Lowering(mtf_graph, {mesh: impl})
        fetches = {name: lowering.export_to_tf_tensor(t) for name, t in outputs.items()}
        with tf.Session() as session:
            session.run(tf.global_variables_initializer())
            session.run(lowering.copy_masters_to_slices())
            return session.run(fetches), mtf_graph


def test_activations_match_their_formulas():
    x = np.linspace(-3, 3, 13).astype(np.float32)
    sigmoid = 1 / (1 + np.exp(-x))
    softplus = np.log1p(np.exp(x))
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    selu = 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(x) - 1))
    expected = {
        "gelu": gelu, "relu": np.maximum(x, 0), "selu": selu, "elu": np.where(x > 0, x, np.exp(x) - 1),
        "swish": x * sigmoid, "silu": x * sigmoid, "sigmoid": sigmoid, "tanh": np.tanh(x), "softplus": softplus,
        "abs": np.abs(x), "sin": np.sin(x), "cos": np.cos(x), "sign": np.sign(x),
        "lrelu001": np.where(x > 0, x, 0.01 * x), "lrelu020": np.where(x > 0, x, 0.2 * x), "id": x,
        "triangle_relax": np.sin(x) - np.sin(3 * x) / 9 + np.sin(5 * x) / 25 - np.sin(7 * x) / 49,
        "square_relax": np.cos(x) - np.cos(3 * x) / 3 + np.cos(5 * x) / 5 - np.cos(7 * x) / 7,
        "spike": 1 / (1 + x ** 2), "spike2": np.exp(-x ** 2), "tanhshrink": x - np.tanh(x),
        "softsign": x / (np.abs(x) + 1), "softmax": np.exp(x) / np.exp(x).sum(),
        "logsoftmax": x - np.log(np.exp(x).sum()), "bipolarsigmoid": 2 * sigmoid - 1,
        "rrelu": np.where(x > 0, x, (1 / 8 + 1 / 3) / 2 * x),
        "elish": np.where(x > 0, x * sigmoid, (np.exp(x) - 1) * sigmoid), "arcsinh": np.arcsinh(x),
        # The parametric ones at their initial parameters.
        "aria": x * (0 + 1 / (np.log(2) + 1 * np.exp(-x)) ** (1 / (np.log(2) + 1))),
        "prelu": np.where(x > 0, x, 0.2 * x), "parcsinh": np.arcsinh(x * (np.log(2) + 1)),
        "psoftplus": softplus, "proottanh": (x ** 2 + np.log(2) + 1) ** (1 / (np.log(2) + 3)) * np.tanh(x),
        "maxsig": np.maximum(x, sigmoid), "cosid": np.cos(x) - x, "minsin": np.minimum(x, np.sin(x)),
        "maxtanh": np.maximum(x, np.tanh(x)), "mish": x * np.tanh(softplus), "tanhexp": x * np.tanh(np.exp(x)),
        "lisht": x * np.tanh(x), "seagull": np.log(1 + x ** 2), "snake": x + np.sin(x) ** 2,
        "roottanh": (x ** 2 + 1) ** (1 / 3) * np.tanh(x), "softplusmone": softplus - 1,
    }
    assert set(expected) == set(ACTIVATIONS)
    dim = mtf.Dimension("intermediate_expanded", x.size)

    def build(mesh, x):
        outputs = {}
        for name, fn in ACTIVATIONS.items():
            with tf.variable_scope(name):
                outputs[name] = fn(x)
        return outputs

    results, _ = run_mtf(build, {"x": x}, {"x": [dim]})
    for name, value in expected.items():
        np.testing.assert_allclose(results[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def linear_attention_reference(q, k, v, causal):
    """GPT-Neo's linear attention formula in float64, stabilised per query position."""
    q = np.exp(q - q.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    out = np.zeros_like(v)
    for t in range(q.shape[1]):
        seen = slice(0, t + 1) if causal else slice(None)
        keys = k[:, seen]                                  # [b, s, h, d]
        e = np.exp(keys - keys.max(1, keepdims=True))
        normalised = e / e.sum(1, keepdims=True)
        context = np.einsum("bshd,bshe->bhde", normalised, v[:, seen])
        out[:, t] = np.einsum("bhd,bhde->bhe", q[:, t], context)
    return out


def run_linear_attention(q, k, v, causal):
    b, s, h, d = q.shape
    cfg = tiny_config()
    dims = [mtf.Dimension("batch", b), mtf.Dimension("sequence", s), mtf.Dimension("heads", h),
            mtf.Dimension("features_per_head", d)]
    ctx = AttentionContext(cfg, False, dims[1], mtf.Dimension("memory_length", s), dims[3], causal=causal)

    def build(mesh, q, k, v):
        return {"out": ATTENTION["linear"].fn(q, k, v, ctx)}

    arrays = {name: a.astype(np.float32) for name, a in (("q", q), ("k", k), ("v", v))}
    return run_mtf(build, arrays, {"q": dims, "k": dims, "v": dims})


@pytest.mark.parametrize("causal", [True, False])
def test_linear_attention_matches_the_formula_even_with_extreme_keys(causal):
    rng = np.random.RandomState(0)
    b, s, h, d = 2, 16, 2, 4   # chunks of 4: the causal form crosses chunk boundaries
    assert linear_attention_chunk(s, d) == 4
    q, k, v = rng.randn(b, s, h, d), 3 * rng.randn(b, s, h, d), rng.randn(b, s, h, d)
    # exp(120) overflows float32 (GPT-Neo's unstabilised form gives inf); a stabiliser taken over the whole
    # sequence would instead underflow every earlier key of row 0 to zero. Position 12 starts a chunk.
    k[0, 12] = 120.0
    k[1, 5] = -90.0
    results, _ = run_linear_attention(q, k, v, causal)
    np.testing.assert_allclose(results["out"], linear_attention_reference(q, k, v, causal), rtol=1e-4, atol=1e-5)


def test_causal_linear_attention_never_holds_a_sequence_by_d_by_d_tensor():
    b, s, h, d = 1, 64, 1, 8
    rng = np.random.RandomState(1)
    _, graph = run_linear_attention(*(rng.randn(b, s, h, d) for _ in range(3)), causal=True)
    largest = max(t.shape.size for op in graph.operations for t in op.outputs)
    # GPT-Neo's causal form holds running sums of [batch, sequence, heads, d, d] (here 4096 values);
    # chunked, nothing exceeds the size of q itself.
    assert largest <= b * s * h * d < b * s * h * d * d


def test_rotary_embedding_rotates_feature_pairs_and_depends_only_on_relative_position():
    s, d = 8, 6
    rng = np.random.RandomState(2)
    query, key = rng.randn(d), rng.randn(d)
    x = np.stack([np.tile(query, (s, 1)), np.tile(key, (s, 1))])[:, :, None, :]  # [2 (q, k), s, 1, d]
    dims = [mtf.Dimension("batch", 2), mtf.Dimension("sequence", s), mtf.Dimension("heads", 1),
            mtf.Dimension("features_per_head", d)]
    results, _ = run_mtf(lambda mesh, x: {"y": rotary(x, dims[1], dims[3])}, {"x": x.astype(np.float32)}, {"x": dims})
    y = results["y"][:, :, 0]

    half = d // 2
    angle = np.arange(s)[:, None] * 10000.0 ** (-2 * np.arange(half) / d)
    first, second = x[:, :, 0, :half], x[:, :, 0, half:]
    expected = np.concatenate([first * np.cos(angle) - second * np.sin(angle),
                               second * np.cos(angle) + first * np.sin(angle)], axis=-1)
    np.testing.assert_allclose(y, expected, atol=1e-5)
    scores = y[0] @ y[1].T  # [query position, key position]
    for offset in range(-s + 1, s):
        np.testing.assert_allclose(np.diagonal(scores, offset), np.diagonal(scores, offset)[0], atol=1e-4)
    assert np.ptp([np.diagonal(scores, o)[0] for o in range(s)]) > 1e-2  # and it does depend on it


def test_axial_position_table_adds_a_row_and_a_column_embedding():
    cfg = tiny_config(axial_pos_emb=[4, 5])
    embd = mtf.Dimension("embd", cfg.n_embd)
    dtype = mtf.VariableDType(tf.float32)

    def build(mesh):
        table = axial_position_table(mesh, cfg, embd, dtype)
        first, second = (mesh.graph.name_to_variable[name].outputs[0] for name in ("axial_wpe_1", "axial_wpe_2"))
        return {"table": table, "first": first, "second": second}

    results, _ = run_mtf(build, {}, {})
    first, second = results["first"], results["second"]
    assert first.shape == (4, cfg.n_embd) and second.shape == (5, cfg.n_embd)
    expected = ((first[:, None, :] + second[None, :, :]) / 2).reshape(20, cfg.n_embd)  # position p = 5i + j
    np.testing.assert_allclose(results["table"], expected, atol=1e-7)
