"""One device's peak FLOP/s for MFU (devices/peaks.py): the measured matmul chain (its dtype, its device, a
plausible rate on this CPU), the datasheet table by the name TensorFlow reports, and which one a placement gets."""
import functools

import pytest
import tensorflow as tf

from conftest import CPU_DEVICES
from devices import peaks
from devices.placement import Placement
from tests.devices.test_tpu import fake_placement


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_matmul_chain_runs_in_the_dtype_asked_for_on_the_device_asked_for(dtype):
    graph, fetch, _ = peaks.matmul_chain("/device:GPU:3", dtype, size=64, chain=5)
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
    assert len(matmuls) == 5
    assert all(op.get_attr("T") == tf.as_dtype(dtype) for op in matmuls)
    assert all(op.device == "/device:GPU:3" for op in matmuls + [fetch.op])
    assert fetch.shape.rank == 0 and fetch.dtype == tf.float32  # one scalar comes back, not the product
    # Each matmul takes the previous one's product: the chain runs in sequence, all inside one session call.
    for first, second in zip(matmuls, matmuls[1:]):
        assert second.inputs[0].op is first


def test_the_measured_peak_is_a_plausible_rate_on_this_cpu():
    rate = peaks.measure_matmul_peak("float32", "/device:CPU:0", size=128, chain=2, seconds=0.05)
    assert 1e8 < rate < 1e14  # between 0.1 GFLOP/s and 100 TFLOP/s
    assert peaks.measure_matmul_peak("bfloat16", "/device:CPU:0", size=64, chain=2, seconds=0.02) > 1e7


def test_the_threads_a_cpu_matmul_runs_on_follow_the_config_then_tensorflows_variable(monkeypatch):
    """cpu_threads: the session config's intra-op threads; where it says 0, TF_NUM_INTRAOP_THREADS, which
    TensorFlow reads then (the test suite sets it under `pytest -n 2`); else every core. Bug: the variable ignored
    (the peak's CPU time divided by the cores while one thread ran: a peak too low by that factor)."""
    import os
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: every count is 1")
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    assert peaks.cpu_threads(tf.compat.v1.ConfigProto()) == cores
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "1")
    assert peaks.cpu_threads(tf.compat.v1.ConfigProto()) == 1
    assert peaks.cpu_threads(tf.compat.v1.ConfigProto(intra_op_parallelism_threads=cores)) == cores
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "many")
    assert peaks.cpu_threads(tf.compat.v1.ConfigProto()) == cores


def test_a_cpu_peak_measured_while_other_processes_hold_the_cores_is_not_low():
    """A CPU's matmul calls are timed by the process's CPU time over its threads as well as by the clock: with
    three busy processes per core beside it, the peak stays near the one measured without them (without them
    meaning what else the machine runs, e.g. the suite's other worker). Bug: time the calls by the clock alone
    (`if threads:` -> `if False:` in measure_matmul_peak): the loaded peak falls to a quarter or less, and MFU
    printed against it goes over 100%."""
    import os
    import subprocess
    import sys
    import time
    measure = functools.partial(peaks.measure_matmul_peak, "float32", "/device:CPU:0", size=512, chain=4, seconds=1.0)
    quiet = measure()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(3 * peaks.cpu_threads(tf.compat.v1.ConfigProto()))]
    try:
        time.sleep(0.2)  # every spinner started and running
        loaded = measure()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert loaded > 0.6 * quiet, (loaded, quiet, os.getloadavg())


@pytest.mark.parametrize("name,dtype,tf32,tflops", [
    ("NVIDIA A100-SXM4-80GB", "bfloat16", True, 312),
    ("NVIDIA A100-PCIE-40GB", "float16", True, 312),
    ("NVIDIA A100-SXM4-40GB", "float32", True, 156),     # float32 matmuls run as TF32 (TensorFlow's default)
    ("NVIDIA A100-SXM4-40GB", "float32", False, 19.5),
    ("NVIDIA H100 80GB HBM3", "bfloat16", True, 989.4),  # H100 SXM
    ("NVIDIA H100 PCIe", "bfloat16", True, 756),
    ("NVIDIA H200", "bfloat16", True, 989.4),
    ("Tesla V100-SXM2-16GB", "float16", True, 125),
    ("Tesla V100-SXM2-32GB", "float32", True, 15.7),     # no TF32 on Volta
    ("Tesla V100-PCIE-16GB", "float16", True, 112),
    ("Tesla T4", "float16", True, 65),
    ("Tesla T4", "float32", True, 8.1),
    ("NVIDIA A10", "bfloat16", True, 125),
    ("NVIDIA L4", "bfloat16", True, 121),
])
def test_known_gpu_peaks_by_the_name_tensorflow_reports(name, dtype, tf32, tflops):
    assert peaks.known_gpu_peak(name, dtype, tf32) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("name,dtype", [
    ("Tesla T4", "bfloat16"),              # no bf16 tensor cores: measured instead
    ("Tesla V100-SXM2-16GB", "bfloat16"),
    ("NVIDIA A10G", "bfloat16"),           # not an A10 (nor an A100)
    ("NVIDIA L40S", "bfloat16"),           # not an L4
    ("NVIDIA GeForce RTX 4090", "float32"),
])
def test_gpus_or_dtypes_the_table_does_not_know_are_measured(name, dtype):
    assert peaks.known_gpu_peak(name, dtype) is None


