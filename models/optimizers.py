"""The optimizers, as mesh-tensorflow optimizers, how each names its state in a checkpoint, and the
learning-rate schedule.

The config's `opt_name` names an entry of OPTIMIZERS and its `lr_decay` one of LR_DECAYS: a new optimizer or
decay is one entry there, and the config accepts every registered name (config.py checks them). An
optimizer's entry also says how its slot variables are named (`slot_patterns()`): every job that opens a
checkpoint (training, evaluation, prediction, export) passes those patterns to modelpath/checkpoints.check_fits.
Both registries sit here, below the jobs, because the config check does (config.py, which every job
may use); train/optimizer.py applies them in the update (clipping, the gated assignments)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from schema import GPTConfig
from models.kernels.common import compiled

# Norm gains/biases and other biases are not decayed (GPT-2/GPT-Neo practice).
NO_DECAY = [r"norm", r"ln_f", r"/b$", r"bias", r"o_b"]


def _adam_update(m, v, g, scale, beta_1, beta_2, epsilon):
    g = g * scale  # the gradient clipping's factor, applied here rather than in a pass of its own
    next_m = beta_1 * m + (1.0 - beta_1) * g
    next_v = beta_2 * v + (1.0 - beta_2) * (g * g)
    return next_m, next_v, next_m / (tf.sqrt(next_v) + epsilon)


@tf.function(jit_compile=True)
def _adam_step(m, v, g, w, scale, lr, beta_1, beta_2, epsilon):
    next_m, next_v, update = _adam_update(m, v, g, scale, beta_1, beta_2, epsilon)
    return w - lr * update, next_m, next_v


@tf.function(jit_compile=True)
def _adam_step_decayed(m, v, g, w, scale, lr, beta_1, beta_2, epsilon, decay):
    next_m, next_v, update = _adam_update(m, v, g, scale, beta_1, beta_2, epsilon)
    return w - lr * (update + decay * w), next_m, next_v


class MasterValue(mtf.Operation):
    """A variable's value as its slices hold it (float32 here: models/gpt.variable_dtype), where `var.value` is
    the activation-dtype copy the model reads (bf16 or fp16 under those precisions). An update computed from
    `var.value` and assigned to the variable rounds the fp32 master to the activation grid every step, so any
    update below half a bf16 ulp of its weight is lost; updates read this instead.

    Its input is the variable's output, so it is lowered after the variable, and it follows mesh-tensorflow's
    autostack: on a mesh of several devices small variables of one shape are combined into a StackedVariable
    whose unstack op then produces that output, and the value is then the variable's row of the stacked slices."""

    def __init__(self, var: mtf.Variable):
        super().__init__([var.outputs[0]], var.mesh, name="master_value")
        self._outputs = [mtf.Tensor(self, var.shape, var.slice_dtype)]

    def gradient(self, grad_ys):
        raise ValueError("a variable's master value is for updates, not differentiated")

    def lower(self, lowering):
        value = self.inputs[0]
        producer = value.operation
        if isinstance(producer, mtf.Variable):
            laid_out = lowering.variables[producer].laid_out_tensor
        elif (isinstance(producer, mtf.UnstackOperation)
              and isinstance(producer.inputs[0].operation, mtf.StackedVariable)):
            row = producer.outputs.index(value)
            stacked = lowering.variables[producer.inputs[0].operation].laid_out_tensor
            # tf.convert_to_tensor: on TPUs a slice is a ReplicatedVariable, which reads but does not index.
            laid_out = lowering.mesh_impl(self).slicewise(lambda s: tf.convert_to_tensor(s)[row], stacked)
        else:
            raise ValueError(f"master_value of {value}, which no variable produces")
        # Read the slices as values: the update's own assignment to the same variables comes after it.
        lowering.set_tensor_lowering(self.outputs[0],
                                     lowering.mesh_impl(self).slicewise(tf.identity, laid_out))


def master_value(var: mtf.Variable) -> mtf.Tensor:
    """`var`'s slices' value (fp32), for an optimizer's update: see MasterValue."""
    return MasterValue(var).outputs[0]


