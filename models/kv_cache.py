"""Incremental decoding: a key/value cache threaded through `gpt.logits`, as mesh-tensorflow's incremental
context (and GPT-Neo's sampler) does it.

Sampling runs the model twice over:

* once in **prefill** mode over the `[batch, sequence]` token tensor, or over its first `prefill_length`
  positions (models/sampling.py): the pass is the ordinary one, and every attention layer also records its keys
  and values, renamed to `[batch, memory_length, heads, features_per_head]` and padded with zeros to
  `cache_length` (n_ctx), in `state.new_states`;
* then once per new token in **step** mode: the tokens are `[batch]` (the token at `position - 1`), each
  attention layer takes its (k, v) cache from `state.states` in layer order, writes this token's key and value
  at `position - 1`, attends from this one query over the cache and records the updated cache.

Each attention layer also keeps its q, k and v weights stacked (`[embd, qkv, heads]`, recorded in prefill before
its caches, taken and passed on unchanged by every step) so that a step's three projections are one
matrix-vector product without stacking the weights anew on every token.

A step costs one token's projections and MLPs plus one query against a fixed-size `n_ctx` cache, so the cost
per new token does not grow with the prompt (a full recompute costs the whole context per token).

Attention types opt in through their registry entry's `decode_window` (models/attention.py). A model with any
layer type or option without an incremental path is decoded by full recompute instead
(`models.attention.incremental_unsupported`).
"""
from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels import decode
from models.kernels.common import MASKED
from schema import GPTConfig, dimension_is_split

PREFILL, STEP = "prefill", "step"

# Options that change only per-position computation (norms, feed-forward, output projection, the position
# table's contents), so one token's step is the same computation as its position in a full pass.
# Any other model option (schema.py's option() fields) is decoded by full recompute: rotary positions
# and memory key/values change attention, and mesh-tensorflow's MoE routes groups of a whole sequence (the
# reference recomputed for MoE too). Attention types say for themselves (models/attention.py, decode_window).
INCREMENTAL_SAFE_OPTIONS = {"mlp_glu", "scalenorm", "rezero", "macaron", "share_parameters", "no_weight_tie",
                            "axial_pos_emb"}


class DecodeState:
    """What one pass of `gpt.logits` needs to know about decoding; see the module docstring."""

    def __init__(self, mode: str, position: Optional[mtf.Tensor] = None, states=(), cache_length: Optional[int] = None):
        if mode not in (PREFILL, STEP):
            raise ValueError(f"mode must be {PREFILL!r} or {STEP!r}, got {mode!r}")
        if mode == STEP and position is None:
            raise ValueError("step mode needs the position whose logits are computed")
        self.mode = mode
        self.position = position
        self.cache_length = cache_length  # prefill: the caches' memory length (default: the prefill's length)
        self.states = list(states)
        self.new_states: list = []
        self._next = 0
        self._biases: dict = {}

    @property
    def incremental(self) -> bool:
        """True in step mode: tokens are [batch] and attention reads the cache."""
        return self.mode == STEP

    def visibility_bias(self, window: Optional[int], memory_length: mtf.Dimension) -> mtf.Tensor:
        """Step: [memory_length] float32, 0 where the query at position - 1 may attend, MASKED elsewhere (later
        positions; with a `window`, those `window` or more before it). The same for every layer of one window, so
        it is built once per window and step (six small ops per layer otherwise: 0.15 of 7.1 ms a token on the bench
        model)."""
        key = (window, memory_length)
        if key not in self._biases:
            query_pos = self.position - 1
            memory_pos = mtf.range(self.position.mesh, memory_length, tf.int32)
            hidden = mtf.greater(memory_pos, query_pos)  # the future
            if window is not None:
                hidden = mtf.logical_or(hidden, mtf.less_equal(memory_pos, query_pos - window))
            # float32 as the logits (MASKED is -inf in float16; 0 * -inf is NaN)
            self._biases[key] = mtf.cast(hidden, tf.float32) * MASKED
        return self._biases[key]

    def take(self, count: int) -> list:
        taken = self.states[self._next:self._next + count]
        if len(taken) != count:
            raise ValueError("the decode state holds fewer caches than the model has attention layers")
        self._next += count
        return taken

    def record(self, *tensors: mtf.Tensor) -> None:
        self.new_states.extend(tensors)


def record_prefill(state: DecodeState, k: mtf.Tensor, v: mtf.Tensor, sequence: mtf.Dimension,
                   memory_length: mtf.Dimension) -> None:
    """Prefill: keep this layer's keys and values for the step passes, laid out [batch, heads, memory_length, kv]
    (each step's query is [batch, heads, kv], so its products with the cache are batched matrix-vector ones), in
    buffers of their own: the steps write into them in place (DecodeStepAttentionOperation,
    models/kernels/decode.py)."""
    def as_cache(x):
        x = mtf.replace_dimensions(x, sequence, memory_length)
        if state.cache_length is not None and state.cache_length > memory_length.size:  # a prefill shorter than
            # the context: zeros after it, masked from every step until that step has written its position
            x = mtf.pad(x, [0, state.cache_length - memory_length.size], memory_length.name)
        rest = [d for d in x.shape.dims if d.name not in (memory_length.name, "features_per_head")]
        kv = x.shape.get_dim_by_name("features_per_head")
        memory = x.shape.get_dim_by_name(memory_length.name)
        return decode.private_copy(mtf.transpose(x, rest + [memory, kv]))
    state.record(as_cache(k), as_cache(v))


def attend_step(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor, window: Optional[int], cfg: GPTConfig,
                state: DecodeState, kv: mtf.Dimension) -> mtf.Tensor:
    """Step: q, k, v [batch, heads, kv] of the token at position - 1 -> attention output [batch, heads, kv].

    Writes k and v into this layer's cache at position - 1, then attends over the cache positions the query
    may see: all earlier ones for global attention, the last `radius` (itself included) for local attention.
    Cache entries after position - 1 hold prefill values of later prompt tokens or padding; they are masked
    here and overwritten before they become visible.
    """
    if not (window is None or isinstance(window, int)):
        raise ValueError(f"a kv-cache step needs a window (or None for all positions), got {window!r}")
    k_cache, v_cache = state.take(2)
    memory_length = k_cache.shape.get_dim_by_name("memory_length")
    query_pos = state.position - 1
    bias = state.visibility_bias(window, memory_length)
    out, k_cache, v_cache = decode.decode_step_attention(
        q, k, v, k_cache, v_cache, bias, query_pos, memory_length, kv,
        memory_split=dimension_is_split(cfg, memory_length.name),
        kv_split=dimension_is_split(cfg, kv.name), window=window)
    state.record(k_cache, v_cache)
    return out
