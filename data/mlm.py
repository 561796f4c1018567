"""Masked language modelling (BERT-style) inputs: masking of token batches as a pure TensorFlow function.

`mask_tokens(tokens, cfg, step)` turns a batch of token windows into (masked inputs, labels):

* with `mlm_cls_token_id`, the window becomes [CLS] + its first n_ctx - 1 tokens;
* each token that may be masked (not padding, not CLS, not in `mlm_mask_ignore_ids`) is chosen with
  probability `mlm_mask_prob`; of the chosen, `mlm_random_token_prob` become a random token (never an id
  that is not maskable, nor the mask id), `mlm_same_token_prob` stay as they are, the rest become
  `mlm_mask_id`;
* labels are the original tokens at chosen positions and `padding_id` everywhere else, which the loss
  ignores (models/gpt.py).

Every draw is a stateless function of (seed, step, position), so a batch is masked the same way on every
run, mesh layout and resume. `mask_dataset` applies it to the batches of an input pipeline, numbering them
from the step the pipeline starts at.
"""
from __future__ import annotations

import tensorflow as tf

from schema import GPTConfig

# Independent streams of randomness for the three draws.
_CHOOSE, _REPLACE_KIND, _RANDOM_TOKEN = 1, 2, 3


def mask_tokens(tokens: tf.Tensor, cfg: GPTConfig, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """tokens [batch, n_ctx] (or [batch, n_ctx + 1]: the extra label column of an LM pipeline is dropped)
    -> (inputs, labels), both [batch, n_ctx] int32."""
    tokens = tf.cast(tokens, tf.int32)[:, :cfg.n_ctx]
    if cfg.mlm_cls_token_id is not None:
        cls = tf.fill([tf.shape(tokens)[0], 1], tf.constant(cfg.mlm_cls_token_id, tf.int32))
        tokens = tf.concat([cls, tokens[:, :cfg.n_ctx - 1]], axis=1)
    shape = tf.shape(tokens)
    step = tf.cast(step, tf.int64)

    def uniform(stream):
        return tf.random.stateless_uniform(shape, seed=tf.stack([tf.constant(cfg.seed, tf.int64) * 8 + stream, step]))

    unmaskable = unmaskable_ids(cfg)
    maskable = tf.reduce_all(tf.not_equal(tokens[..., None], tf.constant(unmaskable, tf.int32)), axis=-1)
    chosen = tf.logical_and(maskable, uniform(_CHOOSE) < cfg.mlm_mask_prob)

    # One draw decides what a chosen token becomes: [0, random) a random token, [random, random + same) itself,
    # the rest the mask token.
    kind = uniform(_REPLACE_KIND)
    to_random = kind < cfg.mlm_random_token_prob
    to_mask = kind >= cfg.mlm_random_token_prob + cfg.mlm_same_token_prob

    allowed = tf.constant([t for t in range(cfg.n_vocab) if t not in set(unmaskable) | {cfg.mlm_mask_id}], tf.int32)
    pick = tf.random.stateless_uniform(shape, seed=tf.stack([tf.constant(cfg.seed, tf.int64) * 8 + _RANDOM_TOKEN, step]),
                                       minval=0, maxval=tf.size(allowed), dtype=tf.int32)
    random_tokens = tf.gather(allowed, pick)

    inputs = tf.where(chosen & to_random, random_tokens, tokens)
    inputs = tf.where(chosen & to_mask, tf.fill(shape, tf.constant(cfg.mlm_mask_id, tf.int32)), inputs)
    labels = tf.where(chosen, tokens, tf.fill(shape, tf.constant(cfg.padding_id, tf.int32)))
    return inputs, labels


def unmaskable_ids(cfg: GPTConfig) -> list[int]:
    """Token ids never chosen for masking (nor drawn as random replacements): padding, CLS, the ignore list."""
    ids = {cfg.padding_id, *cfg.mlm_mask_ignore_ids}
    if cfg.mlm_cls_token_id is not None:
        ids.add(cfg.mlm_cls_token_id)
    return sorted(ids)


def mask_dataset(dataset: tf.data.Dataset, cfg: GPTConfig, first_step: int = 0) -> tf.data.Dataset:
    """The batches of an LM pipeline ((inputs, labels) or bare token batches), masked for MLM training; the
    dataset unchanged when cfg.mlm_training is off. Batch i is masked with step first_step + i."""
    if not cfg.mlm_training:
        return dataset

    def mask(step, batch):
        tokens = batch[0] if isinstance(batch, (tuple, list)) else batch
        return mask_tokens(tokens, cfg, step)

    # plain TensorFlow, traced without AutoGraph's rewrite as data/inputs.py's pipeline functions are
    return dataset.enumerate(start=first_step).map(tf.autograph.experimental.do_not_convert(mask))
