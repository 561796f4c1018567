"""One device's peak FLOP/s: the denominator of MFU (train/progress.py divides the mesh's model FLOP/s by the
number of mesh devices and then by this).

* NVIDIA GPUs that TensorFlow names (`tf.config.experimental.get_device_details(gpu)["device_name"]`) and this
  table knows: the dense (no sparsity) tensor-core peak of NVIDIA's datasheet for the training dtype. float32
  counts as TF32 where TensorFlow runs float32 matmuls in TF32
  (`tf.config.experimental.tensor_float_32_execution_enabled()`): TensorFlow's default on Ampere and newer, which
  the GPU start-up turns off unless the config's allow_tf32 asks for it (devices/gpus.py's `set_tf32`).
* Any other device and dtype: measured. A chain of matmuls in the training dtype, placed on the device itself,
  runs as one graph-session call (the path the model's einsums take) and is reduced to one scalar, so the
  session call returns only when every matmul is done and the copy back is a few bytes; the first call
  (kernel selection, autotuning) is not timed, the best of the timed calls counts.
* A CPU's calls are timed by the CPU time the process used, over the threads it runs the matmuls on, as well
  as by the clock (the shorter counts): on a shared machine the clock also counts the time other processes held
  the cores, so a peak timed by the clock alone came out low and MFU over 100% (a ladder's branch, started while
  other work loaded the 2 cores: 17 GFLOP/s against the 133 its trunk measured).
* A CPU split into logical devices (`device:CPU:i`): they share the cores, so one device's peak is the
  host CPU's measured rate divided by how many of them the mesh puts on this host.
* A measurement is made once per process for a device, dtype and session config: the runs after it (a ladder's
  sizes, an evaluation after training, a test suite's trainings) share it, and with it one denominator for MFU.
"""
from __future__ import annotations

import os
import re
import time
from typing import NamedTuple, Optional

import numpy as np
import models  # noqa: F401  (TensorFlow without Keras, the mesh-tensorflow alias: devices/__init__.py)
import tensorflow as tf

DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16, "float16": tf.float16}
# How long a measurement's timed calls run: the best call of 0.25, 0.5 or 1 s came within 1% of each other on a
# 2-core EPYC (fp32 217 GFLOP/s, bf16 424), and every training process waits for it before its first step.
PEAK_SECONDS = 0.5

# TFLOP/s, dense, per GPU, from NVIDIA's datasheets ("tf32": float32 matmuls run as TF32 on tensor cores).
# Patterns are tried in order against the name TensorFlow reports; a dtype a GPU has no entry for is measured
# (V100 and T4 have no bfloat16 tensor cores).
KNOWN_PEAKS = (
    (r"H100 PCIe", {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0}),
    (r"H100.*(SXM|HBM3)", {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4}),
    (r"H200(?!.*NVL)", {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4}),
    (r"A100", {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0}),
    (r"\bA10\b", {"float32": 31.2, "tf32": 62.5, "bfloat16": 125.0, "float16": 125.0}),
    (r"\bL4\b", {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0, "float16": 121.0}),
    (r"V100S", {"float32": 16.4, "float16": 130.0}),
    (r"V100-PCIE", {"float32": 14.0, "float16": 112.0}),
    (r"V100", {"float32": 15.7, "float16": 125.0}),
    (r"\bT4\b", {"float32": 8.1, "float16": 65.0}),
)


class Peak(NamedTuple):
    flops: float   # one device's peak FLOP/s (0: unknown, MFU not shown)
    source: str    # where it comes from, for the start-up line


def known_gpu_peak(name: str, dtype: str, tf32: bool = True) -> Optional[float]:
    """The datasheet peak FLOP/s of the GPU TensorFlow calls `name` in `dtype`, or None if not in the table."""
    for pattern, peaks in KNOWN_PEAKS:
        if re.search(pattern, name, re.IGNORECASE):
            key = "tf32" if dtype == "float32" and tf32 and "tf32" in peaks else dtype
            return peaks[key] * 1e12 if key in peaks else None
    return None


