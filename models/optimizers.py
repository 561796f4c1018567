"""The optimizers, as mesh-tensorflow optimizers, how each names its state in a checkpoint, and the
learning-rate schedule.

The config's `opt_name` names an entry of OPTIMIZERS and its `lr_decay` one of LR_DECAYS: a new optimizer or
decay is one entry there, and the config accepts every registered name (config.py checks them). An
optimizer's entry also says how its slot variables are named (`slot_patterns()`): every job that opens a
checkpoint (training, evaluation, prediction, export) passes those patterns to modelpath/checkpoints.check_fits.
Both registries sit here, below the jobs, because the config check does (config.py, which every job
may use); train/optimizer.py applies them in the update (clipping, the gated assignments)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from schema import GPTConfig
from models.kernels import traces
from models.kernels.common import xla_function, xla_kernels

# Norm gains/biases and other biases are not decayed (GPT-2/GPT-Neo practice).
NO_DECAY = [r"norm", r"ln_f", r"/b$", r"bias", r"o_b"]


def _adam_values(weights, ms, vs, grads, lr, scale, apply, beta_1, beta_2, epsilon, decays):
    """Adam with decoupled weight decay on the slices of every variable of one device, each weight, slot and
    gradient read once: the new weights, m and v. mesh-tensorflow's formula (next_m = b1 m + (1 - b1) g,
    next_v = b2 v + (1 - b2) g^2, w -= lr (next_m / (sqrt(next_v) + eps) + decay w)), with g the gradient times
    the clipping's `scale`. `apply` (a boolean scalar, or None): float16's loss scaling, where a step whose
    gradients were not finite leaves every variable as it was. The weights are the fp32 slices (the masters),
    never the activation-dtype copy the model reads."""
    new_w, new_m, new_v = [], [], []
    for w, m, v, g, decay in zip(weights, ms, vs, grads, decays):
        # tf.convert_to_tensor: a read, also of a TPU slice (a ReplicatedVariable, which has no read_value)
        w_, m_, v_ = (tf.convert_to_tensor(s) for s in (w, m, v))
        g = tf.cast(g, tf.float32) * scale  # the clipping's factor applied here, not in a pass of its own
        next_m = beta_1 * m_ + (1.0 - beta_1) * g
        next_v = beta_2 * v_ + (1.0 - beta_2) * (g * g)
        update = next_m / (tf.sqrt(next_v) + epsilon)
        next_w = w_ - lr * (update + decay * w_ if decay else update)
        if apply is not None:
            next_w, next_m, next_v = (tf.where(apply, new, old) for new, old in
                                      ((next_w, w_), (next_m, m_), (next_v, v_)))
        new_w.append(next_w), new_m.append(next_m), new_v.append(next_v)
    return new_w, new_m, new_v


def _adam_pass(weights, ms, vs, grads, lr, scale, apply, beta_1, beta_2, epsilon, decays) -> list:
    """_adam_values' new weights and slots assigned where they are (the assignments, returned)."""
    new_w, new_m, new_v = _adam_values(weights, ms, vs, grads, lr, scale, apply, beta_1, beta_2, epsilon, decays)
    assigns = []
    for w, m, v, next_w, next_m, next_v in zip(weights, ms, vs, new_w, new_m, new_v):
        assigns += [w.assign(next_w, read_value=False), m.assign(next_m, read_value=False),
                    v.assign(next_v, read_value=False)]
    return assigns


def _adam_compiled(weights, ms, vs, grads, lr, scale, apply, beta_1, beta_2, epsilon, decays) -> tf.Operation:
    """`_adam_pass` as one XLA-compiled call (the op to depend on: the assignments run inside it). Its trace is
    kept on disk (models/kernels/traces.py): tracing the pass costs a build ~0.2 s for a tiny model and ~1.5 s at
    GPT-Neo 125M's 481 variables, reading it back a few milliseconds."""
    n, scaled, gated = len(weights), isinstance(scale, tf.Tensor), apply is not None
    flat = [*weights, *ms, *vs, *grads, lr] + ([scale] if scaled else []) + ([apply] if gated else [])

    def make_function():
        @xla_function
        def _adam_compiled(*flat):  # named as before: the kernel's name in the graph and XLA's cache
            w, m, v, g = (list(flat[i * n:(i + 1) * n]) for i in range(4))
            _adam_pass(w, m, v, g, flat[4 * n], flat[4 * n + 1] if scaled else scale, flat[-1] if gated else None,
                       beta_1, beta_2, epsilon, decays)
            return (tf.constant(0.0),)  # an output for the caller to depend on
        return _adam_compiled
    (done,) = traces.call(make_function, flat, ("adam", n, scaled, gated, scale if not scaled else None,
                                                 beta_1, beta_2, epsilon, decays))
    return done.op


