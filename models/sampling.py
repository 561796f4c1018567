"""Autoregressive sampling inside the mesh-tensorflow graph: one `mtf.while_loop` that writes a token per step.

Each row of `tokens` holds its prompt in positions [0, prompt_length), then padding. The loop starts at the
shortest prompt and fills one position per step; rows whose prompt is longer keep their own tokens until
their prompt ends. A row stops after `max_new_tokens` new tokens, at its stop token, or at the end of the
context; the loop ends when every row has stopped.

Two ways to get each step's logits:

* **incremental** (default): a prefill pass records every attention layer's keys and values, then each step
  runs the model on one token per row against that cache (models/kv_cache.py), so the cost of a new token does
  not grow with the prompt. The prefill runs over the first `prefill_length` positions (callers pick the
  `prefill_bucket` of their longest prompt with `SamplingOptions.with_prefill_bucket`), or all n_ctx where it is None;
* **full recompute**: each step runs the whole context again. Used when `kv_cache` is false or the model has a
  layer type or option without an incremental path (`models.attention.incremental_unsupported`).

Choosing a token (temperature, with `sampling_use_entmax` entmax instead of the softmax, top-k, top-p, then a
Gumbel-max draw) runs on whole vocabulary rows. Its
randomness is a stateless hash of (seed, row, position, token id), so a fixed seed gives the same samples on
every run, on every mesh layout, incremental or not.

The options a draw changes (`DRAWN`: temperature, top-k, top-p, max_new_tokens, the stop id) are tensors with a
row each, not part of the graph: infer/run.Predictor feeds them beside the prompts (`SamplingOptions.draw_rows`),
so a few programs serve every setting of them (each task's generation settings) and a batch may mix them:
greedy or drawing, filtering or not, stopping at a token or not (`SamplingOptions.program`), whatever the
values. The rest (entmax, the stop ids, the prefill, the path) shape the program.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from models import compiled_decoding, gpt, kv_cache
from models.attention import uses_cache
from models.token_choice import NO_STOP, choose_tokens_tf, is_one_of_tf
from schema import ConfigError, GPTConfig, dimension_is_split


@dataclass(frozen=True)
class SamplingOptions:
    max_new_tokens: int
    temperature: float = 1.0   # 0: greedy (argmax)
    top_k: int = 0             # 0: no top-k filter
    top_p: float = 1.0         # 1: no nucleus filter
    stop_id: Optional[int] = None
    padding_id: int = 0
    remove_partial_sequences: bool = False
    incremental: bool = True   # use the kv cache where the model supports it
    entmax_alpha: Optional[float] = None  # sample from entmax_α(logits / temperature); None: the softmax
    stop_ids: tuple = ()       # more ids a row also ends at (the harness's stop sequences), the id kept like stop_id's
    prefill_length: Optional[int] = None  # positions the kv cache's prefill runs over (`prefill_bucket`); None: n_ctx
    compiled: bool = True      # the whole generation as one XLA program where supported (models/compiled_decoding.py)

    @classmethod
    def from_config(cls, cfg: GPTConfig, **changes) -> "SamplingOptions":
        stop = cfg.eos_id if cfg.stop_token is None else (None if cfg.stop_token < 0 else cfg.stop_token)
        values = dict(max_new_tokens=cfg.max_new_tokens or cfg.n_ctx, temperature=cfg.temperature, top_k=cfg.top_k,
                      top_p=cfg.top_p, stop_id=stop, padding_id=cfg.padding_id if cfg.padding_id is not None else 0,
                      remove_partial_sequences=cfg.remove_partial_sequences, incremental=cfg.kv_cache,
                      entmax_alpha=cfg.entmax_alpha if cfg.sampling_use_entmax else None,
                      compiled=cfg.compiled_decoding)
        values.update(changes)
        return cls(**values)

    def draw_rows(self, count: int) -> dict:
        """The options a draw feeds (`DRAWN`), each as an array of `count` rows: the stop id None as NO_STOP."""
        values = {name: getattr(self, name) for name in DRAWN}
        values["stop_id"] = NO_STOP if self.stop_id is None else self.stop_id
        return {name: np.full(count, values[name], dtype) for name, dtype in DRAWN.items()}

    def program(self, drawn: dict) -> "SamplingOptions":
        """These options without the drawn ones (None): what a program is built from and keyed by, the values of
        `drawn` (draw_rows' arrays) fed per row to it; but where no row draws, a temperature of 0 (the greedy
        program: the argmax alone), where no row filters, top_k 0 and top_p 1 (no sort of the vocabulary each
        token), and where no row stops at a token, stop_id NO_STOP (no check). Conditionals in one program cost
        more a token than these few programs (docs/sampling.md)."""
        changes = {name: None for name in DRAWN}
        if not (drawn["temperature"] > 0).any():
            changes["temperature"] = 0.0
        if not ((drawn["top_k"] > 0) | (drawn["top_p"] < 1)).any():
            changes.update(top_k=0, top_p=1.0)
        if (drawn["stop_id"] == NO_STOP).all():
            changes["stop_id"] = NO_STOP
        return dataclasses.replace(self, **changes)

    def with_prefill_bucket(self, prompt_lengths, n_ctx: int) -> "SamplingOptions":
        """These options with the kv cache's prefill over the bucket of the longest of `prompt_lengths`
        (`prefill_bucket`), not all n_ctx positions: a few programs, one per bucket, serve every prompt length."""
        return dataclasses.replace(self, prefill_length=prefill_bucket(max(prompt_lengths), n_ctx))


# The options fed per row (the features of these names, with their dtypes) rather than built into the program.
DRAWN = {"temperature": np.float32, "top_k": np.int32, "top_p": np.float32, "max_new_tokens": np.int32,
         "stop_id": np.int32}


@dataclass(frozen=True)
class Draw:
    """The drawn options as mtf tensors [batch] (see DRAWN), and each row's id in the draw's noise (`row`)."""
    temperature: mtf.Tensor
    top_k: mtf.Tensor
    top_p: mtf.Tensor
    max_new_tokens: mtf.Tensor
    stop_id: mtf.Tensor
    row: mtf.Tensor

    @classmethod
    def of(cls, features: dict, options: SamplingOptions, mesh: mtf.Mesh, batch: mtf.Dimension) -> "Draw":
        """The drawn options from `features` where they are fed, or else `options`' values for every row. The row
        id is the feature "draw_row" where fed (the harness feeds zeros: a request's sample is then its seed's
        whatever rows run beside it, so sampled requests share a batch), else the row's place in the batch (rows
        of one prompt and seed draw different samples)."""
        if any(name not in features for name in DRAWN):
            features = {**options.draw_rows(batch.size), **features}
        shape = mtf.Shape([batch])
        drawn = {name: mtf.import_fully_replicated(mesh, tf.cast(features[name], dtype), shape, name)
                 for name, dtype in DRAWN.items()}
        row = (mtf.import_fully_replicated(mesh, tf.cast(features["draw_row"], tf.int32), shape, "draw_row")
               if "draw_row" in features else mtf.range(mesh, batch, tf.int32))
        return cls(**drawn, row=row)


def prefill_bucket(longest_prompt: int, n_ctx: int) -> int:
    """The prefill length for prompts of up to `longest_prompt` tokens: the smallest power of two that holds
    them, at most n_ctx, so that a few programs (one per bucket) serve every prompt length."""
    return min(1 << max(int(longest_prompt) - 1, 0).bit_length(), n_ctx)


def prefill_span(cfg: GPTConfig, options: SamplingOptions, sequence: mtf.Dimension) -> int:
    """How many positions the prefill runs over: options.prefill_length, or the whole sequence where it is None
    or where the layout splits the sequence or the cache's memory (mtf slices and pads only whole dimensions)."""
    length = options.prefill_length
    if length is None or dimension_is_split(cfg, sequence.name) or dimension_is_split(cfg, "memory_length"):
        return sequence.size
    if not 1 <= length <= sequence.size:
        raise ConfigError(f"prefill_length must be in [1, {sequence.size}] (the context), got {length}: pick it "
                          f"with models.sampling.prefill_bucket(longest prompt, n_ctx)")
    return length


