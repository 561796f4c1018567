"""Learning-rate schedule, gradient clipping and the optimizer, as mesh-tensorflow operations.

The config's `opt_name` and `lr_decay` name entries of OPTIMIZERS and LR_DECAYS: a new optimizer or decay is
one entry there, and the config accepts every registered name (cli/config_loading.py checks them). An
optimizer's entry also says how its slots are named in a checkpoint (`slot_patterns()`, which the jobs pass to
runtime/checkpoints.check_fits)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from config.schema import GPTConfig
from models.kernels.common import compiled

# Norm gains/biases and other biases are not decayed (GPT-2/GPT-Neo practice).
NO_DECAY = [r"norm", r"ln_f", r"/b$", r"bias", r"o_b"]


# lr_decay name -> the fraction of lr at progress p (0 at the start, 1 at lr_decay_end): 1 down to 0.1.
LR_DECAYS = {
    "cosine": lambda p: 0.1 + 0.9 * 0.5 * (1.0 + tf.cos(3.141592653589793 * p)),
    "linear": lambda p: 1.0 - 0.9 * p,
}


def learning_rate(cfg: GPTConfig, global_step: tf.Tensor) -> tf.Tensor:
    """Linear warmup from 0 to lr, then the lr_decay schedule down to 10% of lr at lr_decay_end."""
    step = tf.cast(global_step, tf.float32)
    decay_end = float(cfg.lr_decay_end or cfg.train_steps)
    progress = tf.minimum(step / max(decay_end, 1.0), 1.0)
    decayed = cfg.lr * LR_DECAYS[cfg.lr_decay](progress)
    if cfg.warmup_steps > 0:
        warmup = cfg.lr * step / float(cfg.warmup_steps)
        return tf.where(step < cfg.warmup_steps, warmup, decayed)
    return decayed


def clip_by_global_norm(grads: list, clip_norm: float) -> tuple[list, mtf.Tensor]:
    squares = [mtf.reduce_sum(mtf.square(g)) for g in grads if g is not None]
    norm = mtf.sqrt(mtf.add_n(squares))
    scale = clip_norm / mtf.maximum(norm, clip_norm)
    return [None if g is None else g * scale for g in grads], norm


def _adam_update(m, v, g, lr, beta_1, beta_2, epsilon):
    next_m = beta_1 * m + (1.0 - beta_1) * g
    next_v = beta_2 * v + (1.0 - beta_2) * (g * g)
    return next_m, next_v, next_m / (tf.sqrt(next_v) + epsilon)


@tf.function(jit_compile=True)
def _adam_step(m, v, g, lr, beta_1, beta_2, epsilon):
    next_m, next_v, update = _adam_update(m, v, g, lr, beta_1, beta_2, epsilon)
    return lr * update, next_m, next_v


@tf.function(jit_compile=True)
def _adam_step_decayed(m, v, g, w, lr, beta_1, beta_2, epsilon, decay):
    next_m, next_v, update = _adam_update(m, v, g, lr, beta_1, beta_2, epsilon)
    return lr * (update + decay * w), next_m, next_v


class AdamWeightDecay(mtf.optimize.AdamWeightDecayOptimizer):
    """mesh-tensorflow's Adam with decoupled weight decay (same slots, names and formula: m, v, m / (sqrt(v) +
    eps) + decay * w, times lr; tests/test_optimizer.py compares the two), computed for each variable in one
    XLA-fused pass that yields the step and the new m and v, instead of a dozen element-wise ops over every
    parameter (a fifth of the non-matmul time of a step on the benchmark model). The decay term is in float32:
    mesh-tensorflow's adds a bfloat16 variable value to the float32 update, which fails."""

    def apply_grad(self, grad, var):
        if grad is None:
            tf.logging.warning("Gradient is None for variable %s", var.name)
            return []
        grad = mtf.to_float(grad)
        m = mtf.get_variable(var.mesh, var.name + "/adam_m", var.shape, initializer=tf.zeros_initializer(),
                             trainable=False)
        v = mtf.get_variable(var.mesh, var.name + "/adam_v", var.shape, initializer=tf.zeros_initializer(),
                             trainable=False)
        hyper = [self.beta_1, self.beta_2, self.epsilon]
        if self._do_use_weight_decay(var.name):
            inputs = [m, v, grad, mtf.to_float(var.value), self.learning_rate]
            fn = lambda m_, v_, g_, w_, lr_: compiled(  # noqa: E731
                _adam_step_decayed, m_, v_, g_, w_, lr_, *hyper, self.weight_decay_rate)
        else:
            inputs = [m, v, grad, self.learning_rate]
            fn = lambda m_, v_, g_, lr_: compiled(_adam_step, m_, v_, g_, lr_, *hyper)  # noqa: E731
        step, next_m, next_v = mtf.slicewise(fn, inputs, output_shape=[var.shape] * 3,
                                             output_dtype=[tf.float32] * 3, splittable_dims=var.shape.dims,
                                             grad_function=0, name="adam")
        return [mtf.assign_sub(var, step), mtf.assign(m, next_m), mtf.assign(v, next_v)]


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
    checkpoint passes to runtime/checkpoints.check_fits, which tells any optimizer's state in a checkpoint apart
    from the model's variables, and a checkpoint of one optimizer opened for training with another."""
    return {name: entry.slot_pattern for name, entry in OPTIMIZERS.items() if entry.slot_pattern}


