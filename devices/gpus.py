"""GPUs for `--gpu_ids device:GPU:i ...`: what TensorFlow found and why it found none, which GPUs it may use and
how much of their memory, and whether XLA:GPU compiles the fused kernels.

* `configure_gpus` (through devices/placement.py's `configure`): checks the machine against the named GPUs
  (`gpu_problem`, a pure function of `GpuFacts`: one line saying what is missing and how to install it), makes
  only those GPUs visible to TensorFlow and sets memory growth or a fixed fraction (`--gpu_memory`). Runs before
  TensorFlow starts.
* `start_up`: float32 made float32 (`set_tf32`: TensorFlow's own default runs float32 matmuls as TF32 on Ampere
  and newer; the config's `allow_tf32` asks for that), then one session on the named GPUs runs a tiny
  XLA-compiled function on each (`probe`), prints the start-up line (`describe`: each GPU's name, compute
  capability and the memory TensorFlow may use, and whether float32 matmuls run as TF32) and picks the fused
  kernels' path (`kernel_path`): XLA:GPU, or plain TensorFlow ops with one line saying why and how to fix it,
  returned as the placement's `kernels` (--plain_kernels or GPT_NEO_PLAIN_KERNELS=1 force plain).
* `session_gpu_options`: the sessions (devices/placement.py's `Placement.session_config`) see only those GPUs, with
  the same memory setting (the placement's GpuSetting); a mesh of CPU devices gets no GPU at all.
* Soft placement stays on (some ops have no GPU kernel); the first training step lists, once, the ops that were
  placed on a GPU but ran on the CPU (execution/op_listing.py).

Written without a GPU: the decisions are pure functions unit-tested on CPU (tests/devices/test_gpus.py); the paths that
need one are in tests/hardware/test_on_gpu.py and bench/bench_gpu.py, run where a GPU is visible.
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass
from typing import Iterable, Optional

from devices.errors import DeviceError

INSTALL = "pip install -r requirements-gpu.txt"
CUDA_WHEELS = ("nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12", "nvidia-cudnn-cu12")
XLA_FIX = (f"{INSTALL} (its nvidia-cuda-nvcc-cu12 brings ptxas and libdevice), or point XLA at a CUDA toolkit: "
           f"XLA_FLAGS=--xla_gpu_cuda_data_dir=/usr/local/cuda")
GIB = 1 << 30


# ---------------------------------------------------------------------------------------------------------
# What the machine has, and what is missing


@dataclass(frozen=True)
class Gpu:
    index: int                                  # TensorFlow's (CUDA-visible) index: device:GPU:index
    name: str = "GPU"                           # e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: Optional[tuple] = None  # e.g. (9, 0)


@dataclass(frozen=True)
class GpuFacts:
    """What decides whether the named GPUs can run: all read before TensorFlow starts (`gather_facts`)."""
    built_with_cuda: bool
    gpus: tuple = ()                            # Gpu per physical GPU TensorFlow found
    driver_gpus: int = 0                        # GPUs the NVIDIA driver shows (/proc/driver/nvidia/gpus, /dev/nvidiaN)
    missing_wheels: tuple = ()                  # CUDA_WHEELS not installed in this Python
    cuda_visible_devices: Optional[str] = None  # the environment variable, when set
    min_compute_capability: Optional[tuple] = None  # the lowest this TensorFlow build has kernels for
    sass: tuple = ()                            # compute capabilities this build has machine code (SASS) for
    ptx: tuple = ()                             # compute capabilities it has PTX for (the driver JIT-compiles those)


def gpu_problem(facts: GpuFacts, requested: Iterable[int]) -> Optional[str]:
    """Why the GPUs `requested` (device:GPU:i indices) cannot run here, as one line naming the fix; None when
    they can."""
    requested = list(requested)
    reason = no_gpu_reason(facts)
    if reason is None:
        have = len(facts.gpus)
        missing = [i for i in requested if i >= have]
        if not missing:
            return _capability_problem(facts, requested)
        requested = missing
        found = ", ".join(f"device:GPU:{g.index} ({g.name})" for g in facts.gpus)
        limits = f" (CUDA_VISIBLE_DEVICES={facts.cuda_visible_devices!r} limits them)" \
            if facts.cuda_visible_devices else ""
        reason = (f"TensorFlow found {have} GPU{'s' if have > 1 else ''}{limits}: {found}; name device:GPU:0"
                  f"{f'..{have - 1}' if have > 1 else ''}, and set the mesh to that many devices")
    return f"{', '.join(f'device:GPU:{i}' for i in requested)} not found: {reason}"


def no_gpu_reason(facts: GpuFacts) -> Optional[str]:
    """Why TensorFlow sees no GPU at all, naming the fix; None when it sees one."""
    if not facts.built_with_cuda:
        return (f"this TensorFlow was built without CUDA and cannot use GPUs; on Linux x86-64 install the CUDA build "
                f"with `{INSTALL}` (or run on the CPU with device:CPU:i names)")
    if facts.gpus:
        return None
    hidden = facts.cuda_visible_devices
    if hidden is not None and hidden.strip() in ("", "-1"):
        return f"TensorFlow sees no GPU: CUDA_VISIBLE_DEVICES={hidden!r} hides them all; unset it or list the GPUs"
    if facts.driver_gpus == 0:
        return ("TensorFlow sees no GPU, and neither does this machine: no NVIDIA driver is loaded (nvidia-smi must "
                "list the GPUs; in a container, pass them through), or run on the CPU with device:CPU:i names")
    if facts.missing_wheels:
        return (f"TensorFlow sees no GPU although the NVIDIA driver shows {facts.driver_gpus}: the CUDA and cuDNN "
                f"libraries TensorFlow loads are not installed (the plain tensorflow wheel brings none; missing: "
                f"{', '.join(facts.missing_wheels)}); install them with `{INSTALL}`")
    return (f"TensorFlow sees no GPU although the NVIDIA driver shows {facts.driver_gpus} and the CUDA wheels are "
            f"installed: the driver may be too old for CUDA 12 (nvidia-smi's 'CUDA Version' must be 12.x or later: "
            f"update the driver), or the wheels do not match this TensorFlow (reinstall with `{INSTALL}`); "
            f"GPT_NEO_TF_LOGS=1 shows TensorFlow's own messages")


def _capability_problem(facts: GpuFacts, requested: list) -> Optional[str]:
    low = facts.min_compute_capability
    for i in requested:
        gpu = facts.gpus[i]
        if low and gpu.compute_capability and tuple(gpu.compute_capability) < tuple(low):
            return (f"device:GPU:{i} ({gpu.name}) has compute capability {_cc(gpu.compute_capability)}, below the "
                    f"{_cc(low)} this TensorFlow build supports: TensorFlow would run its ops on the CPU; use a newer "
                    f"GPU, or device:CPU:i names")
    return None


def _cc(cc) -> str:
    return ".".join(str(x) for x in cc)


def _driver_gpus() -> int:
    proc = "/proc/driver/nvidia/gpus"
    if os.path.isdir(proc):
        return len(os.listdir(proc))
    return len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])


def driver_version(path: str = "/proc/driver/nvidia/version") -> Optional[str]:
    """The loaded NVIDIA kernel driver's version (e.g. "535.104.05"), or None without one."""
    try:
        with open(path) as f:
            match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", f.read())
    except OSError:
        return None
    return match.group(1) if match else None


# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA compatibility table; minor-version
# compatibility lets any 12.x run on 525+).
MIN_DRIVER = {12: 525, 13: 580}
HF_INSTALL = ("python3 -m venv .venv-hf && .venv-hf/bin/pip install -r requirements-gpu-hf.txt, then bench_gpu.py "
              "--hf_python .venv-hf/bin/python")


def torch_cuda_problem(torch_version: str, torch_cuda: Optional[str], driver: Optional[str]) -> str:
    """Why PyTorch sees no GPU here, in one line with its CUDA build and the driver (bench_gpu's HF side, whose
    PyTorch lives in a venv of its own: requirements-gpu-hf.txt)."""
    if not torch_cuda:
        return (f"PyTorch {torch_version} is a CPU build (no CUDA); driver {driver or 'none loaded'}: "
                f"`{HF_INSTALL}` (torch 2.10.0, a CUDA 12 build)")
    if not driver:
        return (f"PyTorch {torch_version} is built for CUDA {torch_cuda}, but no NVIDIA driver is loaded "
                f"(nvidia-smi must list the GPUs)")
    need = MIN_DRIVER.get(int(torch_cuda.split(".")[0]))
    if need and int(driver.split(".")[0]) < need:
        return (f"PyTorch {torch_version} is built for CUDA {torch_cuda}, which needs NVIDIA driver {need} or later; "
                f"this one is {driver}: use torch 2.10.0 (CUDA 12, driver 525 or later): `{HF_INSTALL}`; or update "
                f"the driver")
    return (f"PyTorch {torch_version} (CUDA {torch_cuda}) sees no GPU although NVIDIA driver {driver} is loaded: "
            f"check CUDA_VISIBLE_DEVICES and that this PyTorch build supports the GPU")