# ----------------------------------------------------------------------------------------------------
# Choosing tokens


def choose_tokens(logits: mtf.Tensor, seeds: mtf.Tensor, position: mtf.Tensor, dims: gpt.Dims,
                  options: SamplingOptions, draw: Draw) -> mtf.Tensor:
    """logits [batch, vocab] -> token ids [batch], each row by its own drawn options. The vocabulary is gathered
    onto each device first (a layout may split it), so each batch slice chooses from whole rows."""
    whole = mtf.Dimension("sampling_vocab", dims.vocab.size)
    rows_logits = mtf.replace_dimensions(logits, dims.vocab, whole)
    return mtf.slicewise(lambda lg, sd, rw, pos, t, k, p: choose_tokens_tf(lg, sd, rw, pos, options, t, k, p),
                         [rows_logits, seeds, draw.row, position, draw.temperature, draw.top_k, draw.top_p],
                         output_shape=mtf.Shape([dims.batch]), output_dtype=tf.int32, splittable_dims=[dims.batch],
                         name="choose_tokens")


def is_one_of(ids: mtf.Tensor, values: tuple) -> mtf.Tensor:
    """`is_one_of_tf` on a mesh-tensorflow tensor."""
    return mtf.slicewise(lambda t: is_one_of_tf(t, values), [ids],
                         output_shape=ids.shape, output_dtype=tf.bool, splittable_dims=ids.shape.dims, name="stop_ids")


# ----------------------------------------------------------------------------------------------------
# The loop