def make_optimizer(cfg: GPTConfig, lr: mtf.Tensor) -> mtf.optimize.Optimizer:
    return OPTIMIZERS[cfg.opt_name].make(cfg, lr)


class AssignIf(mtf.Operation):
    """An mtf.Assign (the optimizer's update of some variables) that changes them only when the boolean scalar
    `condition` is true: each slice is assigned its new value, or left as it is (an update by 0, or its own
    value). The update is computed either way; a non-finite value that is not applied does no harm."""

    def __init__(self, assign: mtf.Assign, condition: mtf.Tensor):
        if assign.assign_fn not in (mtf.assign_slice, mtf.assign_add_slice, mtf.assign_sub_slice):
            raise ValueError(f"cannot gate the assignment function {assign.assign_fn}")
        super().__init__(assign.inputs + [condition], assign.variables[0].mesh, name="assign_if")
        self._variables, self._assign_fn, self._outputs = assign.variables, assign.assign_fn, []

    def _gated(self, variable, slice_variable, value_and_condition):
        value, condition = value_and_condition
        if self._assign_fn is mtf.assign_slice:
            kept = tf.cast(slice_variable, value.dtype)
        else:
            kept = tf.zeros_like(value)
        return self._assign_fn(variable, slice_variable, tf.where(condition, value, kept))

    def lower(self, lowering):
        condition = lowering.tensors[self.inputs[-1]].to_laid_out_tensor().all_slices
        ops = []
        for var, value in zip(self._variables, self.inputs[:-1]):
            values = lowering.tensors[value].to_laid_out_tensor().all_slices
            ops.append(lowering.variables[var].assign_to_slices(self._gated, list(zip(values, condition))))
        lowering.operations[self] = tf.group(ops)


def assign_if(updates: list, condition: mtf.Tensor) -> list:
    """The optimizer's (combined) mtf.Assign updates, each replaced by an AssignIf on `condition`: the
    Assigns leave the mesh graph, as mtf.Graph.combine_assignments removes those it combines."""
    gated = [AssignIf(op, condition) for op in updates]
    operations = condition.graph.operations  # the graph's own list (what combine_assignments edits)
    replaced = set(updates)
    operations[:] = [op for op in operations if op not in replaced]
    return gated


def apply_gradients(grads: list, variables: list, cfg: GPTConfig, lr: mtf.Tensor,
                    apply_if: mtf.Tensor | None = None):
    """Clips `grads` (one per variable) by global norm and returns (the optimizer's update ops, gradient norm
    or None without clipping). `apply_if` (a boolean mtf scalar; float16's loss scaling): the updates change
    no variable (weights, optimizer slots) when it is false."""
    grads = [None if g is None else mtf.to_float(g) for g in grads]  # bf16 activations give bf16 gradients
    grad_norm = None
    if cfg.gradient_clipping:
        grads, grad_norm = clip_by_global_norm(grads, cfg.gradient_clipping)
    updates = make_optimizer(cfg, lr).apply_grads(grads, variables)
    if apply_if is not None:
        updates = assign_if(updates, apply_if)
    return updates, grad_norm


def updates_then_step(updates: list, global_step: tf.Variable) -> tf.Operation:
    """The train op: the (lowered) updates, then the step increment. The updates read the step (learning-rate
    schedule, Adafactor's decay rate); unordered, some would see the incremented step, at random run to run."""
    with tf.control_dependencies(updates):
        return tf.group(updates + [tf.assign_add(global_step, 1)])
