"""The devices a run asks for (`DeviceRequest`) and where its mesh runs (`Placement`), here for this process's
own devices: `--gpu_ids` names turned into the device list a placement mesh runs on.

`device:CPU:i` names split the host CPU into as many logical devices as named, so any mesh shape runs on
one CPU (this is how the tests check data- and model-parallel layouts without accelerators). The other kinds
of placement are devices/cluster.py's (a multi-host cluster) and devices/tpu.py's (a TPU); devices/kinds.py
turns a request into the placement of its kind.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

import models  # noqa: F401  (TensorFlow without Keras, the mesh-tensorflow alias: devices/__init__.py)
import tensorflow as tf

from devices import gpus, peaks, tpu_access
from execution import meshes, runner
from devices import precision as precisions
from devices.errors import DeviceError
from execution.preemption import StopOnSignal


@dataclass(frozen=True)
class DeviceRequest:
    """The devices a run asks for and how: main.py's device flags, read once (cli/device_flags.py)."""
    gpu_ids: tuple = ()              # --gpu_ids: the mesh's devices (none: as many CPU devices as the mesh has)
    gpu_memory: str = "growth"       # --gpu_memory: "growth" or a fraction of each GPU's memory
    tpu: Optional[str] = None        # --tpu: the TPU to run on
    tpu_timeout: float = tpu_access.DEFAULT_TIMEOUT  # --tpu_timeout
    plain_kernels: bool = False      # --plain_kernels (or GPT_NEO_PLAIN_KERNELS=1): fused kernels as plain TF ops
    xla: bool = False                # --xla: XLA auto-clustering, which needs XLA:GPU on GPUs
    cluster: Optional[object] = None  # devices/cluster.py's Cluster: the hosts of a multi-host run, this one's task
    worker_timeout: Optional[float] = None  # --worker_timeout: how long a worker waits to be released


