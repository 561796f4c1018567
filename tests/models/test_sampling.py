"""Sampling: the kv cache against full recompute and against HF transformers' generate, seeds, filters, stops."""
import dataclasses

import numpy as np
import pytest

from schema import ConfigError, option
from config import replace
from models.attention import ATTENTION, FULL_RECOMPUTE, incremental_unsupported, uses_cache
from models.sampling import SamplingOptions, prefill_bucket, prefill_span
from infer.run import Predictor
from tiny import (checkpoint_of_order_one_weights, devices_for, placement_for, random_tokens, run_predict,
                  tiny_config)

PADDING = 0
MAX_NEW = 6


def prompts(cfg, lengths, seed=1):
    """Rows of random prompt tokens of the given lengths, then padding."""
    lengths = np.array(lengths, np.int32)
    tokens = random_tokens([len(lengths), cfg.n_ctx], vocab=cfg.n_vocab, seed=seed)
    tokens[np.arange(cfg.n_ctx)[None, :] >= lengths[:, None]] = PADDING
    return tokens, lengths


def sample(cfg, tokens, lengths, seeds=None, checkpoint=None, predictor=None, batch_size=None, **options):
    """The sampled tokens and lengths; through `predictor` (a Predictor of cfg) where given, whose program for
    these options and `batch_size` (all rows by default) is built once and run again for each call with other rows
    or seeds."""
    options = dict(dict(max_new_tokens=MAX_NEW, padding_id=PADDING), **options)
    opts = SamplingOptions.from_config(cfg, **options)
    seeds = np.full(len(tokens), 7, np.int32) if seeds is None else np.asarray(seeds, np.int32)
    features = {"tokens": tokens, "prompt_length": lengths, "seed": seeds}
    if predictor is not None:
        out = predictor.predict(features, batch_size or len(tokens), opts)
    else:
        out = run_predict(cfg, features, devices_for(cfg), checkpoint, opts)
    return out["tokens"], out["lengths"]


def new_tokens(tokens, lengths, prompt_lengths):
    return [list(row[p:n]) for row, p, n in zip(tokens, prompt_lengths, lengths)]


SAMPLED = dict(temperature=1.0, top_k=20, top_p=0.9)


@pytest.fixture(scope="module")
def cfg():
    # Local window 4 < the positions sampled, so the cache's window mask is exercised.
    return tiny_config(local_attention_radius=4)


@pytest.fixture(scope="module")
def rows(cfg):
    """Six prompts: row 3 repeats row 0 (same seed too), row 4 fills the whole context."""
    tokens, lengths = prompts(cfg, lengths=(3, 5, 9, 3, cfg.n_ctx, 2))
    tokens[3] = tokens[0]
    return tokens, lengths


@pytest.fixture(scope="module")
def predictor(cfg):
    """cfg's programs at the initial weights, each built once for the module and run for every call like it."""
    with Predictor(cfg, placement_for(cfg)) as kept:
        yield kept


@pytest.fixture(scope="module")
def greedy(cfg, rows, predictor):
    return sample(cfg, *rows, predictor=predictor, temperature=0.0)


@pytest.fixture(scope="module")
def sampled(cfg, rows, predictor):
    return sample(cfg, *rows, predictor=predictor, **SAMPLED)


