"""Tiny models and data for tests: a config builder, random token batches, and a one-call trainer."""
from __future__ import annotations

import numpy as np
import tensorflow.compat.v1 as tf

from engine.estimator import LOSS_COLLECTION, Placement, make_estimator
from models.config import GPTConfig, config_from_dict

from conftest import CPU_DEVICES


def tiny_config(**overrides) -> GPTConfig:
    """2 layers (global then local), 32 wide, 4 heads, vocab 64, context 16, local window 4."""
    values = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, attention_types=[[["global", "local"], 1]],
                  local_attention_radius=4, train_batch_size=4, eval_batch_size=4, train_steps=4, lr=3e-3,
                  warmup_steps=0, steps_per_checkpoint=4, mesh_shape="all:1", layout="", z_loss=0.0)
    values.update(overrides)
    return config_from_dict(values, "test config")


def random_tokens(shape, vocab=64, seed=0) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, vocab, size=shape).astype(np.int32)


def devices_for(cfg: GPTConfig) -> list[str]:
    return CPU_DEVICES[:cfg.n_devices]


def fixed_batches_input_fn(data: np.ndarray, start_step: int = 0):
    """Cycles through rows of `data` ([rows, n_ctx + 1]) in order, so every layout sees the same batches;
    `start_step` skips the batches a resumed run has already seen."""
    def input_fn(params):
        batch = params["batch_size"]
        ds = tf.data.Dataset.from_tensor_slices((data[:, :-1], data[:, 1:]))
        return ds.repeat().batch(batch, drop_remainder=True).skip(start_step)
    return input_fn


def train(cfg: GPTConfig, data: np.ndarray, steps: int | None = None, start_step: int = 0):
    """Trains to global step `steps` (default train_steps); returns the losses of the steps it ran."""
    estimator = make_estimator(cfg, Placement(tuple(devices_for(cfg))), log_every=1000)
    recorder = []

    class Record(tf.estimator.SessionRunHook):
        def begin(self):
            self.loss = tf.get_default_graph().get_tensor_by_name(_loss_tensor_name())

        def before_run(self, run_context):
            return tf.estimator.SessionRunArgs(self.loss)

        def after_run(self, run_context, run_values):
            recorder.append(float(run_values.results))

    estimator.train(fixed_batches_input_fn(data, start_step), max_steps=steps or cfg.train_steps, hooks=[Record()])
    return recorder


def _loss_tensor_name() -> str:
    return tf.get_collection(LOSS_COLLECTION)[0].name
