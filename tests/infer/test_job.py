"""infer/job.py: --predict's placement."""
import dataclasses

from devices.placement import Placement
from infer.job import sampling_placement


def test_predict_samples_with_plain_kernels_on_cpu_devices():
    """The bug this catches: sampling_placement returning the placement as it is, so a --predict process on CPUs
    compiles 99 XLA programs (61-63 CPU s for the default model) before its first token."""
    cpu = Placement(devices=("/device:CPU:0",), kernels="xla")
    assert sampling_placement(cpu).kernels == "plain"
    assert dataclasses.replace(sampling_placement(cpu), kernels="xla") == cpu  # nothing else changes


def test_gpus_keep_their_kernels():
    gpu = Placement(devices=("/device:GPU:0",), kernels="xla")
    assert sampling_placement(gpu) is gpu