def _missing_wheels() -> tuple:
    missing = []
    for name in CUDA_WHEELS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return tuple(missing)


def gather_facts() -> GpuFacts:
    """The machine's GpuFacts. Lists physical devices only: TensorFlow is not started (its devices can still
    be chosen afterwards)."""
    import tensorflow as tf
    gpus = []
    for i, device in enumerate(tf.config.list_physical_devices("GPU")):
        try:
            details = tf.config.experimental.get_device_details(device)
        except Exception:  # noqa: BLE001 (details are for the start-up line only)
            details = {}
        gpus.append(Gpu(i, details.get("device_name", "GPU"), details.get("compute_capability")))
    try:
        sass, ptx = build_architectures(tf.sysconfig.get_build_info().get("cuda_compute_capabilities", []))
    except Exception:  # noqa: BLE001 (a build without the info)
        sass, ptx = (), ()
    capabilities = sass + ptx
    return GpuFacts(built_with_cuda=tf.test.is_built_with_cuda(), gpus=tuple(gpus), driver_gpus=_driver_gpus(),
                    missing_wheels=_missing_wheels(), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                    min_compute_capability=min(capabilities) if capabilities else None, sass=sass, ptx=ptx)


def build_architectures(archs: Iterable[str]) -> tuple:
    """(SASS capabilities, PTX capabilities) from TensorFlow's build info `cuda_compute_capabilities`, e.g.
    ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"] -> (((6, 0), (7, 0), (8, 0), (8, 9)), ((9, 0),))."""
    sass, ptx = [], []
    for arch in archs:
        match = re.fullmatch(r"(sm|compute)_(\d+)(\d)a?", arch)
        if match:
            (sass if match.group(1) == "sm" else ptx).append((int(match.group(2)), int(match.group(3))))
    return tuple(sorted(sass)), tuple(sorted(ptx))


def jit_note(facts: GpuFacts, physical: Iterable[int]) -> Optional[str]:
    """A line for GPUs this TensorFlow build has no machine code (SASS) for but PTX it can JIT-compile: the driver
    compiles TensorFlow's kernels when it starts, for minutes the first time (then from CUDA's JIT cache)."""
    for index in physical:
        gpu = facts.gpus[index] if index < len(facts.gpus) else None
        if gpu is None or not gpu.compute_capability or not facts.sass:
            continue
        cc = tuple(gpu.compute_capability)
        # SASS for X.Y runs on X.Z with Z >= Y (same major version); anything else needs PTX at or below cc
        if any(major == cc[0] and minor <= cc[1] for major, minor in facts.sass) or not any(p <= cc for p in facts.ptx):
            continue
        cache = os.environ.get("CUDA_CACHE_MAXSIZE")
        return (f"note: this TensorFlow build has no kernels compiled for compute capability {_cc(cc)} "
                f"(device:GPU:{index}, {gpu.name}; it has {', '.join(_cc(c) for c in facts.sass)}), so the NVIDIA "
                f"driver now JIT-compiles them from PTX {_cc(max(p for p in facts.ptx if p <= cc))}: the first start "
                f"takes minutes; later ones read CUDA's JIT cache"
                + (f" (CUDA_CACHE_MAXSIZE={cache})" if cache else " (set CUDA_CACHE_MAXSIZE=4294967296 to keep it)"))
    return None


def precision_problem(precision: str, facts: GpuFacts, physical: Iterable[int]) -> Optional[str]:
    """bfloat16 on a GPU without bfloat16 tensor cores (compute capability below 8.0: V100, T4) is refused, with
    float16 named; None where the precision fits every GPU."""
    if precision != "bfloat16":
        return None
    for index in physical:
        gpu = facts.gpus[index] if index < len(facts.gpus) else None
        if gpu is not None and gpu.compute_capability and tuple(gpu.compute_capability) < (8, 0):
            return (f"precision bfloat16 needs bfloat16 tensor cores (compute capability 8.0 or later) but "
                    f"device:GPU:{index} ({gpu.name}) has compute capability {_cc(gpu.compute_capability)}: TensorFlow "
                    f"would emulate bfloat16, slowly; set \"precision\": \"float16\" (dynamic loss scaling, the same "
                    f"tensor-core speed) or \"float32\"")
    return None


# ---------------------------------------------------------------------------------------------------------
# Which GPUs TensorFlow may use, and how much of their memory