@pytest.mark.slow
@pytest.mark.parametrize("options", [dict(temperature=0.0), SAMPLED], ids=["greedy", "sampled"])
def test_kv_cache_gives_the_same_tokens_as_full_recompute(cfg, rows, greedy, sampled, predictor, options):
    tokens, lengths = rows
    assert uses_cache(cfg, SamplingOptions.from_config(cfg))
    cached = greedy if options["temperature"] == 0 else sampled
    full = sample(cfg, tokens, lengths, predictor=predictor, incremental=False, **options)
    np.testing.assert_array_equal(cached[0], full[0])
    np.testing.assert_array_equal(cached[1], full[1])
    np.testing.assert_array_equal(cached[1], np.minimum(lengths + MAX_NEW, cfg.n_ctx))
    # Prompts are kept, and the rest of each row is padding.
    for row, p, n, prompt in zip(cached[0], lengths, cached[1], tokens):
        np.testing.assert_array_equal(row[:p], prompt[:p])
        assert (row[n:] == PADDING).all()


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2", "memory_length:x")])
def test_kv_cache_gives_the_tokens_of_full_recompute_where_each_layers_mask_decides_them(order_one, mesh_shape,
                                                                                         layout):
    """A cached step that masks a layer wrongly (a local layer seeing past its window, a global one held to it:
    the visibility bias of one window handed to a layer of the other) gives other tokens than recomputing the
    whole context, where the weights are of order one and the draw is at a high temperature, so that the tokens
    follow the logits' shifts (greedy tokens at these weights settle on one token; at the initial weights, std
    0.02, the tests above do not tell). Local layers come first, so a global layer handed their bias is held to
    the window; with the cache's memory split the step takes mtf's attention, where the bias alone sets the
    window (the in-place path reads only the window's rows). On one device, order_one's Predictor (the same model
    and weights) runs the rows 4 at a time: its cached program is the one the prefill tests below run too."""
    one_device, checkpoint, predictor, _ = order_one
    cfg = replace(one_device, mesh_shape=mesh_shape, layout=layout)
    draw = dict(predictor=predictor, batch_size=4) if mesh_shape == "all:1" else dict(checkpoint=checkpoint)
    tokens, lengths = prompts(cfg, lengths=(2, 5, 8, 1, 3, 4, 6, 2), seed=3)
    draw.update(temperature=8.0, max_new_tokens=cfg.n_ctx, seeds=np.arange(8))
    cached = sample(cfg, tokens, lengths, **draw)
    full = sample(cfg, tokens, lengths, incremental=False, **draw)
    np.testing.assert_array_equal(cached[1], cfg.n_ctx)
    np.testing.assert_array_equal(cached[0], full[0])


@pytest.mark.slow
def test_same_seed_repeats_samples_and_another_seed_changes_them(cfg, rows, sampled, predictor):
    """Run again by the program that drew `sampled` (as --predict and the harness run theirs, batch after batch):
    a draw that depends on anything but the fed seeds and rows (a stateful random op) differs the second time."""
    again = sample(cfg, *rows, predictor=predictor, **SAMPLED)[0]
    other = sample(cfg, *rows, seeds=np.full(6, 8), predictor=predictor, **SAMPLED)[0]
    np.testing.assert_array_equal(sampled[0], again)
    assert (sampled[0] != other).any()
    # Rows with the same prompt and seed still differ: the row index is part of the draw.
    assert (sampled[0][0] != sampled[0][3]).any()


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape,layout", [("x:2,y:2", "batch:x,heads:y"), ("x:2", "vocab:x")])
def test_samples_are_the_same_on_every_layout(cfg, rows, sampled, mesh_shape, layout):
    split = sample(replace(cfg, mesh_shape=mesh_shape, layout=layout), *rows, **SAMPLED)
    np.testing.assert_array_equal(split[0], sampled[0])


@pytest.mark.slow
def test_top_k_and_top_p_sample_only_from_the_allowed_tokens(cfg, rows, greedy, predictor):
    tokens, lengths = rows

    def top_k(values, k=3):
        return set(np.argsort(-values)[:k])

    def nucleus(values, p=0.5):
        order = np.argsort(-values)
        probs = np.exp(values[order] - values.max())
        probs /= probs.sum()
        before = np.cumsum(probs) - probs
        return set(order[before < p])

    for rule, options in ((top_k, dict(top_k=3)), (nucleus, dict(top_p=0.5))):
        out, out_lengths = sample(cfg, tokens, lengths, seeds=[11, 12, 13, 14, 15, 16], predictor=predictor,
                                  temperature=1.0, **options)
        logits = predictor.predict({"tokens": out}, len(out))["logits"]  # logits at t-1 chose the token at t
        pairs = [(out[r, t], rule(logits[r, t - 1])) for r in range(len(out)) for t in range(lengths[r], out_lengths[r])]
        assert len(pairs) == 5 * MAX_NEW
        assert all(token in allowed for token, allowed in pairs), options
        assert all(len(allowed) > 1 for _, allowed in pairs[:3]) and (out != greedy[0]).any(), options  # not greedy