class AdamUpdate(mtf.Operation):
    """The Adam step of every variable at once: on each device one pass (`_adam_pass`) over that device's slices
    of all of them, XLA-compiled where the kernels are (models/kernels/common.xla_kernels), which reads each
    fp32 slice (the master the checkpoint holds, never the bf16/fp16 copy the model reads), its slots and its
    gradient once and assigns the weight and slots in place (XLA updates a resource variable in its own
    buffer). One launch per device and step where a pass per variable made one per variable and new weight and
    slot buffers (docs/measured.md). TPU meshes (SimdMeshImpl) do not use it: there XLA compiles the whole
    replicated step anyway, and AdamWeightDecay updates each variable on its own so that autostack may combine
    them (docs/tpus.md); plain ops where it is lowered on one.

    It names the variables themselves, so mesh-tensorflow's autostack (which combines small variables of one shape
    on meshes of several devices, rewriting only its own Assign ops) must stay off where it runs
    (train/optimizer.autostack_allowed)."""

    def __init__(self, optimizer: "AdamWeightDecay", variables: list, slots: list, grads: list,
                 scale: Optional[mtf.Tensor], apply_if: Optional[mtf.Tensor]):
        extra = [t for t in (scale, apply_if) if t is not None]
        super().__init__(list(grads) + [optimizer.learning_rate] + extra, variables[0].mesh, name="adam")
        self._variables, self._slots, self._n = variables, slots, len(variables)
        self._scaled, self._gated = scale is not None, apply_if is not None
        self._hyper = (float(optimizer.beta_1), float(optimizer.beta_2), float(optimizer.epsilon))
        self._decays = tuple(float(optimizer.weight_decay_rate) if optimizer._do_use_weight_decay(v.name) else 0.0
                             for v in variables)
        self._outputs = []

    @property
    def variables(self) -> list:
        """Every variable the op assigns: the weights, then their m and v slots."""
        return self._variables + [s for pair in self._slots for s in pair]

    def gradient(self, grad_ys):
        raise ValueError("Adam's update is not differentiated")

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)

        def slices(t):
            return lowering.tensors[t].to_laid_out_tensor().all_slices

        def variable_slices(var):
            if var not in lowering.variables:
                raise ValueError(f"{var.name} was combined by mesh-tensorflow's autostack, which the fused Adam "
                                 f"cannot update: lower the step with autostack off (train/optimizer.autostack_allowed)")
            return lowering.variables[var].laid_out_tensor.all_slices

        n = self._n
        grads = [slices(g) for g in self.inputs[:n]]
        lr = slices(self.inputs[n])
        scale = slices(self.inputs[n + 1]) if self._scaled else None
        apply = slices(self.inputs[-1]) if self._gated else None
        weights = [variable_slices(v) for v in self._variables]
        ms = [variable_slices(m) for m, _ in self._slots]
        vs = [variable_slices(v) for _, v in self._slots]
        placed = isinstance(mesh_impl, mtf.placement_mesh_impl.PlacementMeshImpl)
        ops = []
        for p in range(len(lr)):
            args = ([w[p] for w in weights], [m[p] for m in ms], [v[p] for v in vs], [g[p] for g in grads], lr[p],
                    scale[p] if scale else 1.0, apply[p] if apply else None, *self._hyper, self._decays)
            with tf.device(mesh_impl.devices[p]) if placed else contextlib.nullcontext():
                if placed and xla_kernels():
                    ops.append(_adam_compiled(*args))
                else:
                    ops.append(tf.group(_adam_pass(*args)))
        lowering.operations[self] = tf.group(ops)


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
    eps) + decay * w, times lr; tests/models/test_optimizers.py compares the two), as one AdamUpdate over every
    variable: per device one XLA-compiled pass that reads each fp32 weight slice, its slots and its gradient once
    and assigns the new weight and slots in place, instead of a dozen element-wise ops (or one pass and three
    new buffers) per variable. It takes the gradient clipping's factor (`gradient_scale`, a scalar set by
    train/optimizer.py) and float16's gate (`condition`: the step applies only where the gradients were finite)
    into the same pass. The weight is read from and written to its float32 slices: under bf16 or fp16
    activations the model reads a rounded copy, but every update, however small against its weight, lands on
    the fp32 master."""

    takes_gradient_scale = True  # train/optimizer.py: the clipping factor goes to `gradient_scale`, not the grads
    takes_condition = True  # and float16's gate to `condition`, not train/optimizer.AssignIf

    def __init__(self, *args, fused: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.gradient_scale = None  # an mtf scalar, or None: 1
        self.condition = None  # a boolean mtf scalar, or None: always applied
        # False on TPU meshes (train/step.py): there XLA compiles the whole replicated step, so one pass gains
        # nothing, and the fused op's autostack off made a v3-512 GPT-3 13B graph 2.9x slower to build
        # (docs/tpus.md): each variable gets its own update (mtf.Assign), which autostack may combine.
        self.fused = fused

    def apply_grads(self, grads, variables) -> list:
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        for g, v in zip(grads, variables):
            if g is None:
                tf.logging.warning("Gradient is None for variable %s", v.name)
        if not pairs:
            return []
        if not self.fused:
            return self._per_variable(pairs)
        # the slots as mesh-tensorflow's optimizer names them (`<var>/adam_m|adam_v`, fp32, zeros)
        slots = [tuple(mtf.get_variable(v.mesh, v.name + slot, v.shape, initializer=tf.zeros_initializer(),
                                        trainable=False).operation for slot in ("/adam_m", "/adam_v"))
                 for _, v in pairs]
        return [AdamUpdate(self, [v for _, v in pairs], slots, [mtf.to_float(g) for g, _ in pairs],
                           self.gradient_scale, self.condition)]

    def _per_variable(self, pairs) -> list:
        """The same update as mtf.Assign ops, one slicewise step per variable, reading each weight's fp32 master
        (master_value, which also reads a row of an autostacked variable)."""
        if self.condition is not None:
            raise ValueError("the per-variable Adam takes no condition (float16's gate): float16 is refused on TPUs")
        scale = self.gradient_scale
        updates = []
        for grad, var in pairs:
            m = mtf.get_variable(var.mesh, var.name + "/adam_m", var.shape, initializer=tf.zeros_initializer(),
                                 trainable=False)
            v = mtf.get_variable(var.mesh, var.name + "/adam_v", var.shape, initializer=tf.zeros_initializer(),
                                 trainable=False)
            decay = float(self.weight_decay_rate) if self._do_use_weight_decay(var.name) else 0.0
            hyper = (float(self.beta_1), float(self.beta_2), float(self.epsilon))

            def step(m_, v_, g, w_, lr, factor=None, decay=decay, hyper=hyper):
                (next_w,), (next_m,), (next_v,) = _adam_values([w_], [m_], [v_], [g], lr,
                                                               1.0 if factor is None else factor, None,
                                                               *hyper, (decay,))
                return next_w, next_m, next_v

            inputs = [m, v, mtf.to_float(grad), master_value(var), self.learning_rate]
            inputs += [scale] if scale is not None else []
            next_w, next_m, next_v = mtf.slicewise(step, inputs, output_shape=[var.shape] * 3,
                                                   output_dtype=[tf.float32] * 3, splittable_dims=var.shape.dims,
                                                   grad_function=0, name="adam")
            updates += [mtf.assign(var, next_w), mtf.assign(m, next_m), mtf.assign(v, next_v)]
        # One grouped Assign for all of them, as mesh-tensorflow's optimizers return: autostack combines only
        # variables assigned by the same Assign ops, so separate ones would leave every variable unstacked.
        return pairs[0][1].graph.combine_assignments(updates)

    def apply_grad(self, grad, var):
        return self.apply_grads([grad], [var])


def _adam(cfg: GPTConfig, lr: mtf.Tensor, fused: bool) -> mtf.optimize.Optimizer:
    # Slots are named `<var>/adam_m|adam_v` (its entry's slot_pattern), which HF's GPT-Neo loader knows to skip.
    return AdamWeightDecay(learning_rate=lr, weight_decay_rate=cfg.weight_decay, beta_1=cfg.beta1,
                           beta_2=cfg.beta2, epsilon=cfg.epsilon, exclude_from_weight_decay=NO_DECAY, fused=fused)


def _adafactor(cfg: GPTConfig, lr: mtf.Tensor, fused: bool) -> mtf.optimize.Optimizer:
    # mesh-tensorflow's: the update is relative to each weight's scale; weight_decay is Adam's only. Its slots
    # are `<var>_slot_v|vr|vc|m` (its entry's slot_pattern). It has no fused pass: `fused` chooses nothing.
    return mtf.optimize.AdafactorOptimizer(learning_rate=lr, beta1=cfg.beta1, epsilon1=cfg.ada_epsilon1,
                                           epsilon2=cfg.ada_epsilon2)


@dataclass(frozen=True)
class Optimizer:
    """One registered optimizer: how it is made, and how its slot variables are named in a checkpoint."""
    # (cfg, learning rate, fused) -> the optimizer; `fused` False (TPU meshes): one with a fused pass over all
    # variables updates each on its own instead (an optimizer without such a pass ignores it)
    make: Callable[[GPTConfig, mtf.Tensor, bool], mtf.optimize.Optimizer]
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


def make_optimizer(cfg: GPTConfig, lr: mtf.Tensor, fused: bool = True) -> mtf.optimize.Optimizer:
    """cfg's optimizer (opt_name) at learning rate `lr`; `fused` as its entry's `make` takes it."""
    return OPTIMIZERS[cfg.opt_name].make(cfg, lr, fused)


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
    decay_end = float(cfg.lr_decay_end_step)
    progress = tf.minimum(step / max(decay_end, 1.0), 1.0)
    decayed = cfg.lr * LR_DECAYS[cfg.lr_decay](progress, cfg)
    if cfg.warmup_steps > 0:
        warmup = cfg.lr * step / float(cfg.warmup_steps)
        return tf.where(step < cfg.warmup_steps, warmup, decayed)
    return decayed