@dataclass(frozen=True)
class GpuMemory:
    """`--gpu_memory`: "growth" (allocate as needed, the default) or a fraction of each GPU's memory reserved
    up front (0.9: 90%)."""
    growth: bool = True
    fraction: Optional[float] = None

    def __str__(self) -> str:
        return "memory growth" if self.growth else f"{self.fraction:g} of its memory reserved"


def parse_gpu_memory(text: Optional[str]) -> GpuMemory:
    value = (text or "growth").strip().lower()
    if value == "growth":
        return GpuMemory()
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0.0 < fraction <= 1.0:
        raise DeviceError(f"--gpu_memory takes 'growth' or a fraction of each GPU's memory in (0, 1], e.g. 0.9; "
                          f"got {text!r}")
    return GpuMemory(growth=False, fraction=fraction)


@dataclass(frozen=True)
class GpuSetting:
    """What `configure_gpus` chose for the --gpu_ids GPUs, carried by the Placement (devices/placement.py) to the
    sessions (`session_gpu_options`) and the start-up line."""
    names: tuple                                # the mesh's device names (/device:GPU:i, numbered among the visible)
    physical: tuple = ()                        # the named GPUs' physical indices, sorted (what is visible)
    memory: Optional[GpuMemory] = None          # None: the GPUs were left as they are (a multi-host worker's check)
    facts: Optional[GpuFacts] = None

    def physical_of(self, name: str) -> int:
        """The physical index of the mesh's device `name`."""
        index = int(name.rsplit(":", 1)[1])
        return self.physical[index] if index < len(self.physical) else index


def logical_names(requested: list[int]) -> list[str]:
    """The mesh's device names for physical GPUs `requested` (in --gpu_ids order), once only those are visible:
    TensorFlow numbers the visible GPUs from 0 in physical order (device:GPU:2 alone becomes /device:GPU:0)."""
    order = sorted(requested)
    return [f"/device:GPU:{order.index(i)}" for i in requested]


def configure_gpus(requested: list[int], memory: GpuMemory | str | None = None,
                   facts: Optional[GpuFacts] = None) -> GpuSetting:
    """Checks the named GPUs (device:GPU:i indices) exist and can run (a DeviceError naming the fix if not) and
    returns the GpuSetting with the mesh's device names for them. With `memory` ("growth", a fraction; main.py
    passes --gpu_memory),
    also makes only those GPUs visible to TensorFlow, renumbered from 0, with that memory setting, for the eager
    context and (`session_gpu_options`) every session. Without it, nothing changes (a multi-host worker, whose
    server sees the host's GPUs as they are). Before TensorFlow starts (its first session or eager op)."""
    import tensorflow as tf
    if memory is not None and not isinstance(memory, GpuMemory):
        memory = parse_gpu_memory(memory)
    facts = facts or gather_facts()
    problem = gpu_problem(facts, requested)
    if problem:
        raise DeviceError(problem)
    if memory is None:
        return GpuSetting(tuple(f"/device:GPU:{i}" for i in requested), tuple(requested), None, facts)
    physical = tf.config.list_physical_devices("GPU")
    chosen = [physical[i] for i in sorted(requested)]
    try:
        tf.config.set_visible_devices(chosen, "GPU")
        for device in chosen:
            tf.config.experimental.set_memory_growth(device, memory.growth)
    except RuntimeError:
        raise DeviceError("cannot choose the GPUs (or their memory setting) after TensorFlow has started: choose "
                          "the devices before running anything")
    return GpuSetting(tuple(logical_names(requested)), tuple(sorted(requested)), memory, facts)


def uses_gpus(placement) -> bool:
    return placement.device_kind == "GPU"


def session_gpu_options(config, placement) -> None:
    """Sets `config` (a tf.ConfigProto) for an in-process placement: on GPUs, only the configured ones visible,
    with their memory setting (as the eager context has them: TensorFlow's GPU allocator is per process, and
    the first session or eager op creates it); on CPU devices, no GPU at all, so a CPU mesh on a GPU machine
    leaves the GPUs alone."""
    if not placement.on_this_host:
        return
    if not uses_gpus(placement):
        config.device_count["GPU"] = 0
        return
    setting = placement.gpu
    if setting is None or setting.memory is None:  # GPUs left as TensorFlow found them
        return
    options = config.gpu_options
    options.visible_device_list = ",".join(str(i) for i in setting.physical)
    options.allow_growth = setting.memory.growth
    if setting.memory.fraction:
        options.per_process_gpu_memory_fraction = setting.memory.fraction