def matmul_chain(device: str, dtype: str, size: int, chain: int):
    """A graph whose one fetch runs `chain` size x size matmuls in `dtype` on `device`, one after the other,
    and returns their result summed to a float32 scalar. Returns (graph, fetch, init_op)."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default(), tf.device(device):
        # Entries of b ~ N(0, 1/size) keep the chain's values around 1 in every dtype (no float16 overflow).
        a = tf.compat.v1.Variable(rng.standard_normal((size, size)).astype(np.float32), name="a")
        b = tf.compat.v1.Variable((rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32), name="b")
        x, w = tf.cast(a, DTYPES[dtype]), tf.cast(b, DTYPES[dtype])
        for _ in range(chain):
            x = tf.matmul(x, w)
        fetch = tf.reduce_sum(tf.cast(x, tf.float32))
        init = tf.compat.v1.global_variables_initializer()
    return graph, fetch, init


def measure_matmul_peak(dtype: str = "float32", device: str = "/device:CPU:0", size: Optional[int] = None,
                        chain: Optional[int] = None, seconds: float = PEAK_SECONDS, config=None) -> float:
    """Matmul FLOP/s that `device` reaches in `dtype`: a chain of matmuls in one session call (see the module
    docstring), the best of the calls made in `seconds` after an untimed first one. Size 4096 on a GPU (chain
    32), 1024 on a CPU (chain 4) unless given. `config`: the session's ConfigProto (soft placement is turned
    off, so the matmuls run on `device` or the call fails)."""
    gpu = "GPU" in device.upper()
    size = size or (4096 if gpu else 1024)
    chain = chain or (32 if gpu else 4)
    graph, fetch, init = matmul_chain(device, dtype, size, chain)
    session_config = tf.compat.v1.ConfigProto()
    if config is not None:
        session_config.CopyFrom(config)
    session_config.allow_soft_placement = False
    threads = None if gpu else cpu_threads(session_config)
    with tf.compat.v1.Session(graph=graph, config=session_config) as session:
        session.run(init)
        session.run(fetch)  # kernel selection, autotuning, first allocation
        best, end = float("inf"), time.perf_counter() + seconds
        runs = 0
        while runs < 3 or time.perf_counter() < end:
            start, start_cpu = time.perf_counter(), time.process_time()
            session.run(fetch)
            took = time.perf_counter() - start
            if threads:  # the cores' time this call needed, whoever else held them meanwhile
                took = min(took, (time.process_time() - start_cpu) / threads)
            best = min(best, took)
            runs += 1
    return chain * 2 * size ** 3 / best


def cpu_threads(config) -> int:
    """How many threads a session with `config` runs one matmul on: its intra-op pool; where the config leaves it
    at 0, TF_NUM_INTRAOP_THREADS as TensorFlow reads it, else TensorFlow's default of one per core this process
    may run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    intra = config.intra_op_parallelism_threads
    if intra <= 0:
        try:
            intra = int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0"))
        except ValueError:  # TensorFlow ignores a value it cannot read
            intra = 0
    return min(intra, cores) if intra > 0 else cores


def _local_name(device: str) -> tuple[str, int]:
    spec = tf.DeviceSpec.from_string(device)
    return (spec.device_type or "CPU").upper(), spec.device_index or 0


def gpu_name(index: int) -> Optional[str]:
    """The name TensorFlow reports for visible GPU `index` (e.g. "NVIDIA A100-SXM4-80GB"), or None."""
    gpus = tf.config.get_visible_devices("GPU")
    if index >= len(gpus):
        return None
    return tf.config.experimental.get_device_details(gpus[index]).get("device_name")


_MEASURED: dict[tuple, float] = {}  # (device, dtype, session config, seconds) -> FLOP/s, this process's


def measured_peak(dtype: str, device: str, config=None, seconds: float = PEAK_SECONDS) -> float:
    """measure_matmul_peak's rate for `device` in `dtype`, measured on this process's first call with these
    arguments and remembered after (a failed measurement is not remembered: it raises again)."""
    key = (device, dtype, config.SerializeToString(deterministic=True) if config is not None else b"", seconds)
    if key not in _MEASURED:
        _MEASURED[key] = measure_matmul_peak(dtype, device, config=config, seconds=seconds)
    return _MEASURED[key]


def device_peak(placement, dtype: str, config=None, seconds: float = PEAK_SECONDS) -> Peak:
    """One mesh device's peak FLOP/s in `dtype` for a placement mesh (its first device stands for all: a mesh
    runs on devices of one kind); a TPU's placement says its own (devices/tpu.py)."""
    kind, index = _local_name(placement.devices[0])
    local = f"/device:{kind}:{index}"
    if kind == "GPU":
        name = gpu_name(index) or local
        known = known_gpu_peak(name, dtype, tf.config.experimental.tensor_float_32_execution_enabled())
        if known:
            tf32 = " as TF32" if dtype == "float32" and known_gpu_peak(name, dtype, False) != known else ""
            return Peak(known, f"{name}, {dtype}{tf32}, NVIDIA datasheet (dense)")
        shared, what = 1, f"{name}, measured"
    else:
        hosts = placement.n_hosts
        shared = max(1, placement.cpu_devices // hosts)  # logical CPU devices on this host share its cores
        what = "this host's CPU, measured" + (f", shared by {shared} mesh devices" if shared > 1 else "")
    try:
        rate = measured_peak(dtype, local, config=config, seconds=seconds)
    except tf.errors.OpError as e:
        reason = (e.message or type(e).__name__).splitlines()[0]
        return Peak(0.0, f"not measured ({dtype} matmul on {local} failed: {reason}); pass --peak_tflops for MFU")
    return Peak(rate / shared, f"{what}: {dtype} matmuls on {local}")
