"""The PREDICT graph, shared by the Estimator (--predict, eval tasks), the SavedModel export and direct runs.

`predict_outputs` turns a dict of features into mesh-tensorflow outputs:

* sampling: {"tokens" [batch, n_ctx], "prompt_length" [batch], optional "seed" [batch]}
  -> {"tokens", "lengths"} (see models/sampling.py);
* scoring (eval tasks): {"tokens" [batch, n_ctx], "targets" [batch, n_ctx]}
  -> {"token_loss": per-position cross-entropy, "token_correct": 1 where the argmax is the target}.

`run_predict` runs that graph once in a plain session on a placement mesh, from a checkpoint or from the
seeded initial weights (tests, benchmarks and tools use it; --predict goes through the Estimator).
"""
from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
import numpy as np
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
    batch = mtf.Shape([dims.batch])
    lengths = mtf.import_fully_replicated(mesh, tf.cast(features["prompt_length"], tf.int32), batch, "prompt_length")
    seed = features.get("seed")
    if seed is None:
        seed = tf.fill([dims.batch.size], default_seed(cfg))
    seeds = mtf.import_fully_replicated(mesh, tf.cast(seed, tf.int32), batch, "seed")
    return sampling.sample(tokens, lengths, seeds, cfg, dims, options or sampling.SamplingOptions.from_config(cfg))


def run_predict(cfg: GPTConfig, features: dict, devices: list[str], checkpoint: Optional[str] = None,
                options: Optional[sampling.SamplingOptions] = None) -> dict:
    """numpy features (batch = their first dimension) -> numpy outputs of `predict_outputs`.

    `checkpoint` is a checkpoint prefix or a model directory (its latest checkpoint); without one the
    variables take their seeded initial values.
    """
    features = {k: np.asarray(v) for k, v in features.items()}
    batch_size = features["tokens"].shape[0]
    if checkpoint and tf.io.gfile.isdir(checkpoint):
        checkpoint = tf.train.latest_checkpoint(checkpoint)
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "gpt_mesh")
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mtf.convert_to_shape(cfg.mesh_shape), mtf.convert_to_layout_rules(cfg.layout), devices)
        dims = gpt.Dims.of(cfg, batch_size)
        outputs = predict_outputs({k: tf.constant(v) for k, v in features.items()}, mesh, cfg, dims, options)
        lowering = mtf.Lowering(mtf_graph, {mesh: impl})
        fetches = {name: lowering.export_to_tf_tensor(t) for name, t in outputs.items()}
        masters = tf.global_variables()
        copy_to_slices = lowering.copy_masters_to_slices()
        session_config = tf.ConfigProto(device_count={"CPU": max(1, sum("CPU" in d for d in devices))},
                                        allow_soft_placement=True)
        with tf.Session(config=session_config) as session:
            session.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
            if checkpoint:
                tf.train.Saver(var_list=masters).restore(session, checkpoint)
            session.run(copy_to_slices)
            return session.run(fetches)