# ---------------------------------------------------------------------------------------------------------
# Start-up: the probe session, the start-up line and the fused kernels' path


def kernel_path(forced_plain: bool, xla_error: Optional[str]) -> tuple[bool, Optional[str]]:
    """(whether the fused kernels compile with XLA, the line to print or None): plain where forced (the
    environment variable or --plain_kernels) or where the probe could not compile with XLA:GPU."""
    if forced_plain:
        return False, None
    if xla_error:
        return False, (f"warning: XLA:GPU does not work here ({xla_error}); the fused kernels (GELU, LayerNorm, "
                       f"softmax gradient, cross-entropy, Adam) run as plain TensorFlow ops, slower. To fix: {XLA_FIX}")
    return True, None


@dataclass(frozen=True)
class ProbeResult:
    memory: dict                    # mesh device name -> bytes TensorFlow may allocate there
    xla_error: Optional[str]        # why the XLA-compiled function failed; None when it ran and gave the right values


def describe(names: list[str], facts: GpuFacts, physical: list[int], probe: ProbeResult, memory: GpuMemory,
             xla: bool, tf32: Optional[bool] = None) -> str:
    """The start-up line: each mesh GPU's name, compute capability and the memory TensorFlow may use there,
    the memory setting, the fused kernels' path and (`tf32` given) how float32 matmuls run."""
    parts = []
    for name, index in zip(names, physical):
        gpu = facts.gpus[index] if index < len(facts.gpus) else Gpu(index)
        short = name.replace("/device:", "device:")
        where = "" if short == f"device:GPU:{index}" else f" (physical GPU {index})"
        detail = []
        if gpu.compute_capability:
            detail.append(f"compute capability {_cc(gpu.compute_capability)}")
            if tuple(gpu.compute_capability) < (8, 0):
                detail.append("no bfloat16 tensor cores")
        if probe.memory.get(name):
            detail.append(f"{probe.memory[name] / GIB:.1f} GiB for TensorFlow")
        parts.append(f"{short}{where} = {gpu.name}" + (f" ({', '.join(detail)})" if detail else ""))
    kernels = "XLA:GPU" if xla else "plain TensorFlow ops"
    matmuls = "" if tf32 is None else ("; float32 matmuls as TF32 (allow_tf32)" if tf32 else
                                       "; float32 matmuls in float32 (TF32 off)")
    return f"GPUs: {'; '.join(parts)}; {memory}; fused kernels: {kernels}{matmuls}"


def _probe_function(x, dtype="float32"):
    """Computes in `dtype` (the training dtype: a 16-bit-only compile failure shows here, not mid-step), returns
    float32."""
    import tensorflow as tf
    x = tf.cast(x, dtype)
    y = tf.exp(-x * x)  # libdevice's __nv_expf, as GELU's tanh and LayerNorm's rsqrt need libdevice too
    return tf.cast(tf.tanh(y) + tf.math.rsqrt(1.0 + y) + tf.reduce_logsumexp(x, keepdims=True), tf.float32)


PROBE_RTOL = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 3e-3}


def probe(names: list[str], config, xla: bool = True, dtype: str = "float32") -> ProbeResult:
    """Opens a session on the GPUs `names` with `config` (soft placement off: the probe must run there) and runs a
    tiny XLA-compiled function in `dtype` on each (a plain one when `xla` is false); returns each GPU's memory for
    TensorFlow and why XLA failed (None when it compiled and gave numpy's values)."""
    import functools
    import numpy as np
    import tensorflow.compat.v1 as tf

    probe_config = tf.ConfigProto()
    probe_config.CopyFrom(config)
    probe_config.allow_soft_placement = False
    graph = tf.Graph()
    with graph.as_default():
        x = tf.placeholder(tf.float32, [256])
        body = functools.partial(_probe_function, dtype=dtype)
        fn = tf.function(body, jit_compile=True) if xla else body
        outputs = []
        for name in names:
            with tf.device(name):
                outputs.append(fn(tf.identity(x)))
    value = np.linspace(-3, 3, 256, dtype=np.float32)
    y = np.exp(-value * value)
    expected = np.tanh(y) + 1 / np.sqrt(1 + y) + np.log(np.exp(value).sum())
    try:
        session = tf.Session(graph=graph, config=probe_config)
    except tf.errors.OpError as e:
        raise DeviceError(f"TensorFlow could not open a session on {', '.join(names)}: {first_line(e.message)}")
    with session:
        memory = {}
        for device in session.list_devices():
            spec = tf.DeviceSpec.from_string(device.name)
            if spec.device_type == "GPU":
                memory[f"/device:GPU:{spec.device_index}"] = device.memory_limit_bytes
        absent = [name for name in names if "GPU" in name.upper() and name not in memory]
        if absent:
            raise DeviceError(f"TensorFlow lists {', '.join(absent)} but created no device for it (a GPU it cannot "
                              f"use, or out of memory at start); GPT_NEO_TF_LOGS=1 shows TensorFlow's reason")
        try:
            results = session.run(outputs, {x: value})
        except tf.errors.OpError as e:
            if not xla:
                raise DeviceError(f"TensorFlow could not run on {', '.join(names)}: {first_line(e.message)}")
            return ProbeResult(memory, first_line(e.message))
    for name, result in zip(names, results):
        if not np.allclose(result, expected, rtol=PROBE_RTOL.get(dtype, 1e-4), atol=1e-5):
            return ProbeResult(memory, f"its result on {name} differs from numpy's by "
                                       f"{float(np.abs(result - expected).max()):.3g}")
    return ProbeResult(memory, None)


