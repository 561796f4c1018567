"""models/embeddings.py: rotary and axial position embeddings against plain NumPy."""
import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from models.embeddings import axial_position_table, rotary
from tiny import run_mtf, tiny_config


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