@dataclass(frozen=True)
class Placement:
    """Where a job's mesh runs, and how, chosen once at start-up: this process's CPU devices or GPUs (this class),
    the hosts of a multi-host cluster (devices/cluster.py's ClusterPlacement) or a TPU (devices/tpu.py's
    TpuPlacement). Each kind answers the questions below for itself, so that the jobs, sessions and checks ask
    them instead of which kind they hold; execution/runner.py runs a job's step on any of them."""
    devices: tuple = ()
    gpu: Optional[gpus.GpuSetting] = None  # --gpu_ids GPUs: physical indices, memory setting, what the machine has
    kernels: str = "xla"    # the fused kernels' path: "xla" or "plain" (models/kernels/common.py)

    # Why the session cannot list where each op of a step ran (None: it can; devices/gpus.py lists them).
    op_listing: ClassVar[Optional[str]] = None
    # Whether a step's outputs must be made whole on every device before they leave the mesh (mtf.anonymize).
    whole_outputs: ClassVar[bool] = False
    # Whether programs of one model may be built into one graph, one session holding one copy of the weights for
    # them all (infer/run.py's Predictor): the mesh's masters and slices are the same variables in each.
    programs_share_weights: ClassVar[bool] = True

    @property
    def device_kind(self) -> str:
        """"CPU" or "GPU": the kind of the mesh's devices (one kind per mesh)."""
        return "GPU" if any("GPU" in d.upper() for d in self.devices) else "CPU"

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    @property
    def cpu_devices(self) -> int:
        """How many logical CPU devices the session needs (the CPU split into that many)."""
        return max(1, sum("CPU" in d for d in self.devices))

    @property
    def on_this_host(self) -> bool:
        """Whether everything runs in this process: its host's RAM and GPUs are the ones used (plan/memory_check.py),
        its GPU options are the session's (devices/gpus.py)."""
        return True

    @property
    def target(self) -> str:
        """The session's master ("" runs it in this process)."""
        return ""

    @property
    def n_hosts(self) -> int:
        return 1

    @property
    def variable_hosts(self) -> tuple:
        """Where the master variables live: this host's CPU when the mesh runs on GPUs (left unplaced, TensorFlow
        would put every master copy, optimizer slots included, on GPU 0 beside that GPU's own slices); unplaced
        (the host CPU anyway) for CPU devices."""
        return ("/device:CPU:0",) if self.device_kind == "GPU" else ()

    @classmethod
    def matches(cls, request: DeviceRequest) -> bool:
        """Whether `request` asks for this kind of placement (this host's devices: when nothing else is asked)."""
        return True

    @classmethod
    def from_request(cls, request: DeviceRequest, cfg=None) -> "Placement":
        """The devices `request` names, checked and made visible (`local_placement`), against the mesh of `cfg`;
        without a config (--selfcheck, whose model is sized to the devices) one CPU device by default."""
        names = list(request.gpu_ids) or cpu_devices(cfg.n_devices if cfg is not None else 1)
        placement = local_placement(names, request.gpu_memory)
        if cfg is not None:
            check_mesh_fits(cfg.mesh_shape, cfg.n_devices, list(placement.devices))
        return placement

    def describe(self) -> str:
        """Where it runs, for the start-up lines."""
        return ", ".join(self.devices)

    def device_function(self):
        """A device function for the ops placed nowhere else while a graph is built (None: TensorFlow's choice)."""
        return None

    def session_config(self) -> tf.compat.v1.ConfigProto:
        """The session's options: one set for every program (training, evaluation, predict's sampling and
        scoring). On CPU devices grappler's remapper stays off. It fuses a matmul and the bias added to it into one
        oneDNN kernel, which for decoding's matrix-vector products is slower than the product and the add: 6.9 ->
        6.5 ms a token with it off (bench/bench_decode.py's model, prompt 16, 9 of 9 paired runs, on a 2-core AVX2
        CPU); in training and evaluation it fuses nothing (the step's partition graphs hold the same ops with it
        on or off) and costs start-up only, as do the passes `lean_grappler` turns off. Predict's programs ran
        with those passes until 2026-12-06: without them their first calls (7 in a run of bench_harness.py's
        tasks) took 13% less, and decoding's time a token moved by less than its run-to-run noise."""
        # Soft placement: ops with no GPU kernel run on the CPU (training lists them once, devices/gpus.py)
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True, device_count={"CPU": self.cpu_devices})
        gpus.session_gpu_options(config, self)  # only the --gpu_ids GPUs, their memory setting; none for CPUs
        if self.devices and all("CPU" in d.upper() for d in self.devices):
            rewrites = config.graph_options.rewrite_options
            rewrites.remapping = rewrites.OFF  # the RewriterConfig message's own enum: no TF-internal import
            lean_grappler(rewrites)
        return config

    def mesh(self, cfg):
        """(mtf.Mesh, its implementation) for a program of `cfg` on these devices (execution/meshes.py)."""
        return meshes.placement_mesh(cfg, self)

    def steps(self, make_inputs: Callable, build: Callable, steps_per_call: int):
        """Builds `build(make_inputs())` (a step, meshes.Lowered) in the default graph; returns what runs it:
        one step per session call (execution/runner.py)."""
        with tf.compat.v1.device(self.device_function()):
            return runner.StepPerCall(build(make_inputs()))

    def stop_watcher(self) -> StopOnSignal:
        """What stops training after a step: Ctrl-C and SIGTERM to this process (execution/preemption.py)."""
        return StopOnSignal()

    def peak(self, dtype: str, seconds: float = peaks.PEAK_SECONDS) -> peaks.Peak:
        """One mesh device's peak FLOP/s in `dtype`, for MFU (devices/peaks.py)."""
        return peaks.device_peak(self, dtype, self.session_config(), seconds=seconds)

    def start_up(self, plain_kernels: bool = False, xla: bool = False, precision: str = "float32",
                 tf32: bool = False) -> "Placement":
        """This placement with the fused kernels' path asked for (`plain_kernels`: plain TF ops, not XLA-compiled;
        `xla`: XLA auto-clustering is on, which needs XLA:GPU on GPUs); on GPUs also float32 matmuls in float32
        unless `tf32` (the config's allow_tf32) asks for TF32, the start-up line and the XLA:GPU check, which may
        choose plain kernels (devices/gpus.py, in the precision that trains there: "auto" resolved); on CPU devices
        with TensorFlow's TPU build, which has no XLA:CPU, plain kernels with one line saying why."""
        placement = dataclasses.replace(self, kernels="plain" if plain_kernels else "xla")
        if placement.device_kind == "GPU":
            trains_in = precisions.for_placement(precision, placement).precision
            placement, _ = gpus.start_up(placement, placement.session_config(), xla_autoclustering=xla,
                                         precision=trains_in, tf32=tf32)
        elif placement.kernels == "xla" and tpu_access.tensorflow_distribution()[0] == "tensorflow-tpu":
            problem = xla_cpu_problem()
            if problem:
                print(f"note: XLA cannot compile for the CPU in tensorflow-tpu ({problem}): the fused kernels run as "
                      f"plain TensorFlow ops on the CPU devices", file=sys.stderr, flush=True)
                placement = dataclasses.replace(placement, kernels="plain")
        return placement

    def device_facts(self) -> dict:
        """What --selfcheck's report says of the devices."""
        facts = {"devices": list(self.devices), "kernels": self.kernels}
        if self.gpu is not None:
            facts["gpus"] = [dataclasses.asdict(g) for g in (self.gpu.facts.gpus if self.gpu.facts else ())]
            facts["physical_gpus"] = list(self.gpu.physical)
            facts["gpu_memory"] = str(self.gpu.memory)
        return facts


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
    named; making only the named GPUs visible, with `gpu_memory`: "growth" or a fraction, see devices/gpus.py).
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
    # only the named GPUs visible, with their memory setting; one line on what is missing (devices/gpus.py)
    setting = gpus.configure_gpus([index for _, index in parsed], gpu_memory)
    return Placement(devices=setting.names, gpu=setting if setting.memory else None, kernels=kernels)


