"""Estimator glue: the mesh-tensorflow model_fn for train / eval / predict, run by TPUEstimator.

On GPUs and CPUs (use_tpu=False) the mesh is a placement mesh over the listed devices; with --tpu it is
mesh-tensorflow's SIMD mesh over the TPU's cores, as in GPT-Neo. Checkpoints hold the master copy of
every variable under its GPT-Neo name; MtfCheckpointSaverListener / MtfRestoreHook move values between
the masters and the per-device slices.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf
from tensorflow.compat.v1 import estimator as tf_estimator

from engine import cluster as cluster_lib, flops, tpu
from engine import train_step
from engine.optimizer import apply_gradients, learning_rate, updates_then_step
from engine import inference
from models import gpt
from models.config import GPTConfig

LOSS_COLLECTION = "gpt_loss"
TRAIN, EVAL, PREDICT = tf_estimator.ModeKeys.TRAIN, tf_estimator.ModeKeys.EVAL, tf_estimator.ModeKeys.PREDICT


@dataclass(frozen=True)
class Placement:
    """Where the mesh runs: a list of devices (placement mesh) or a TPU (SIMD mesh).

    Across hosts (engine/cluster.py) the devices are /job:worker/task:T/... names, `master` is the chief's
    server, master variables are spread over `hosts` (each host's CPU) and ops placed nowhere else run on
    `default_device` (the chief's CPU)."""
    devices: tuple = ()
    tpu: Optional[str] = None
    master: Optional[str] = None
    hosts: tuple = ()
    default_device: Optional[str] = None

    @property
    def use_tpu(self) -> bool:
        return self.tpu is not None


def _mesh_impl(cfg: GPTConfig, placement: Placement, params: dict):
    shape = mtf.convert_to_shape(cfg.mesh_shape)
    layout = mtf.convert_to_layout_rules(cfg.layout)
    if not placement.use_tpu:
        placer = mtf.utils.BalancedVariablePlacer(list(placement.hosts)) if placement.hosts else None
        return mtf.placement_mesh_impl.PlacementMeshImpl(shape, layout, list(placement.devices)), placer
    return tpu.simd_mesh(cfg, params["context"])  # SIMD mesh over the TPU's cores (engine/tpu.py)


def _checkpoint_hooks(lowering: mtf.Lowering, cfg: GPTConfig, save: bool) -> list:
    hooks = [mtf.MtfRestoreHook(lowering)]
    if save:
        saver = tf.train.Saver(tf.global_variables(), sharded=True, max_to_keep=5, save_relative_paths=True,
                               keep_checkpoint_every_n_hours=2, defer_build=False)
        tf.add_to_collection(tf.GraphKeys.SAVERS, saver)
        hooks.append(tf.train.CheckpointSaverHook(cfg.model_path, save_steps=cfg.steps_per_checkpoint, saver=saver,
                                                  listeners=[mtf.MtfCheckpointSaverListener(lowering)]))
    return hooks


def make_model_fn(cfg: GPTConfig, placement: Placement, log_every: int = 10, peak_flops: float = 0.0) -> Callable:
    def model_fn(features, labels, mode, params):
        graph = mtf.Graph()
        mesh_impl, var_placer = _mesh_impl(cfg, placement, params)
        mesh = mtf.Mesh(graph, "gpt_mesh", var_placer)
        batch_size = params["batch_size"]
        dims = gpt.Dims.of(cfg, batch_size)
        token_shape = mtf.Shape([dims.batch, dims.sequence])

        if mode == PREDICT:  # sampling, or per-token scores for eval tasks (engine/inference.py)
            outputs = inference.predict_outputs(features, mesh, cfg, dims)
            lowering = mtf.Lowering(graph, {mesh: mesh_impl})
            predictions = {name: lowering.export_to_tf_tensor(t) for name, t in outputs.items()}
            predictions.update({k: v for k, v in features.items() if k not in predictions})  # pass the rest through
            return tf_estimator.tpu.TPUEstimatorSpec(mode, predictions=predictions,
                                                     prediction_hooks=_checkpoint_hooks(lowering, cfg, save=False))

        inputs = mtf.import_fully_replicated(mesh, tf.cast(features, tf.int32), token_shape, "inputs")
        targets = mtf.import_fully_replicated(mesh, tf.cast(labels, tf.int32), token_shape, "labels")
        train = mode == TRAIN
        if train:  # objective and gradients, over micro-batches with tokens_per_mb_per_replica
            losses, grads, variables = train_step.losses_and_gradients(inputs, targets, cfg, dims)
            global_step = tf.train.get_or_create_global_step()
            lr = learning_rate(cfg, global_step)
            mtf_lr = mtf.import_fully_replicated(mesh, lr, mtf.Shape([]), "lr")
            updates, grad_norm = apply_gradients(grads, variables, cfg, mtf_lr)
        else:
            losses = train_step.evaluation_losses(inputs, targets, cfg, dims)

        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
        tf_loss = tf.cast(lowering.export_to_tf_tensor(losses.cross_entropy), tf.float32)
        tf.add_to_collection(LOSS_COLLECTION, tf_loss)  # lets callers' hooks fetch the per-step loss

        if not train:  # the Estimator reports the mean of `loss` over the eval batches
            return tf_estimator.tpu.TPUEstimatorSpec(mode, loss=tf_loss,
                                                     evaluation_hooks=_checkpoint_hooks(lowering, cfg, save=False))

        train_op = updates_then_step([lowering.lowered_operation(op) for op in updates], global_step)
        tf_grad_norm = lowering.export_to_tf_tensor(grad_norm) if grad_norm is not None else tf.constant(0.0)
        hooks = _checkpoint_hooks(lowering, cfg, save=True)
        # The MoE load-balancing loss is part of the objective; logged beside the cross-entropy "loss".
        extras = {} if losses.moe_loss is None else {"moe_loss": lowering.export_to_tf_tensor(losses.moe_loss)}
        if not placement.use_tpu:
            tf.summary.scalar("loss", tf_loss)
            tf.summary.scalar("learning_rate", lr)
            tf.summary.scalar("grad_norm", tf_grad_norm)
            for name, value in extras.items():
                tf.summary.scalar(name, value)
            hooks.append(ProgressHook(cfg, tf_loss, lr, every=log_every, peak_flops=peak_flops, extras=extras))
        return tf_estimator.tpu.TPUEstimatorSpec(mode, loss=tf_loss, train_op=train_op, training_hooks=hooks)

    return model_fn


class ProgressHook(tf_estimator.SessionRunHook):
    """Prints step, loss, learning rate, steps/s, tokens/s, model FLOP/s, MFU and ETA every `every` steps,
    and writes the throughput numbers to TensorBoard beside the loss."""

    def __init__(self, cfg: GPTConfig, loss: tf.Tensor, lr: tf.Tensor, every: int, peak_flops: float,
                 extras: Optional[dict] = None):
        self.cfg, self.loss, self.lr, self.every, self.peak = cfg, loss, lr, max(1, every), peak_flops
        self.extras = extras or {}  # more scalars for the progress line, e.g. {"moe_loss": tensor}
        self.tokens_per_step = cfg.train_batch_size * cfg.n_ctx
        self.flops_per_token = flops.training_flops_per_token(cfg)
        self.history: list[tuple[int, float]] = []  # (step, loss), kept for callers and tests

    def begin(self):
        self._step = tf.train.get_global_step()
        self._writer = tf.summary.FileWriterCache.get(self.cfg.model_path)
        self._last_time, self._last_step = None, None

    def after_create_session(self, session, coord):
        # Count steps here: reading global_step in the same run as its increment is racy.
        self._global_step = int(session.run(self._step))

    def before_run(self, run_context):
        return tf_estimator.SessionRunArgs({"loss": self.loss, "lr": self.lr, **self.extras})

    def after_run(self, run_context, run_values):
        values = run_values.results
        self._global_step += 1
        step = self._global_step
        self.history.append((step, float(values["loss"])))
        now = time.time()
        if self._last_time is None:  # the first step includes graph building; do not time it
            self._last_time, self._last_step = now, step
            print(f"step {step:>6}/{self.cfg.train_steps} | loss {values['loss']:.4f}{self._extras(values)} | "
                  f"lr {values['lr']:.2e}", flush=True)
            return
        if step % self.every and step != self.cfg.train_steps:
            return
        steps = step - self._last_step
        elapsed = max(now - self._last_time, 1e-9)
        steps_per_s = steps / elapsed
        tokens_per_s = steps_per_s * self.tokens_per_step
        model_flops = tokens_per_s * self.flops_per_token
        mfu = f" | MFU {100 * model_flops / self.peak:.1f}%" if self.peak else ""
        eta = (self.cfg.train_steps - step) / steps_per_s if steps_per_s > 0 else math.inf
        print(f"step {step:>6}/{self.cfg.train_steps} | loss {values['loss']:.4f}{self._extras(values)} | "
              f"lr {values['lr']:.2e} | "
              f"{steps_per_s:.2f} steps/s | {tokens_per_s:,.0f} tok/s | {model_flops / 1e9:.2f} GFLOP/s{mfu} | "
              f"eta {_duration(eta)}", flush=True)
        summary = tf.Summary(value=[tf.Summary.Value(tag="tokens_per_sec", simple_value=tokens_per_s),
                                    tf.Summary.Value(tag="model_flops_per_sec", simple_value=model_flops)]
                             + ([tf.Summary.Value(tag="mfu", simple_value=model_flops / self.peak)] if self.peak else []))
        self._writer.add_summary(summary, step)
        self._last_time, self._last_step = now, step

    def _extras(self, values) -> str:
        return "".join(f" | {name} {values[name]:.4f}" for name in self.extras)

    def end(self, session):
        self._writer.flush()


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def make_estimator(cfg: GPTConfig, placement: Placement, log_every: int = 10,
                   peak_flops: float = 0.0) -> tf_estimator.tpu.TPUEstimator:
    session_config = tf.ConfigProto(allow_soft_placement=True,
                                    device_count={"CPU": max(1, sum("CPU" in d for d in placement.devices))})
    cluster = tpu.cluster_resolver(placement.tpu) if placement.use_tpu else None
    run_config = tf_estimator.tpu.RunConfig(
        cluster=cluster, master=placement.master, device_fn=cluster_lib.device_filler(placement.default_device),
        model_dir=cfg.model_path, tf_random_seed=cfg.seed, session_config=session_config,
        save_checkpoints_steps=None, save_checkpoints_secs=None,  # our CheckpointSaverHook saves
        save_summary_steps=log_every, log_step_count_steps=None, tpu_config=tpu.tpu_config(cfg))
    return tf_estimator.tpu.TPUEstimator(
        use_tpu=placement.use_tpu, model_fn=make_model_fn(cfg, placement, log_every, peak_flops), config=run_config,
        train_batch_size=cfg.train_batch_size, eval_batch_size=cfg.eval_batch_size,
        predict_batch_size=cfg.predict_batch_size)