@pytest.mark.slow
def test_stop_token_max_new_tokens_and_remove_partial_sequences(cfg, rows, greedy, predictor):
    tokens, lengths = rows
    free_new = new_tokens(*greedy, lengths)
    assert free_new[4] == [] and greedy[1][4] == cfg.n_ctx  # no room after a full-context prompt
    # Stop on a token row 1 first produces as a later new token.
    index = next(i for i in range(1, MAX_NEW) if free_new[1][i] not in free_new[1][:i])
    stop = int(free_new[1][index])
    stopped, stopped_lengths = sample(cfg, tokens, lengths, predictor=predictor, temperature=0.0, stop_id=stop)
    got = new_tokens(stopped, stopped_lengths, lengths)
    assert got[1] == free_new[1][:index + 1]  # ends with the stop token, then padding
    assert (stopped[1, stopped_lengths[1]:] == PADDING).all()
    for row in range(len(tokens)):  # every row is the free run cut just after its first stop token (if any)
        cut = free_new[row].index(stop) + 1 if stop in free_new[row] else len(free_new[row])
        assert got[row] == free_new[row][:cut]

    cut, cut_lengths = sample(cfg, tokens, lengths, predictor=predictor, temperature=0.0, max_new_tokens=2,
                              remove_partial_sequences=True)
    np.testing.assert_array_equal(cut_lengths, np.minimum(lengths + 2, cfg.n_ctx) - lengths)
    for row in range(len(tokens)):
        assert list(cut[row, :cut_lengths[row]]) == free_new[row][:2]
        assert (cut[row, cut_lengths[row]:] == PADDING).all()


@pytest.mark.slow
def test_each_row_draws_by_its_own_options_with_no_program_built_for_them(cfg, rows, greedy, sampled, predictor):
    """The drawn options (models/sampling.DRAWN) are fed with the rows: a batch whose rows mix them gives each row
    the tokens a batch of its setting alone gives it, compiled and on the mtf loop, and builds no program of its
    own. Alone, the settings ran on each kind of program (SamplingOptions.program: greedy or drawn, filtered or
    not, stopping or not); mixed, on the one that draws, filters and stops, built for row 2's setting, whose
    filters leave the rows without any alone. Guards the options' values fed over the rows' own, a drawn option
    built into the program, and the filters of a row without them."""
    tokens, lengths = rows
    free_new = new_tokens(*greedy, lengths)
    stop = int(free_new[5][1])
    settings = [SAMPLED, dict(temperature=1.0, top_k=3), dict(temperature=1.0, top_p=0.5, stop_id=stop),
                dict(temperature=1.0, max_new_tokens=2), dict(temperature=0.0), dict(temperature=0.0, stop_id=stop)]
    options = [SamplingOptions.from_config(cfg, **dict(dict(max_new_tokens=MAX_NEW, padding_id=PADDING), **setting))
               for setting in settings]
    alone = [sample(cfg, tokens, lengths, predictor=predictor, **dict(dict(max_new_tokens=MAX_NEW), **setting))
             for setting in settings]
    programs = len(predictor._programs)
    drawn = [o.draw_rows(1) for o in options]
    mixed_rows = {"tokens": tokens, "prompt_length": lengths, "seed": np.full(len(tokens), 7, np.int32),
                  **{name: np.concatenate([d[name] for d in drawn]) for name in drawn[0]}}
    mixed = predictor.predict(mixed_rows, len(tokens), options[0])
    assert len(predictor._programs) == programs
    # and on the mtf sampler's loop (these draws above ran compiled), which gives the compiled path's tokens
    loop = predictor.predict(mixed_rows, len(tokens), dataclasses.replace(options[0], compiled=False))
    for name, out in (("compiled", mixed), ("mtf loop", loop)):
        for row, (tokens_alone, lengths_alone) in enumerate(alone):
            np.testing.assert_array_equal(out["tokens"][row], tokens_alone[row], err_msg=f"{name}, row {row}")
            assert out["lengths"][row] == lengths_alone[row], (name, row)
        assert out["lengths"][3] == lengths[3] + 2  # its max_new_tokens
        assert out["lengths"][5] == lengths[5] + free_new[5].index(stop) + 1 < lengths[5] + MAX_NEW  # its stop id


