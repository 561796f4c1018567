"""--tpu NAME (or --tpu colab): mesh-tensorflow's SIMD mesh under TPUEstimator, as GPT-Neo runs on TPUs.

The pieces, each testable without a TPU (tests/test_scale.py builds TF's own TPU context on fake pod
topologies):

* `cluster_resolver_argument`: the name passed to TPUClusterResolver (None for Colab, which finds its TPU
  from the runtime's environment).
* `tpu_config`: one replica per core (num_cores_per_replica=1, num_shards = the mesh's size, which
  TPUEstimator checks against the cores it finds), `iterations` steps per loop on the device, and the
  input pipeline BROADCAST: the input_fn runs once, on the first host, with the global batch, and each core
  takes the slice of it the layout gives it (mesh-tensorflow's import_fully_replicated).
* `variable_placer`: master variables spread over the TPU hosts' CPUs, with the first host (which also
  caches the compiled program, 300 MB per replica) counted as already holding that much.
* `logical_to_physical`: which physical core each logical mesh position uses, from the pod's topology
  (mesh-tensorflow's auto_logical_to_physical_tpu, which keeps the last mesh dimension on neighbouring cores
  so its all-reduces are cheap), falling back to the lexicographic order where that function has no answer.
* `simd_mesh_arguments` / `simd_mesh`: SimdMeshImpl(mesh shape, layout, device assignment, that mapping).
"""
from __future__ import annotations

import math
from typing import Optional

import mesh_tensorflow as mtf
from tensorflow.compat.v1 import estimator as tf_estimator

from models.config import ConfigError, GPTConfig

REPLICA_CACHE_BYTES = 300_000_000  # per replica, held by the first host (GPT-Neo's estimate)


def cluster_resolver_argument(tpu: str) -> Optional[str]:
    """--tpu colab -> None (TPUClusterResolver finds Colab's TPU itself); anything else is the TPU's name
    (or grpc:// address)."""
    if not tpu:
        raise ConfigError("--tpu needs the TPU's name (or 'colab')")
    return None if tpu == "colab" else tpu


def cluster_resolver(tpu: str):
    import tensorflow.compat.v1 as tf
    return tf.distribute.cluster_resolver.TPUClusterResolver(cluster_resolver_argument(tpu))


def tpu_config(cfg: GPTConfig) -> tf_estimator.tpu.TPUConfig:
    return tf_estimator.tpu.TPUConfig(
        iterations_per_loop=cfg.iterations, num_shards=cfg.n_devices, num_cores_per_replica=1,
        per_host_input_for_training=tf_estimator.tpu.InputPipelineConfig.BROADCAST)


def _mtf_flags_ready() -> None:
    """mesh-tensorflow's simd_mesh_impl reads absl flags (logical_cores_per_chip, fold_xy); this program
    parses its own arguments, so mark absl's as parsed to use their defaults instead of failing."""
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def logical_to_physical(mesh_sizes: list, physical_shape: list, device_assignment=None) -> list:
    """A permutation of range(cores): logical mesh position -> physical core, for a pod whose topology
    mesh_shape is physical_shape ([x, y, z, cores_per_chip])."""
    _mtf_flags_ready()
    cores = math.prod(physical_shape)
    if math.prod(mesh_sizes) != cores:
        raise ConfigError(f"mesh_shape has {math.prod(mesh_sizes)} devices but the TPU has {cores} cores "
                          f"(topology {list(physical_shape)}): make the mesh's sizes multiply to {cores}")
    try:
        mapping = mtf.simd_mesh_impl.auto_logical_to_physical_tpu(list(mesh_sizes), list(physical_shape),
                                                                  device_assignment=device_assignment)
    except (ValueError, AssertionError, TypeError):
        mapping = None
    # The function returns a function object (not a list) for chips whose core count differs from its
    # logical_cores_per_chip flag, and may return coordinates; anything but a permutation means "no answer".
    if not isinstance(mapping, list) or sorted(mapping) != list(range(cores)):
        mapping = list(range(cores))
    return mapping


def host_devices(ctx) -> list:
    """The CPU device of every TPU host, from TPUEstimator's context."""
    return [ctx.tpu_host_placement_function(host_id=i) for i in range(ctx.num_hosts)]


def variable_placer(ctx) -> mtf.utils.BalancedVariablePlacer:
    hosts = host_devices(ctx)
    return mtf.utils.BalancedVariablePlacer(hosts, [REPLICA_CACHE_BYTES * ctx.num_replicas] + [0] * (len(hosts) - 1))


def simd_mesh_arguments(cfg: GPTConfig, ctx) -> dict:
    """The arguments of SimdMeshImpl for this config on the TPU that TPUEstimator's context describes."""
    shape = mtf.convert_to_shape(cfg.mesh_shape)
    if shape.size != ctx.num_replicas:
        raise ConfigError(f"mesh_shape {cfg.mesh_shape!r} has {shape.size} devices but the TPU has "
                          f"{ctx.num_replicas} cores: use a mesh of {ctx.num_replicas} (e.g. --mesh_shape "
                          f"x:{ctx.num_replicas} --layout batch:x, or --auto_layout_and_mesh_shape --num_devices "
                          f"{ctx.num_replicas})")
    assignment = ctx.device_assignment
    physical = list(assignment.topology.mesh_shape)
    return dict(shape=shape, layout=mtf.convert_to_layout_rules(cfg.layout), devices=[""] * shape.size,
                device_assignment=assignment,
                logical_to_physical=logical_to_physical(shape.to_integer_list, physical, assignment))


def simd_mesh(cfg: GPTConfig, ctx):
    """(SimdMeshImpl, variable placer) for the model_fn on a TPU."""
    return mtf.simd_mesh_impl.SimdMeshImpl(**simd_mesh_arguments(cfg, ctx)), variable_placer(ctx)