def lean_grappler(rewrites) -> None:
    """Turns off what grappler spends on a CPU graph and buys nothing there (CPU sessions' `rewrites`, a
    RewriterConfig; Placement.session_config). Every new set of fetches (initialise, copy to the
    mesh's slices, the step, a save) runs grappler over its part of the graph, in time that grows with the graph
    and so with the mesh's devices. With these off the step's partition graphs hold the same ops as with TF's
    defaults, but for the Identity nodes the second pass of the model pruner would have removed (38 and a Const at
    bench_train's bench shape in fp32, 28 for the tiny model on `x:2,y:2`; the remapper and the other two off
    alone: the same ops, in fp32 and bf16), which cost ~1 µs a step each; the first session calls of the
    tiny model's training on `x:2,y:2` cost about 1 CPU s less (bench/bench_mesh_startup.py, mode `tfdefault`
    for TF's defaults; docs/speed.md). Off:

    - the meta-optimizer's second iteration (the first does every pass; the second only pruned Identity nodes);
    - the memory optimizer (swapping to the host and recomputation are for GPUs; it rewrote no node);
    - the layout optimizer (converts NCHW convolutions; these graphs have none).

    Kept: the TFG (MLIR) pipeline, which costs as much as the remapper and leaves the step's ops as they are, but
    without it a session kept a weight-sized copy of Adam's slots after the first step
    (tests/execution/test_mesh_session.py's check of the optimizer state's copies)."""
    rewrites.meta_optimizer_iterations = rewrites.ONE
    rewrites.memory_optimization = rewrites.NO_MEM_OPT
    rewrites.layout_optimizer = rewrites.OFF


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


# One device's peak FLOP/s for MFU (measured or from datasheets): devices/peaks.py.
