"""An attention type is one registry entry: registered in one place, a toy type is accepted by the config,
trains, decodes with the kv cache (the same tokens as full recompute) and is counted in the model FLOPs.
And linear attention's math against plain NumPy (causal and not, its stability and its memory)."""
import re
import tempfile

import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from schema import ConfigError
from config import replace
from models import flops
from models.attention import ATTENTION, AttentionContext, incremental_unsupported, linear_attention_chunk, register
from models.layout import tensor_dim_sizes
from tests.models.test_sampling import new_tokens, prompts, sample
from tiny import random_tokens, run_mtf, tiny_config, train

WINDOW = 2  # the toy type: each position sees itself and the one before


def toy_attention(q, k, v, ctx):
    """Causal attention over the last WINDOW positions, in plain mesh-tensorflow ops."""
    k = mtf.replace_dimensions(k, ctx.sequence, ctx.memory_length)
    v = mtf.replace_dimensions(v, ctx.sequence, ctx.memory_length)
    query_pos = mtf.range(q.mesh, ctx.sequence, tf.int32)
    memory_pos = mtf.range(q.mesh, ctx.memory_length, tf.int32)
    hidden = mtf.logical_or(mtf.less(query_pos, memory_pos), mtf.less_equal(memory_pos, query_pos - WINDOW))
    logits = mtf.einsum([q, k], reduced_dims=[ctx.kv]) + mtf.cast(hidden, q.dtype) * -1e10
    weights = mtf.softmax(logits, ctx.memory_length)
    return mtf.einsum([weights, v], output_shape=q.shape)


def check_toy(cfg):
    if cfg.n_ctx < WINDOW:
        raise ConfigError(f"toy attention needs n_ctx >= {WINDOW}")


@pytest.fixture
def toy():
    register("toy", keys_per_query=lambda cfg: float(WINDOW), decode_window=lambda cfg: WINDOW,
             check=check_toy)(toy_attention)
    yield ATTENTION["toy"]
    del ATTENTION["toy"]


@pytest.mark.slow
def test_a_registered_attention_type_trains_decodes_and_counts_flops(toy):
    cfg = tiny_config(attention_types=[[["toy", "global"], 1]])
    assert cfg.attention_types == ("toy", "global")

    # FLOPs: the entry's keys per query, against the same model with two global layers.
    both_global = tiny_config(attention_types=[[["global"], 2]])
    toy_keys, global_keys = 6 * 2 * WINDOW * cfg.n_embd, 6 * 2 * (cfg.n_ctx / 2) * cfg.n_embd
    assert flops.training_flops_per_token(cfg) == flops.training_flops_per_token(both_global) - global_keys + toy_keys

    # Trains: the loss falls on a repeated batch.
    data = random_tokens([cfg.train_batch_size, cfg.n_ctx + 1])
    with tempfile.TemporaryDirectory() as folder:
        losses = train(replace(cfg, model_path=folder, train_steps=6, steps_per_checkpoint=6), data)
        assert len(losses) == 6 and np.isfinite(losses).all() and losses[-1] < losses[0]

        # Decodes with the kv cache (its decode window), giving the tokens full recompute gives.
        assert incremental_unsupported(cfg) is None
        tokens, lengths = prompts(cfg, lengths=(3, 6))
        cached, cached_lengths = sample(cfg, tokens, lengths, checkpoint=folder, temperature=0.0)
        full, full_lengths = sample(cfg, tokens, lengths, checkpoint=folder, temperature=0.0, incremental=False)
    np.testing.assert_array_equal(cached_lengths, full_lengths)
    assert new_tokens(cached, cached_lengths, lengths) == new_tokens(full, full_lengths, lengths)


def test_an_attention_types_own_checks_run_when_the_config_is_read(toy):
    with pytest.raises(ConfigError, match="toy attention needs n_ctx >= 2"):
        tiny_config(n_ctx=1, attention_types=[[["toy"], 2]])


def test_an_unknown_attention_type_is_an_error_not_zero_flops():
    with pytest.raises(ConfigError, match="attention type 'toy' is not known"):
        tiny_config(attention_types=[[["toy"], 2]])


def check_toy_layout(cfg):
    if dict(cfg.layout_rules).get("sequence"):
        raise ConfigError("toy_blocks attention cannot split 'sequence'")


@pytest.fixture
def toy_blocks():
    """A toy type whose tensors add a dimension 'toy_block' (size 6) that sits with 'heads' in one tensor."""
    register("toy_blocks", keys_per_query=lambda cfg: float(WINDOW), layout_dims=lambda cfg: {"toy_block": 6},
             co_occurring_dims=(("toy_block", "heads"),), check_layout=check_toy_layout)(toy_attention)
    yield ATTENTION["toy_blocks"]
    del ATTENTION["toy_blocks"]


def test_an_attention_types_dimensions_and_layout_checks_come_from_its_entry(toy_blocks):
    toy = dict(attention_types=[[["toy_blocks", "global"], 1]])
    cfg = tiny_config(mesh_shape="x:2", layout="toy_block:x", **toy)
    assert tensor_dim_sizes(cfg)["toy_block"] == 6 and "toy_block" not in tensor_dim_sizes(tiny_config())
    for types, mesh_shape, layout, message in [
            ({}, "x:2", "toy_block:x", "not a dimension of this model"),  # without the type, not a dimension
            (toy, "x:4", "toy_block:x", "(size 6) over 'x' (size 4)"),
            (toy, "x:2", "toy_block:x,heads:x", "'toy_block' and 'heads' to the same"),
            (toy, "x:2", "sequence:x", "toy_blocks attention cannot split")]:
        with pytest.raises(ConfigError) as info:
            tiny_config(mesh_shape=mesh_shape, layout=layout, **types)
        assert message in str(info.value) and "\n" not in str(info.value)
        # A config moved to another mesh and layout in code (--auto_layout, --dry_run) is checked the same way.
        with pytest.raises(ConfigError, match=re.escape(message)):
            replace(tiny_config(**types), mesh_shape=mesh_shape, layout=layout)


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
