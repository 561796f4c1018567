"""The PREDICT graph, shared by --predict, the eval tasks, the SavedModel export and the benchmarks.

`predict_outputs` turns a dict of features into mesh-tensorflow outputs:

* sampling: {"tokens" [batch, n_ctx], "prompt_length" [batch], optional "seed" [batch]}
  -> {"tokens", "lengths"} (see models/sampling.py);
* scoring (eval tasks): {"tokens" [batch, n_ctx], "targets" [batch, n_ctx]}
  -> {"token_loss": per-position cross-entropy, "token_correct": 1 where the argmax is the target};
* logits: {"tokens" [batch, n_ctx]} -> {"logits" [batch, n_ctx, n_vocab]} (float32).

engine/runner.py's `predict` runs it over batches of rows from a checkpoint (or the seeded initial weights).
"""
from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models import gpt, sampling
from models.config import GPTConfig


def default_seed(cfg: GPTConfig) -> int:
    return cfg.sampling_seed if cfg.sampling_seed is not None else cfg.seed


def predict_outputs(features: dict, mesh: mtf.Mesh, cfg: GPTConfig, dims: gpt.Dims,
                    options: Optional[sampling.SamplingOptions] = None) -> dict:
    """tf features -> {name: mtf.Tensor}; see the module docstring."""
    token_shape = mtf.Shape([dims.batch, dims.sequence])
    tokens = mtf.import_fully_replicated(mesh, tf.cast(features["tokens"], tf.int32), token_shape, "tokens")
    if "targets" in features:
        targets = mtf.import_fully_replicated(mesh, tf.cast(features["targets"], tf.int32), token_shape, "targets")
        logits = gpt.logits(tokens, cfg, dims, train=False)
        loss = mtf.layers.softmax_cross_entropy_with_logits(logits, targets, dims.vocab)
        correct = mtf.cast(mtf.equal(mtf.argmax(logits, dims.vocab), targets), tf.int32)
        return {"token_loss": loss, "token_correct": correct}
    if "prompt_length" not in features:
        return {"logits": gpt.logits(tokens, cfg, dims, train=False)}
    batch = mtf.Shape([dims.batch])
    lengths = mtf.import_fully_replicated(mesh, tf.cast(features["prompt_length"], tf.int32), batch, "prompt_length")
    seed = features.get("seed")
    if seed is None:
        seed = tf.fill([dims.batch.size], default_seed(cfg))
    seeds = mtf.import_fully_replicated(mesh, tf.cast(seed, tf.int32), batch, "seed")
    return sampling.sample(tokens, lengths, seeds, cfg, dims, options or sampling.SamplingOptions.from_config(cfg))