@pytest.mark.slow
def test_greedy_decoding_matches_hf_transformers_generate(order_one):
    """order_one's model (4 layers, local then global, window 3) at its weights of order one (GPT-Neo's variable
    names, as a training saves them: the tokens follow the logits' shifts, and no training is run to get a
    checkpoint) decodes greedily to the end of the context as transformers' generate does, with the cache and by
    full recompute. Its Predictor runs both: the cached program is the one the prefill test below runs."""
    torch = pytest.importorskip("torch")
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    from transformers.models.gpt_neo.modeling_gpt_neo import load_tf_weights_in_gpt_neo

    cfg, checkpoint, predictor, (tokens, lengths) = order_one
    hf_config = GPTNeoConfig(
        vocab_size=cfg.n_vocab, max_position_embeddings=cfg.n_ctx, hidden_size=cfg.n_embd, num_layers=cfg.n_layer,
        attention_types=[[["local", "global"], 2]], num_heads=cfg.n_head, window_size=cfg.local_attention_radius,
        activation_function="gelu_new", resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0)
    assert tuple(hf_config.attention_layers) == cfg.attention_types
    hf_model = GPTNeoForCausalLM(hf_config)
    load_tf_weights_in_gpt_neo(hf_model, hf_config, checkpoint)
    hf_model.eval()

    with torch.no_grad():  # each row to the end of the context (n_ctx), as max_new_tokens n_ctx does here
        hf_rows = [hf_model.generate(torch.tensor(tokens[row:row + 1, :length], dtype=torch.long),
                                     attention_mask=torch.ones([1, length], dtype=torch.long),
                                     max_new_tokens=cfg.n_ctx - length, do_sample=False, pad_token_id=PADDING,
                                     eos_token_id=None)[0].numpy() for row, length in enumerate(lengths)]
    assert len({tuple(theirs[length:]) for theirs, length in zip(hf_rows, lengths)}) > 1  # rows differ: tokens tell
    for incremental in (True, False):
        out, out_lengths = sample(cfg, tokens, lengths, seeds=np.arange(4), predictor=predictor, temperature=0.0,
                                  max_new_tokens=cfg.n_ctx, incremental=incremental)
        for row, (length, theirs) in enumerate(zip(lengths, hf_rows)):
            assert len(theirs) == cfg.n_ctx
            np.testing.assert_array_equal(out[row, :out_lengths[row]], theirs, err_msg=f"row {row}")


