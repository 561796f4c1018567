"""Choosing the next token from a row of logits, on TF tensors: temperature, entmax in place of the softmax,
top-k, top-p, then a Gumbel-max draw whose randomness is a stateless hash of (seed, row, position, token id), so
a fixed seed gives the same tokens on every run, layout and decoding path. models/sampling.py applies it on mesh
tensors inside its mtf loop, models/compiled_decoding.py inside its XLA program."""
from __future__ import annotations

import tensorflow.compat.v1 as tf

from models.entmax import entmax_tf

NEG_INF = -1e10
NO_STOP = -1  # a row's stop id when it has none (no token id is negative); both sampling loops test for it
_MASK32 = 0xFFFFFFFF


def _mul32(x: tf.Tensor, c: int) -> tf.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32), exact: each partial product stays below 2**48 (int64 ops
    only, which every device has kernels for)."""
    low = tf.bitwise.bitwise_and(x, 0xFFFF) * c
    high = tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, tf.constant(16, tf.int64)) * c, 0xFFFF)
    return tf.bitwise.bitwise_and(low + tf.bitwise.left_shift(high, tf.constant(16, tf.int64)), _MASK32)


def _hash32(state: tf.Tensor, value: tf.Tensor) -> tf.Tensor:
    """Mixes a 32-bit value into a 32-bit state (lowbias32 finaliser), as int64; elementwise, broadcasting."""
    shift = lambda x, n: tf.bitwise.right_shift(x, tf.constant(n, tf.int64))  # noqa: E731
    x = tf.bitwise.bitwise_xor(state, value)
    x = tf.bitwise.bitwise_xor(x, shift(x, 16))
    x = _mul32(x, 0x7FEB352D)
    x = tf.bitwise.bitwise_xor(x, shift(x, 15))
    x = _mul32(x, 0x846CA68B)
    return tf.bitwise.bitwise_xor(x, shift(x, 16))


def stateless_uniform(seeds: tf.Tensor, rows: tf.Tensor, position: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """Uniform (0, 1) noise [rows, vocab], a pure function of (seed, row, position, token id)."""
    as_u32 = lambda t: tf.bitwise.bitwise_and(tf.cast(t, tf.int64), _MASK32)  # noqa: E731
    state = _hash32(tf.constant(0x9E3779B9, tf.int64), as_u32(seeds))
    state = _hash32(state, as_u32(rows))
    state = _hash32(state, as_u32(position))[:, None]
    state = _hash32(state, tf.range(vocab_size, dtype=tf.int64)[None, :])
    state = _hash32(state, tf.constant(0x68E31DA4, tf.int64))
    # 24 high bits -> (0, 1), never exactly 0 or 1.
    return (tf.cast(tf.bitwise.right_shift(state, tf.constant(8, tf.int64)), tf.float32) + 0.5) / 2.0 ** 24


def choose_tokens_tf(logits: tf.Tensor, seeds: tf.Tensor, rows: tf.Tensor, position: tf.Tensor, options,
                     temperature: tf.Tensor, top_k: tf.Tensor, top_p: tf.Tensor) -> tf.Tensor:
    """logits [rows, vocab] float -> token ids [rows] int32, each row by its own temperature (0: greedy), top-k (0:
    none) and top-p (1: none), [rows] each, then Gumbel-max. `options` (models/sampling.SamplingOptions) gives
    what shapes the program: `entmax_alpha`, a temperature of 0 for a greedy program (the argmax alone), top_k 0
    and top_p 1 for one without filters (no sort).

    With `entmax_alpha` the draw is from entmax_α(logits / temperature) (models/entmax.py): the logits are
    replaced by its log-probabilities, NEG_INF outside its support, so no filter or draw can pick a token of
    probability 0, and top-p measures entmax's probabilities."""
    logits = tf.cast(logits, tf.float32)
    greedy = tf.argmax(logits, axis=-1, output_type=tf.int32)
    if options.temperature == 0:  # a greedy program (SamplingOptions.program): no noise, no filters
        return greedy
    drawn = temperature > 0
    vocab_size = logits.shape[-1]
    scaled = logits / tf.where(drawn, temperature, tf.ones_like(temperature))[:, None]
    if options.entmax_alpha is not None:
        probs = entmax_tf(scaled, options.entmax_alpha)
        scaled = tf.where(probs > 0, tf.math.log(probs), tf.fill(tf.shape(probs), NEG_INF))
    if not (options.top_k == 0 and options.top_p == 1.0):  # not a program without filters
        k = tf.where((top_k > 0) & (top_k < vocab_size), top_k, tf.fill(tf.shape(top_k), vocab_size))
        scaled = _filtered(scaled, k, top_p)
    gumbel = -tf.math.log(-tf.math.log(stateless_uniform(seeds, rows, position, vocab_size)))
    return tf.where(drawn, tf.argmax(scaled + gumbel, axis=-1, output_type=tf.int32), greedy)


def _filtered(logits: tf.Tensor, k: tf.Tensor, top_p: tf.Tensor) -> tf.Tensor:
    """`logits` with NEG_INF outside each row's k most likely tokens (ties at the k-th kept; k = vocab: all), then
    outside the fewest most likely of those whose probability reaches top_p (the most likely always kept; 1: all),
    from one sort of each row."""
    ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
    kth = tf.gather(ordered, k - 1, axis=-1, batch_dims=1)[:, None]
    ordered = tf.where(ordered < kth, tf.fill(tf.shape(ordered), NEG_INF), ordered)  # top-k's logits, sorted
    mass_before = tf.cumsum(tf.nn.softmax(ordered, axis=-1), axis=-1, exclusive=True)
    kept = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    threshold = tf.reduce_min(tf.where(kept, ordered, tf.fill(tf.shape(ordered), -NEG_INF)), axis=-1, keepdims=True)
    return tf.where((logits < kth) | (logits < threshold), tf.fill(tf.shape(logits), NEG_INF), logits)


def is_one_of_tf(ids: tf.Tensor, values: tuple) -> tf.Tensor:
    """Where `ids` is one of `values` (one comparison against all of them, however many)."""
    return tf.reduce_any(tf.equal(ids[..., None], tf.constant(values, ids.dtype)), -1)