class AdamWeightDecay(mtf.optimize.AdamWeightDecayOptimizer):
    """mesh-tensorflow's Adam with decoupled weight decay (same slots, names and formula: m, v, m / (sqrt(v) +
    eps) + decay * w, times lr; tests/models/test_optimizers.py compares the two), computed for each variable in one
    XLA-fused pass that reads the gradient, the weight and the slots once and yields the new weight, m and v,
    instead of a dozen element-wise ops over every parameter. It takes the gradient clipping's factor
    (`gradient_scale`, a scalar set by train/optimizer.py) into the same pass. The weight is read from and
    written to its float32 slices (master_value): under bf16 or fp16 activations the model reads a rounded copy,
    but every update, however small against its weight, lands on the fp32 master."""

    takes_gradient_scale = True  # train/optimizer.py: the clipping factor goes to `gradient_scale`, not the grads

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gradient_scale = None  # an mtf scalar, or None: 1

    def apply_grad(self, grad, var):
        if grad is None:
            tf.logging.warning("Gradient is None for variable %s", var.name)
            return []
        grad = mtf.to_float(grad)
        m = mtf.get_variable(var.mesh, var.name + "/adam_m", var.shape, initializer=tf.zeros_initializer(),
                             trainable=False)
        v = mtf.get_variable(var.mesh, var.name + "/adam_v", var.shape, initializer=tf.zeros_initializer(),
                             trainable=False)
        scale = self.gradient_scale if self.gradient_scale is not None else \
            mtf.ones(var.mesh, mtf.Shape([]), tf.float32)
        # The weight from its fp32 slices, not `var.value` (the activation-dtype copy): see MasterValue.
        inputs = [m, v, grad, master_value(var), scale, self.learning_rate]
        hyper = [self.beta_1, self.beta_2, self.epsilon]
        if self._do_use_weight_decay(var.name):
            fn = lambda *a: compiled(_adam_step_decayed, *a, *hyper, self.weight_decay_rate)  # noqa: E731
        else:
            fn = lambda *a: compiled(_adam_step, *a, *hyper)  # noqa: E731
        next_w, next_m, next_v = mtf.slicewise(fn, inputs, output_shape=[var.shape] * 3,
                                               output_dtype=[tf.float32] * 3, splittable_dims=var.shape.dims,
                                               grad_function=0, name="adam")
        return [mtf.assign(var, next_w), mtf.assign(m, next_m), mtf.assign(v, next_v)]


def _adam(cfg: GPTConfig, lr: mtf.Tensor) -> mtf.optimize.Optimizer:
    # Slots are named `<var>/adam_m|adam_v` (its entry's slot_pattern), which HF's GPT-Neo loader knows to skip.
    return AdamWeightDecay(learning_rate=lr, weight_decay_rate=cfg.weight_decay, beta_1=cfg.beta1,
                           beta_2=cfg.beta2, epsilon=cfg.epsilon, exclude_from_weight_decay=NO_DECAY)


def _adafactor(cfg: GPTConfig, lr: mtf.Tensor) -> mtf.optimize.Optimizer:
    # mesh-tensorflow's: the update is relative to each weight's scale; weight_decay is Adam's only. Its slots
    # are `<var>_slot_v|vr|vc|m` (its entry's slot_pattern).
    return mtf.optimize.AdafactorOptimizer(learning_rate=lr, beta1=cfg.beta1, epsilon1=cfg.ada_epsilon1,
                                           epsilon2=cfg.ada_epsilon2)


@dataclass(frozen=True)
class Optimizer:
    """One registered optimizer: how it is made, and how its slot variables are named in a checkpoint."""
    make: Callable[[GPTConfig, mtf.Tensor], mtf.optimize.Optimizer]  # (cfg, learning rate) -> the optimizer
    # a regular expression matching a slot's whole name, whose group `variable` is its variable's; None: no slots
    slot_pattern: Optional[str] = None


# opt_name -> its entry.
OPTIMIZERS = {
    "adam": Optimizer(_adam, r"(?P<variable>.+)/adam_[mv]"),
    "adafactor": Optimizer(_adafactor, r"(?P<variable>.+)_slot_(?:v|vr|vc|m)"),
}


def slot_patterns() -> dict[str, str]:
    """opt_name -> its slot names' pattern, for every registered optimizer with slots: what a job opening a
    checkpoint passes to modelpath/checkpoints.check_fits, which tells any optimizer's state in a checkpoint apart
    from the model's variables, and a checkpoint of one optimizer opened for training with another."""
    return {name: entry.slot_pattern for name, entry in OPTIMIZERS.items() if entry.slot_pattern}


def make_optimizer(cfg: GPTConfig, lr: mtf.Tensor) -> mtf.optimize.Optimizer:
    return OPTIMIZERS[cfg.opt_name].make(cfg, lr)


# lr_decay name -> the fraction of lr at progress p (0 at the start, 1 at lr_decay_end) of a config: 1 down to 0.1.
LR_DECAYS = {
    "cosine": lambda p, cfg: 0.1 + 0.9 * 0.5 * (1.0 + tf.cos(3.141592653589793 * p)),
    "linear": lambda p, cfg: 1.0 - 0.9 * p,
    # Warmup-stable-decay (Hägele et al. 2024): lr until the last lr_decay_share of the run, then linearly to the
    # same floor. A run cut from it at any step of its stable phase and decayed on its own is a run of that length.
    "wsd": lambda p, cfg: 1.0 - 0.9 * tf.clip_by_value((p - (1.0 - cfg.lr_decay_share)) / cfg.lr_decay_share,
                                                       0.0, 1.0),
}


def learning_rate(cfg: GPTConfig, global_step: tf.Tensor) -> tf.Tensor:
    """Linear warmup from 0 to lr, then the lr_decay schedule down to 10% of lr at lr_decay_end."""
    step = tf.cast(global_step, tf.float32)
    decay_end = float(cfg.lr_decay_end or cfg.train_steps)
    progress = tf.minimum(step / max(decay_end, 1.0), 1.0)
    decayed = cfg.lr * LR_DECAYS[cfg.lr_decay](progress, cfg)
    if cfg.warmup_steps > 0:
        warmup = cfg.lr * step / float(cfg.warmup_steps)
        return tf.where(step < cfg.warmup_steps, warmup, decayed)
    return decayed