@pytest.mark.slow
def test_models_without_an_incremental_path_fall_back_to_full_recompute(cfg, monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class WithExtraOption(type(cfg)):
        some_new_option: bool = option(False)

    extended = WithExtraOption(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    assert incremental_unsupported(extended) is None
    assert "some_new_option" in incremental_unsupported(dataclasses.replace(extended, some_new_option=True))

    # An attention type without an incremental path (here global attention under another name): sampling
    # falls back to full recompute on its own and gives the tokens the cached global model gives.
    monkeypatch.setitem(ATTENTION, "global_no_cache", dataclasses.replace(ATTENTION["global"], name="global_no_cache",
                                                                             decode_window=lambda cfg: FULL_RECOMPUTE))
    plain = tiny_config(attention_types=[[["global"], 2]])
    other = tiny_config(attention_types=[[["global_no_cache"], 2]])
    assert "global_no_cache" in incremental_unsupported(other)
    assert not uses_cache(other, SamplingOptions.from_config(other))
    tokens, lengths = prompts(plain, lengths=(4, 7))
    np.testing.assert_array_equal(sample(other, tokens, lengths, temperature=1.0)[0],
                                  sample(plain, tokens, lengths, temperature=1.0)[0])


@pytest.mark.slow
def test_model_options_decode_with_the_cache_where_they_can_and_fall_back_where_not(cfg):
    # Per-position options (GLU, ScaleNorm, macaron, untied output, axial positions, a layer without attention)
    # keep the cache and give the tokens full recompute gives.
    options = tiny_config(n_layer=3, attention_types=[[["global", "none", "local"], 1]], mlp_glu=True, scalenorm=True,
                          macaron=True, no_weight_tie=True, axial_pos_emb=[4, 4])
    assert uses_cache(options, SamplingOptions.from_config(options))
    tokens, lengths = prompts(options, lengths=(3, 6))
    np.testing.assert_array_equal(sample(options, tokens, lengths, temperature=0.0)[0],
                                  sample(options, tokens, lengths, temperature=0.0, incremental=False)[0])
    # MoE layers (as in the reference), rotary positions and memory key/values decode by full recompute.
    for changes in (dict(moe_layers=[1]), dict(rotary_emb=True), dict(num_mem_kv=2)):
        assert incremental_unsupported(tiny_config(**changes)) is not None, changes
    moe = tiny_config(moe_layers=[1])
    out, out_lengths = sample(moe, tokens, lengths, temperature=1.0)
    np.testing.assert_array_equal(out_lengths, lengths + MAX_NEW)
    assert ((out >= 0) & (out < moe.n_vocab)).all()


# ----------------------------------------------------------------------------------------------------
# The prefill over a prompt bucket (SamplingOptions.prefill_length)


def test_prefill_bucket_is_the_smallest_power_of_two_holding_the_longest_prompt_up_to_n_ctx():
    """Guards `prefill_bucket` one short of the prompt (`max(longest - 2, 0)`: 3 -> 2) or one power too long."""
    for longest in range(1, 40):
        bucket = prefill_bucket(longest, 32)
        assert bucket == min(32, 2 ** int(np.ceil(np.log2(longest)))), longest
        assert bucket >= min(longest, 32) and (bucket == 1 or bucket // 2 < longest), longest


def test_with_prefill_bucket_prefills_over_the_longest_prompts_bucket_and_changes_nothing_else():
    """The one place --predict and the harness pick their prefill (SamplingOptions.with_prefill_bucket): the bucket
    of the longest prompt, whatever the order, capped at n_ctx; every other option kept. Guards the bucket of the
    shortest or the first prompt (`min` for `max`)."""
    options = SamplingOptions.from_config(tiny_config(), temperature=0.5, top_k=3)
    for lengths, n_ctx in [([3, 5, 1], 16), (np.array([1, 9, 2], np.int32), 16), ([2, 40], 32), ([1], 16)]:
        bucketed = options.with_prefill_bucket(lengths, n_ctx)
        assert bucketed.prefill_length == prefill_bucket(max(lengths), n_ctx), lengths
        assert bucketed == dataclasses.replace(options, prefill_length=bucketed.prefill_length)
    assert options.with_prefill_bucket([3, 5, 1], 16).prefill_length == 8


def test_prefill_span_is_the_option_unless_the_layout_splits_the_sequence_or_the_cache():
    """A split sequence or cache memory (mtf slices and pads only whole dimensions) prefills the whole context;
    a length outside [1, n_ctx] is refused with one line naming prefill_bucket."""
    import mesh_tensorflow as mtf
    cfg = tiny_config()
    sequence = mtf.Dimension("sequence", cfg.n_ctx)
    assert prefill_span(cfg, SamplingOptions.from_config(cfg, prefill_length=4), sequence) == 4
    assert prefill_span(cfg, SamplingOptions.from_config(cfg), sequence) == cfg.n_ctx
    for layout in ("sequence:x", "memory_length:x"):
        split = tiny_config(attention_types=[[["global"], 2]], mesh_shape="x:2", layout=layout)
        assert prefill_span(split, SamplingOptions.from_config(split, prefill_length=4), sequence) == cfg.n_ctx
    for wrong in (0, cfg.n_ctx + 1):
        with pytest.raises(ConfigError, match="prefill_bucket"):
            prefill_span(cfg, SamplingOptions.from_config(cfg, prefill_length=wrong), sequence)


@pytest.fixture(scope="module")
def order_one(tmp_path_factory):
    """cfg's model at weights of order one (where the tokens follow the logits' shifts: see the mask test above),
    a Predictor of it and rows whose longest prompt, 7, is in the bucket of 8 and whose shortest is 3. The HF
    parity, mask and prefill tests share its programs."""
    cfg = tiny_config(n_layer=4, attention_types=[[["local", "global"], 2]], local_attention_radius=3)
    checkpoint = checkpoint_of_order_one_weights(cfg, str(tmp_path_factory.mktemp("order_one") / "model.ckpt-1"))
    tokens, lengths = prompts(cfg, lengths=(5, 3, 7, 4), seed=3)
    with Predictor(cfg, placement_for(cfg), checkpoint) as kept:
        yield cfg, checkpoint, kept, (tokens, lengths)


HOT = dict(temperature=8.0, max_new_tokens=16)


@pytest.mark.slow
@pytest.mark.parametrize("options", [dict(temperature=0.0, max_new_tokens=16), HOT], ids=["greedy", "sampled"])
def test_a_prefill_over_the_prompts_bucket_gives_the_tokens_of_the_whole_contexts_prefill(order_one, options):
    """The prefill over the bucket of the longest prompt (8 of n_ctx 16) and over one position only (shorter
    than the shortest prompt: the loop then starts just past it and feeds the prompts token by token) give the
    tokens of a prefill over all n_ctx positions. Guards the bucket's tokens or positions offset by one
    (`mtf.slice(tokens, 1, ...)`), its cache padded in front (`[cache_length - P, 0]`), and a loop that starts
    at the shortest prompt past a shorter prefill (no `mtf.minimum(start, span + 1)`: zeros read as keys)."""
    cfg, _, predictor, rows = order_one
    bucket = prefill_bucket(rows[1].max(), cfg.n_ctx)
    assert bucket == 8
    full = sample(cfg, *rows, seeds=np.arange(4), predictor=predictor, **options)
    np.testing.assert_array_equal(full[1], cfg.n_ctx)
    assert len({tuple(row) for row in full[0][:, 8:]}) > 1  # rows differ: the tokens tell
    spans = (bucket, 1) if options["temperature"] == 0 else (bucket,)
    for span in spans:
        short = sample(cfg, *rows, seeds=np.arange(4), predictor=predictor, prefill_length=span, **options)
        np.testing.assert_array_equal(short[0], full[0], err_msg=f"prefill_length {span}")
        np.testing.assert_array_equal(short[1], full[1])


@pytest.mark.slow
def test_a_bucket_prefill_split_over_two_devices_gives_the_tokens_of_one_devices_whole_prefill(order_one):
    """Split over heads, the layout that splits the caches themselves (an embd split was seen to pass too: one more
    program, ~20 s). Guards the bucket's cache padded in front (`[cache_length - P, 0]`) here too."""
    cfg, checkpoint, predictor, rows = order_one
    one = sample(cfg, *rows, seeds=np.arange(4), predictor=predictor, **HOT)
    split = sample(replace(cfg, mesh_shape="x:2", layout="heads:x"), *rows, seeds=np.arange(4), checkpoint=checkpoint,
                   prefill_length=8, **HOT)
    np.testing.assert_array_equal(split[0], one[0])


@pytest.mark.slow
def test_models_without_a_cache_ignore_the_prefill_length():
    """A rotary model recomputes in full: the prefill length changes nothing. Guards the cache's prefill taken on
    `options.incremental` alone (`uses_cache` skipped: the rotary model's loop fails to build)."""
    cfg = tiny_config(rotary_emb=True)
    assert not uses_cache(cfg, SamplingOptions.from_config(cfg))
    tokens, lengths = prompts(cfg, lengths=(3, 6))
    np.testing.assert_array_equal(sample(cfg, tokens, lengths, temperature=1.0, prefill_length=8)[0],
                                  sample(cfg, tokens, lengths, temperature=1.0)[0])