def first_line(message: str, limit: int = 240) -> str:
    """The line of a TensorFlow error that says what failed (libdevice, ptxas, ...), else its first line."""
    generic = re.compile(r"^(Graph execution error|Detected at node|The op is created at|\[\[|dummy_)")
    lines = [line.strip() for line in message.strip().splitlines() if line.strip() and not generic.match(line.strip())]
    for line in lines:
        if re.search(r"libdevice|ptxas|nvlink|cuda_data_dir|CUDA|cuDNN", line):
            return line[:limit]
    return (lines[0] if lines else message.strip() or "unknown error")[:limit]


def set_tf32(allowed: bool) -> None:
    """Whether float32 matmuls (and convolutions) on GPUs run as TF32 on tensor cores (Ampere and newer: float32's
    range with float16's 10-bit mantissa) or in full float32. TensorFlow's own default is TF32;
    here float32 means float32 unless the config's `allow_tf32` asks (PyTorch's default too, so that the HF
    parity and the harness's hf backend compare like with like). Process-wide: the GPU start-up sets it (for a
    multi-host run each host's process: devices/cluster.py), and the MFU peak reads it (devices/peaks.py)."""
    import tensorflow as tf
    tf.config.experimental.enable_tensor_float_32_execution(bool(allowed))


def start_up(placement, config, xla_autoclustering: bool = False, out=None, precision: str = "float32",
             tf32: Optional[bool] = None):
    """For a placement on GPUs: sets whether float32 matmuls run as TF32 (`set_tf32`; None leaves TensorFlow's
    setting as the caller made it), refuses a precision the GPUs lack, says when the driver will JIT-compile
    TensorFlow's kernels, probes the GPUs (memory, XLA:GPU in `precision`), prints the start-up line and chooses
    the fused kernels' path (XLA:GPU, or plain ops with one warning line; plain where the placement already says
    so). Returns (the placement with that path, the ProbeResult); for CPU devices or a TPU (placement, None)."""
    if not uses_gpus(placement) or not placement.on_this_host:
        return placement, None
    import tensorflow as tf
    if tf32 is not None:
        set_tf32(tf32)
    setting = placement.gpu
    names = list(placement.devices)
    physical = [setting.physical_of(n) if setting else int(n.rsplit(":", 1)[1]) for n in names]
    facts = setting.facts if setting and setting.facts else gather_facts()
    problem = precision_problem(precision, facts, physical)
    if problem:
        raise DeviceError(problem)
    note = jit_note(facts, physical)
    if note:  # before the probe: it is the first thing that makes the driver compile
        print(note, file=sys.stderr, flush=True)
    forced = placement.kernels == "plain"
    result = probe(sorted(set(names)), config, xla=not forced, dtype=precision)
    xla, warning = kernel_path(forced, result.xla_error)
    if xla_autoclustering and result.xla_error:
        raise DeviceError(f"--xla needs XLA:GPU, which does not work here ({result.xla_error}): leave out --xla, "
                          f"or fix it: {XLA_FIX}")
    memory = setting.memory if setting and setting.memory else GpuMemory()
    tf32_on = tf.config.experimental.tensor_float_32_execution_enabled()
    print(describe(names, facts, physical, result, memory, xla, tf32_on), file=out or sys.stdout, flush=True)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return dataclasses.replace(placement, kernels="xla" if xla else "plain"), result
