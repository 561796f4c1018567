"""A mode's graph on a mesh, lowered to TF: the pieces every job's program shares.

Each job has one step function that takes TF input tensors, builds its mesh-tensorflow graph on a fresh
`new_mesh()`, lowers it with the given mesh implementation (`placement_mesh`: devices of CPUs and GPUs; or
devices/tpu.py's SIMD mesh; the placement's `mesh` gives the one it runs on) and returns a `Lowered`: the TF
tensors to run together with the lowering, whose copy ops move values between the master variables (which
checkpoints hold under GPT-Neo's names) and the per-device slices. They are train/step.py's training step,
evals/validation.py's evaluation loss and infer/outputs.py's PREDICT outputs, run by execution/runner.py.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import models  # noqa: F401  (mesh-tensorflow's compatibility alias, before mesh_tensorflow)
import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

try:  # TensorFlow's internals (2.20, 2.21): without them the slices keep mesh-tensorflow's unused initializers
    from tensorflow.python.ops.resource_variable_ops import UninitializedVariable
except ImportError:
    UninitializedVariable = None

from schema import GPTConfig
from models import gpt

MESH_NAME = "gpt_mesh"


@dataclass
class Lowered:
    """One mode's graph, lowered: `outputs` are TF tensors (scalars for train/eval, arrays for predict)."""
    lowering: mtf.Lowering
    outputs: dict
    train_op: Optional[tf.Operation] = None


def new_mesh(variable_placer=None) -> mtf.Mesh:
    return mtf.Mesh(mtf.Graph(), MESH_NAME, variable_placer)


def batch_size(tokens: tf.Tensor) -> int:
    if not tokens.shape.is_fully_defined():
        raise ValueError(f"token batches need a static shape, got {tokens.shape}: batch the dataset with "
                         f"drop_remainder=True")
    return int(tokens.shape[0])


def import_tokens(mesh: mtf.Mesh, dims: gpt.Dims, inputs: tf.Tensor, labels: tf.Tensor):
    shape = mtf.Shape([dims.batch, dims.sequence])
    return (mtf.import_fully_replicated(mesh, tf.cast(inputs, tf.int32), shape, "inputs"),
            mtf.import_fully_replicated(mesh, tf.cast(labels, tf.int32), shape, "labels"))


def placement_mesh(cfg: GPTConfig, placement):
    """(mtf.Mesh, PlacementMeshImpl) over a placement's devices, its master variables spread over its
    `variable_hosts` (devices/placement.py: this host's CPU for GPUs, every host's CPU for a cluster)."""
    hosts = placement.variable_hosts
    placer = mtf.utils.BalancedVariablePlacer(list(hosts)) if hosts else None
    impl = SlicedMeshImpl(mtf.convert_to_shape(cfg.mesh_shape), mtf.convert_to_layout_rules(cfg.layout),
                          list(placement.devices))
    return new_mesh(placer), impl


def _uninitialized(next_creator, **kwargs):
    """A variable without an initializer: a handle and its read, out of every collection (as mesh-tensorflow's
    slices are, `collections=[]`). Found there by identity, from the end where it was just added: `in` and
    `list.remove` compare with Variable.__eq__ (~0.1 ms a call in a graph), once per variable already in the
    collection; on a 2x2 mesh's tiny training step that was 76,320 calls, a third of its build."""
    shape = kwargs.get("shape") or kwargs.get("expected_shape")  # tf.Variable (a TPU's slices) names the latter
    variable = UninitializedVariable(name=kwargs["name"], shape=shape, dtype=kwargs["dtype"], trainable=False)
    for key in (tf.GraphKeys.GLOBAL_VARIABLES, tf.GraphKeys.TRAINABLE_VARIABLES):
        collection = tf.get_collection_ref(key)
        for i in range(len(collection) - 1, -1, -1):
            if collection[i] is variable:
                del collection[i]
                break
    return variable


def _bare_slices():
    """The scope a mesh's slice variables are made in: `_uninitialized`'s, where TensorFlow has the class."""
    return (tf.variable_creator_scope(_uninitialized) if UninitializedVariable is not None
            else contextlib.nullcontext())


class SlicedMeshImpl(mtf.placement_mesh_impl.PlacementMeshImpl):
    """mesh-tensorflow's placement mesh, its devices' slice variables made without an initializer. They are only
    ever assigned, from the masters (`copy_masters_to_slices`, which every session runs after restoring or
    initialising: execution/mesh_session.py), yet mesh-tensorflow made each with get_variable's default glorot
    initializer (a random-uniform chain, an assignment and an is-initialized check: 9 ops a slice, never run):
    2,846 of the 11,814 ops a tiny training step had on a 2x2 mesh (its build: 11.6-12.5 -> 9.6-10.0 CPU s with
    autograph off for the kernels, docs/speed.md). A slice read before the copy fails as uninitialized rather than
    holding random values."""

    class LaidOutVariable(mtf.placement_mesh_impl.PlacementMeshImpl.LaidOutVariable):
        def __init__(self, variable, mesh_impl):
            with _bare_slices():
                super().__init__(variable, mesh_impl)


class SlicedSimdMeshImpl(mtf.simd_mesh_impl.SimdMeshImpl):
    """mesh-tensorflow's SIMD mesh (a TPU's, devices/tpu.py), its cores' slice variables made as SlicedMeshImpl's
    are: mesh-tensorflow gave each a zeros initializer (an assignment and an is-initialized check) in a collection
    nothing reads, so never run either; every session fills the slices from the masters. A v3-512 pod has 512
    slices a weight: a one-layer model's training program there 63,941 -> 55,705 ops, 15.7 -> 12.1 CPU s."""

    class LaidOutVariable(mtf.simd_mesh_impl.SimdMeshImpl.LaidOutVariable):
        def __init__(self, variable, mesh_impl):
            with _bare_slices():
                super().__init__(variable, mesh_impl)