def sample(tokens: mtf.Tensor, prompt_lengths: mtf.Tensor, seeds: mtf.Tensor, cfg: GPTConfig, dims: gpt.Dims,
           options: SamplingOptions, draw: Draw) -> dict:
    """tokens [batch, sequence] int32, prompt_lengths [batch] int32 (>= 1), seeds [batch] int32, each row's drawn
    options `draw` (`options`' own drawn values are not read) ->

    {"tokens": [batch, sequence] int32, "lengths": [batch] int32}: each row's prompt and new tokens (the stop
    token included) followed by padding, and how many of its positions are filled. With
    `remove_partial_sequences` the prompt is cut off: rows start with the new tokens and `lengths` counts them.
    """
    if cfg.mlm_training:
        raise ConfigError("a masked language model (mlm_training) was not trained to continue text left to right: "
                          "sample from a causal model")
    mesh = tokens.mesh
    seq = dims.sequence
    if compiled_decoding.unsupported(cfg, options) is None:  # one XLA program for the whole generation
        return compiled_decoding.sample(tokens, prompt_lengths, seeds, cfg, dims, options, draw,
                                        prefill_span(cfg, options, seq))
    incremental = uses_cache(cfg, options)
    # The first pass builds the variables (a while_loop body may only reuse them) and, when incremental,
    # records the key/value caches of the prompts: over the first `prefill_span` positions only, the caches
    # padded to the whole context (a short prompt's prefill need not run over all n_ctx positions).
    start = mtf.reduce_min(prompt_lengths)
    if incremental:
        prefill = kv_cache.DecodeState(kv_cache.PREFILL, cache_length=seq.size)
        span = prefill_span(cfg, options, seq)
        if span < seq.size:
            gpt.logits(mtf.slice(tokens, 0, span, seq.name), cfg,
                       dataclasses.replace(dims, sequence=mtf.Dimension(seq.name, span)), train=False, cache=prefill)
            # The steps write each position's keys and values before they read them, so the cache is right
            # whatever the span if the loop starts no later than just past it: a prompt longer than the span is
            # fed token by token, as longer prompts than the shortest always are.
            start = mtf.minimum(start, span + 1)
        else:
            gpt.logits(tokens, cfg, dims, train=False, cache=prefill)
        caches = prefill.new_states
    else:
        gpt.logits(tokens, cfg, dims, train=False)
        caches = []

    limit = mtf.minimum(prompt_lengths + draw.max_new_tokens, seq.size)  # per row: end of its new tokens
    end = mtf.reduce_max(limit)
    done = mtf.cast(mtf.greater_equal(prompt_lengths, limit), tf.int32)  # rows whose prompt fills the context
    lengths = prompt_lengths

    def cond(position, tokens_, done_, lengths_, *caches_):
        return mtf.logical_and(mtf.less(position, end), mtf.less(mtf.reduce_min(done_), 1))

    def body(position, tokens_, done_, lengths_, *caches_):
        if incremental:
            state = kv_cache.DecodeState(kv_cache.STEP, position, caches_)
            step_logits = gpt.logits(mtf.gather(tokens_, position - 1, seq), cfg, dims, train=False, cache=state)
            new_caches = state.new_states
        else:
            step_logits = mtf.gather(gpt.logits(tokens_, cfg, dims, train=False), position - 1, seq)
            new_caches = []
        new = choose_tokens(step_logits, seeds, position, dims, options, draw)
        in_prompt = mtf.less(position, prompt_lengths)
        active = mtf.logical_and(mtf.logical_not(in_prompt), mtf.equal(done_, 0))
        value = mtf.where(in_prompt, mtf.gather(tokens_, position, seq),
                          mtf.where(active, new, mtf.zeros_like(new) + options.padding_id))
        write = mtf.one_hot(position, seq, dtype=tf.int32)
        tokens_ = tokens_ * (1 - write) + value * write
        lengths_ = mtf.where(active, mtf.zeros_like(lengths_) + position + 1, lengths_)
        finished = mtf.greater_equal(position + 1, limit)
        if options.stop_id != NO_STOP:  # not a program for rows that never stop
            finished = mtf.logical_or(finished, mtf.equal(new, draw.stop_id))
        if options.stop_ids:
            finished = mtf.logical_or(finished, is_one_of(new, options.stop_ids))
        done_ = mtf.maximum(done_, mtf.cast(mtf.logical_and(active, finished), tf.int32))
        return [position + 1, tokens_, done_, lengths_] + list(new_caches)

    outputs = mtf.while_loop(cond, body, [start, tokens, done, lengths] + list(caches))
    tokens, lengths = outputs[1], outputs[3]
    if options.remove_partial_sequences:
        tokens = mtf.dynamic_shift(tokens, -prompt_lengths, seq, wrap=False)
        lengths = lengths - prompt_lengths
    filled = mtf.less(mtf.range(mesh, seq, tf.int32), lengths)
    tokens = mtf.where(filled, tokens, mtf.zeros_like(tokens) + options.padding_id)
    return {"tokens": tokens, "lengths": lengths}
