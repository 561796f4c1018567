"""The PREDICT graph, shared by --predict, the eval tasks, the SavedModel export and the benchmarks.

`predict_outputs` turns a dict of features into mesh-tensorflow outputs:

* sampling: {"tokens" [batch, n_ctx], "prompt_length" [batch], optional "seed" [batch], each drawn option
  (models/sampling.DRAWN: "temperature", "top_k", "top_p", "max_new_tokens", "stop_id" [batch], fed by
  infer/run.Predictor; where absent, the sampling options' value for every row) and "draw_row" [batch] (each
  row's id in the draw's noise; where absent, its place in the batch)}
  -> {"tokens", "lengths"} (see models/sampling.py);
* scoring (eval tasks): {"tokens" [batch, n_ctx], "targets" [batch, n_ctx]}
  -> {"token_loss": per-position cross-entropy, "token_correct": 1 where the argmax is the target};
* logits: {"tokens" [batch, n_ctx]} -> {"logits" [batch, n_ctx, n_vocab]} (float32).

Scoring and logits rows may be shorter than n_ctx (the harness scores short requests so): the graph is built
for the rows' length, and a causal model's outputs at a position do not depend on the positions after it.

`predictions` lowers them on a mesh; infer/run.py's `predict` runs that over batches of rows from a
checkpoint (or the seeded initial weights).
"""
from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models import gpt, sampling
from execution import meshes
from schema import GPTConfig


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
    options = options or sampling.SamplingOptions.from_config(cfg)
    draw = sampling.Draw.of(features, options, mesh, dims.batch)
    if options.max_new_tokens is not None:  # not yet a program's options (infer/run.Predictor makes those)
        options = options.program(options.draw_rows(1))
    return sampling.sample(tokens, lengths, seeds, cfg, dims, options, draw)


def predictions(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl, features: dict, options=None,
                gather: bool = False) -> meshes.Lowered:
    """predict_outputs for the features (sampling, scoring or logits), lowered: TF tensors.

    gather: make each output whole on every device first (mtf.anonymize), which the TPU's SIMD mesh needs to
    hand a tensor out; a placement mesh assembles the slices itself."""
    dims = gpt.Dims.of(cfg, meshes.batch_size(features["tokens"]), int(features["tokens"].shape[1]))
    outputs = predict_outputs(features, mesh, cfg, dims, options)
    if gather:
        outputs = {name: mtf.anonymize(t) for name, t in outputs.items()}
    lowering = mtf.Lowering(mesh.graph, {mesh: mesh_impl})
    return meshes.Lowered(lowering, {name: lowering.export_to_tf_tensor(t) for name, t in outputs.items()})
