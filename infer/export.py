"""`main.py --export`: a SavedModel that serves generation and logits for token inputs.

The graph is the PREDICT graph of infer/outputs.py on a one-device mesh (mesh-tensorflow then reads the
master variables directly, so the SavedModel's variables are the checkpoint's model weights, whatever layout
trained them). Shapes are static, as mesh-tensorflow needs: the batch is `predict_batch_size` (or
`batch_size`), the length n_ctx. Sampling options (temperature, top_k, top_p, stop token, max_new_tokens,
remove_partial_sequences, kv cache) are fixed at export from the config; the seed is an input.

Signatures (load with `tf.saved_model.load(path).signatures[name]`):

* `serving_default` (also `generate`): tokens int32 [batch, n_ctx] (prompt then padding), prompt_length int32
  [batch] (>= 1), seed int32 [batch] -> tokens int32 [batch, n_ctx], lengths int32 [batch]; the same
  outputs as `--predict` for the same rows and seeds (its .jsonl records each row's seed).
* `logits`: tokens int32 [batch, n_ctx] -> logits float32 [batch, n_ctx, n_vocab].

Beside the model, `assets.extra/` holds `gpt_config.json` (the config used; its `precision` is the one the
graph computes in, never "auto") and the tokenizer file if the config names a local one.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from modelpath import checkpoints
from execution import meshes, runner
from devices import precision
from infer import outputs as inference
from devices.placement import Placement
from config import replace
from models import gpt
from schema import ConfigError, GPTConfig
from models.optimizers import slot_patterns


def _config_json(cfg: GPTConfig) -> dict:
    def plain(value):
        if dataclasses.is_dataclass(value):
            return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return {f.name: plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def export_saved_model(cfg: GPTConfig, checkpoint: str, export_dir: str, batch_size: Optional[int] = None) -> str:
    """Writes the SavedModel of `checkpoint` (a prefix or a model directory) to export_dir; returns it."""
    if tf.io.gfile.isdir(checkpoint):
        found = checkpoints.restorable(checkpoint)
        if not found:
            raise ConfigError(f"no checkpoint in {checkpoint} to export: train first")
        checkpoint = found
    if os.path.exists(export_dir):
        raise ConfigError(f"{export_dir} already exists: remove it or pass another --export_dir")
    checkpoints.check_writable(os.path.dirname(os.path.abspath(export_dir)),
                               "make it writable, or pass --export_dir to write the SavedModel elsewhere")
    batch = batch_size or cfg.predict_batch_size
    one_device = replace(cfg, mesh_shape="all:1", layout="")

    def step(mesh, impl, features):  # generation and logits on one mesh, lowered together
        dims = gpt.Dims.of(one_device, batch)
        generated = inference.predict_outputs(features, mesh, one_device, dims)
        mtf_tokens = mtf.import_fully_replicated(mesh, features["tokens"], mtf.Shape([dims.batch, dims.sequence]),
                                                 "logit_tokens")
        logits = gpt.logits(mtf_tokens, one_device, dims, train=False)
        lowering = mtf.Lowering(mesh.graph, {mesh: impl})
        return meshes.Lowered(lowering, {
            "tokens": tf.identity(lowering.export_to_tf_tensor(generated["tokens"]), name="out_tokens"),
            "lengths": tf.identity(lowering.export_to_tf_tensor(generated["lengths"]), name="out_lengths"),
            "logits": tf.identity(lowering.export_to_tf_tensor(logits), name="out_logits")})

    # One device with no device name: mesh-tensorflow computes on the master variables themselves.
    inputs = runner.Fed({"tokens": (tf.int32, [batch, cfg.n_ctx]), "prompt_length": (tf.int32, [batch]),
                         "seed": (tf.int32, [batch])})
    program = runner.Program(one_device, Placement(devices=("",)), step, inputs)
    graph, features, outputs = program.graph, inputs.placeholders, program.lowered.outputs
    with graph.as_default():
        info = tf.saved_model.utils.build_tensor_info
        generate = tf.saved_model.signature_def_utils.build_signature_def(
            inputs={name: info(features[name]) for name in ("tokens", "prompt_length", "seed")},
            outputs={"tokens": info(outputs["tokens"]), "lengths": info(outputs["lengths"])},
            method_name=tf.saved_model.signature_constants.PREDICT_METHOD_NAME)
        logits_signature = tf.saved_model.signature_def_utils.build_signature_def(
            inputs={"tokens": info(features["tokens"])}, outputs={"logits": info(outputs["logits"])},
            method_name=tf.saved_model.signature_constants.PREDICT_METHOD_NAME)
    # The session compares the checkpoint with this graph (a checkpoint of another model is an error) before the
    # builder makes export_dir; a write that fails removes the half-written export.
    with program.open(checkpoint, slot_patterns(), finalize=False, saves=False) as session:
        try:
            with graph.as_default():  # every model variable must be in the checkpoint (restored, not initialised)
                builder = tf.saved_model.Builder(export_dir)
                builder.add_meta_graph_and_variables(
                    session.session, [tf.saved_model.tag_constants.SERVING], saver=session.saver,
                    strip_default_attrs=True,
                    signature_def_map={"serving_default": generate, "generate": generate, "logits": logits_signature})
                builder.save()
            extra = os.path.join(export_dir, "assets.extra")
            os.makedirs(extra, exist_ok=True)
            with open(os.path.join(extra, "gpt_config.json"), "w") as f:
                json.dump(dict(_config_json(cfg), precision=precision.running(cfg), export_batch_size=batch,
                               checkpoint=os.path.basename(checkpoint)), f, indent=1, default=str)
            dataset = cfg.tokenizer_dataset
            if (dataset and dataset.tokenizer_path and not dataset.tokenizer_is_pretrained
                    and os.path.isfile(dataset.tokenizer_path)):
                shutil.copy(dataset.tokenizer_path, os.path.join(extra, os.path.basename(dataset.tokenizer_path)))
        except (OSError, tf.errors.OpError) as e:
            shutil.rmtree(export_dir, ignore_errors=True)
            raise checkpoints.CheckpointError(f"could not write the SavedModel to {export_dir} "
                                              f"({checkpoints.reason(e)}); nothing was kept there: free space, or pass "
                                              f"--export_dir to write it elsewhere") from e
    return export_dir