def test_a_placement_gets_its_first_devices_peak(monkeypatch):
    measured = []

    def fake_measure(dtype, device, **kwargs):
        measured.append((dtype, device))
        return 4e11

    monkeypatch.setattr(peaks, "measure_matmul_peak", fake_measure)
    monkeypatch.setattr(peaks, "_MEASURED", {})  # nothing this process measured before
    # CPU devices share the host's cores: each gets its share of the CPU's rate.
    assert peaks.device_peak(Placement(devices=tuple(CPU_DEVICES[:1])), "float32").flops == 4e11
    four = peaks.device_peak(Placement(devices=tuple(CPU_DEVICES[:4])), "bfloat16")
    assert four.flops == 1e11 and "shared by 4" in four.source
    assert measured == [("float32", "/device:CPU:0"), ("bfloat16", "/device:CPU:0")]
    # A GPU the table knows: the datasheet, nothing measured; one it does not know: measured on that GPU.
    gpus = Placement(devices=("/device:GPU:1", "/device:GPU:0"))
    monkeypatch.setattr(peaks, "gpu_name", lambda index: "NVIDIA A100-SXM4-80GB")
    known = peaks.device_peak(gpus, "bfloat16")
    assert known.flops == 312e12 and "A100" in known.source and "datasheet" in known.source
    monkeypatch.setattr(peaks, "gpu_name", lambda index: "NVIDIA GeForce RTX 4090")
    assert peaks.device_peak(gpus, "bfloat16").flops == 4e11
    assert measured[-1] == ("bfloat16", "/device:GPU:1")
    # TPUs: no peak (--peak_tflops gives one); a failed measurement: no MFU, with the reason.
    assert fake_placement("v3-8").peak("bfloat16").flops == 0

    def failing(*args, **kwargs):
        raise tf.errors.InvalidArgumentError(None, None, "no bfloat16 MatMul kernel on GPU\nmore")

    monkeypatch.setattr(peaks, "measure_matmul_peak", failing)
    monkeypatch.setattr(peaks, "_MEASURED", {})
    failed = peaks.device_peak(gpus, "bfloat16")
    assert failed.flops == 0 and "no bfloat16 MatMul kernel on GPU" in failed.source and "--peak_tflops" in failed.source


def test_a_peak_is_measured_once_per_process_for_a_device_dtype_and_config(monkeypatch):
    """The second run in a process (a ladder's next size, --eval after training) reuses the first run's
    measurement; another dtype or device is measured; a failed measurement is tried again next time. (Bugs: no
    cache, so every run measures for a second; a cache keyed without the dtype, so bfloat16 gets float32's rate.)"""
    calls = []

    def fake_measure(dtype, device, **kwargs):
        calls.append((dtype, device))
        if device.endswith("GPU:0"):
            raise tf.errors.InternalError(None, None, "busy")
        return {"float32": 4e11, "bfloat16": 8e11}[dtype]

    monkeypatch.setattr(peaks, "measure_matmul_peak", fake_measure)
    monkeypatch.setattr(peaks, "_MEASURED", {})
    one = Placement(devices=tuple(CPU_DEVICES[:1]))
    config = one.session_config()
    assert [peaks.device_peak(one, "float32", config).flops for _ in range(3)] == [4e11] * 3
    assert peaks.device_peak(one, "bfloat16", config).flops == 8e11
    assert calls == [("float32", "/device:CPU:0"), ("bfloat16", "/device:CPU:0")]
    gpu = Placement(devices=("/device:GPU:0",))
    monkeypatch.setattr(peaks, "gpu_name", lambda index: None)
    assert peaks.device_peak(gpu, "float32").flops == 0 and peaks.device_peak(gpu, "float32").flops == 0
    assert calls[2:] == [("float32", "/device:GPU:0")] * 2
