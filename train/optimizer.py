"""The update in a training step, as mesh-tensorflow operations: gradient clipping, the optimizer's assignments
(gated for float16's loss scaling), then the step increment.

The optimizers, the names of their slots in a checkpoint and the learning-rate schedule are registries of
models/optimizers.py (below the jobs, where the config check reads them; every job that opens a checkpoint needs
the slots' names, not only training)."""
from __future__ import annotations

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from schema import GPTConfig
from models.kernels.common import reduced_mesh_axes
from models.optimizers import make_optimizer


class SumOfSquares(mtf.Operation):
    """A tensor's sum of squares (fp32 scalar): on each device TF's L2Loss of its slice (Eigen's vectorized pass,
    one read), summed over the mesh axes that split the tensor. On the bench model's 82 gradients (23M floats,
    one AVX2 core) L2Loss took 10 ms of CPU where one product of each gradient with itself took 45 and XLA's
    reduce_sum(g * g) 31-41 (XLA's CPU reduction to a scalar is one serial chain of adds)."""

    def __init__(self, x: mtf.Tensor):
        super().__init__([x], name="sum_of_squares")
        self._outputs = [mtf.Tensor(self, mtf.Shape([]), tf.float32)]

    def gradient(self, grad_ys):
        raise ValueError("sum_of_squares is for the clipping's norm, not differentiated")

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        x = self.inputs[0]
        # l2_loss is half the sum of squares
        sums = mesh_impl.slicewise(lambda t: 2.0 * tf.nn.l2_loss(tf.cast(t, tf.float32)), lowering.tensors[x])
        axes = reduced_mesh_axes(mesh_impl, x.shape.dims)
        lowering.set_tensor_lowering(self.outputs[0], mtf.LazyAllreduceSum(mesh_impl, sums, axes) if axes else sums)


def sum_of_squares(g: mtf.Tensor) -> mtf.Tensor:
    """g's sum of squares, one read of g (SumOfSquares). Named so that a profile counts it as the clipping's
    (bench/profile_train.py)."""
    return SumOfSquares(g).outputs[0]


def clipping_scale(grads: list, clip_norm: float) -> tuple[mtf.Tensor, mtf.Tensor]:
    """(the factor that clips `grads` to a global norm of at most clip_norm, their global norm)."""
    norm = mtf.sqrt(mtf.add_n([sum_of_squares(g) for g in grads if g is not None]))
    return clip_norm / mtf.maximum(norm, clip_norm), norm


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
                    apply_if: mtf.Tensor | None = None, fused: bool = True):
    """Clips `grads` (one per variable) by global norm and returns (the optimizer's update ops, gradient norm
    or None without clipping). `apply_if` (a boolean mtf scalar; float16's loss scaling): the updates change
    no variable (weights, optimizer slots) when it is false. `fused` False (TPU meshes): an optimizer with a
    fused pass over all variables (models/optimizers.AdamWeightDecay) updates each variable on its own."""
    grads = [None if g is None else mtf.to_float(g) for g in grads]  # bf16 activations give bf16 gradients
    grad_norm = None
    optimizer = make_optimizer(cfg, lr, fused)
    if cfg.gradient_clipping:
        scale, grad_norm = clipping_scale(grads, cfg.gradient_clipping)
        if getattr(optimizer, "takes_gradient_scale", False):  # applied in the optimizer's own pass
            optimizer.gradient_scale = scale
        else:
            grads = [None if g is None else g * scale for g in grads]
    if apply_if is not None and getattr(optimizer, "takes_condition", False):  # gated in the optimizer's own pass
        optimizer.condition, apply_if = apply_if, None
    updates = optimizer.apply_grads(grads, variables)
    if apply_if is not None:
        updates = assign_if(updates, apply_if)
    return updates, grad_norm


def autostack_allowed(updates: list) -> bool:
    """Whether the step may be lowered with mesh-tensorflow's autostack, which on meshes of several devices
    combines small variables of one shape into one and rewrites its own Assign ops to match: only when every
    update is such an Assign. The fused Adam (models/optimizers.AdamUpdate) and float16's gated updates
    (AssignIf) name the variables themselves, which would no longer exist at lowering."""
    return all(isinstance(op, mtf.Assign) for op in updates)


def updates_then_step(updates: list, global_step: tf.Variable) -> tf.Operation:
    """The train op: the (lowered) updates, then the step increment. The updates read the step (learning-rate
    schedule, Adafactor's decay rate); unordered, some would see the incremented step, at random run to run."""
    with tf.control_dependencies(updates):
        return tf.group(updates + [tf.assign_add(global_step, 1)])
