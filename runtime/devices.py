"""Devices and meshes: turn `--gpu_ids` names into the device list a placement mesh runs on.

`device:CPU:i` names split the host CPU into as many logical devices as named, so any mesh shape runs on
one CPU (this is how the tests check data- and model-parallel layouts without accelerators).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import tensorflow as tf

from runtime import gpus
from runtime.errors import DeviceError


@dataclass(frozen=True)
class Placement:
    """Where the mesh runs, and how: a list of devices (a placement mesh) or a TPU (mesh-tensorflow's SIMD mesh),
    with everything chosen about them at start-up, which sessions and graph builders read from here.

    Across hosts (runtime/cluster.py) the devices are /job:worker/task:T/... names, `master` is the chief's
    server, master variables are spread over `hosts` (each host's CPU) and ops placed nowhere else run on
    `default_device` (the chief's CPU)."""
    devices: tuple = ()
    tpu: Optional[str] = None
    master: Optional[str] = None
    hosts: tuple = ()
    default_device: Optional[str] = None
    tpu_system: Any = None  # runtime.tpu.TpuSystem with --tpu: the TPU's topology and hosts
    tpu_facts: Any = None   # runtime.tpu_access.TpuFacts with --tpu: the stack and machine it was reached from
    gpu: Optional[gpus.GpuSetting] = None  # --gpu_ids GPUs: physical indices, memory setting, what the machine has
    kernels: str = "xla"    # the fused kernels' path: "xla" or "plain" (models/kernels/common.py)

    @property
    def use_tpu(self) -> bool:
        return self.tpu is not None

    @property
    def cpu_devices(self) -> int:
        """How many logical CPU devices the session needs (the CPU split into that many)."""
        return max(1, sum("CPU" in d for d in self.devices))

    def device_function(self):
        """A device function for graph building that puts ops on `default_device` only where no job, task or
        device was given: explicitly placed ops (mesh slices, master variables) keep theirs."""
        if not self.default_device:
            return None
        base = tf.compat.v1.DeviceSpec.from_string(self.default_device)
        return lambda op: base.make_merged_spec(tf.compat.v1.DeviceSpec.from_string(op.device or "")).to_string()


_NAME = re.compile(r"^/?(?:device:)?(CPU|GPU|TPU):(\d+)$", re.IGNORECASE)


def normalize(name: str) -> tuple[str, int]:
    match = _NAME.match(name.strip())
    if not match:
        raise DeviceError(f"device name {name!r} is not understood: write it as device:GPU:0 or device:CPU:0")
    return match.group(1).upper(), int(match.group(2))


def cpu_devices(count: int) -> list[str]:
    return [f"device:CPU:{i}" for i in range(count)]


def configure(names: list[str], gpu_memory: Optional[str] = None) -> list[str]:
    """`local_placement`'s device names (for callers that need only those: a multi-host worker's check)."""
    return list(local_placement(names, gpu_memory).devices)


def local_placement(names: list[str], gpu_memory: Optional[str] = None, kernels: str = "xla") -> Placement:
    """The Placement of this process's devices `names`: checks they exist (splitting the CPU where CPU devices are
    named; making only the named GPUs visible, with `gpu_memory`: "growth" or a fraction, see runtime/gpus.py).
    Must run before TensorFlow creates its first session or eager context."""
    parsed = [normalize(n) for n in names]
    if len(set(parsed)) != len(parsed):
        raise DeviceError(f"--gpu_ids names a device twice: {' '.join(names)}")
    kinds = {kind for kind, _ in parsed}
    if len(kinds) > 1:
        raise DeviceError("--gpu_ids mixes device kinds: a mesh runs on GPUs or on CPU devices, not both")
    kind = kinds.pop()
    if kind == "TPU":
        raise DeviceError("TPU devices are reached with --tpu NAME, not --gpu_ids")
    if kind == "CPU":
        wanted = max(index for _, index in parsed) + 1
        cpu = tf.config.list_physical_devices("CPU")[0]
        current = tf.config.get_logical_device_configuration(cpu)
        if current is None or len(current) < wanted:
            try:
                tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
            except RuntimeError:
                raise DeviceError(f"cannot split the CPU into {wanted} devices after TensorFlow has started: "
                                  f"choose the devices before running anything")
        return Placement(devices=tuple(f"/device:{kind}:{index}" for kind, index in parsed), kernels=kernels)
    # only the named GPUs visible, with their memory setting; one line on what is missing (runtime/gpus.py)
    setting = gpus.configure_gpus([index for _, index in parsed], gpu_memory)
    return Placement(devices=setting.names, gpu=setting if setting.memory else None, kernels=kernels)


def xla_cpu_problem() -> Optional[str]:
    """Why XLA cannot compile for this host's CPU, else None. tensorflow-tpu 2.20's build has no XLA:CPU ("could not
    find registered transfer manager for platform Host"): on a TPU VM the fused kernels of CPU meshes (and
    --selfcheck's CPU reference) must run as plain ops there."""
    try:
        with tf.device("/device:CPU:0"):
            tf.function(lambda x: tf.tanh(x) * 2.0, jit_compile=True)(tf.ones([4]))
    except tf.errors.OpError as e:
        return gpus.first_line(e.message)
    return None


def check_mesh_fits(mesh_shape: str, n_mesh_devices: int, devices: list[str]) -> None:
    if n_mesh_devices != len(devices):
        raise DeviceError(
            f"mesh_shape {mesh_shape!r} has {n_mesh_devices} devices but {len(devices)} were given "
            f"({' '.join(devices)}): pass {n_mesh_devices} devices to --gpu_ids, or override the config with "
            f"--mesh_shape all:{len(devices)} --layout batch:all (or --mesh_shape all:1 --layout '' for one)")


# One device's peak FLOP/s for MFU (measured or from datasheets): runtime/peaks.py.
