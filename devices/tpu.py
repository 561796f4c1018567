"""--tpu NAME (or --tpu colab): mesh-tensorflow's SIMD mesh run on a TPU through `tf.compat.v1.tpu` directly.

What the TPUEstimator did for GPT-Neo, in the pieces this project needs, each buildable without a TPU
(tests/devices/test_tpu.py builds every graph below on fake v3-8, v3-32 and v3-512 topologies):

* `connect`: the TPU is checked for (devices/tpu_access.py: one line on what is missing), found with
  TPUClusterResolver, its system initialised once, and its topology read back: a `TpuSystem` (hosts, cores,
  device assignment; the hosts' job is the resolver's: localhost on a TPU VM, worker on a TPU Node).
* The device assignment gives every core one replica (one mesh position; `DeviceAssignment.build` with a
  1x1x1x1 computation, as TPUEstimator's num_cores_per_replica=1 did). `logical_to_physical` maps logical
  mesh positions to physical cores so that the last mesh dimension's neighbours share a chip
  (mesh-tensorflow's auto_logical_to_physical_tpu; lexicographic where it has no answer).
* `variable_placer`: master variables spread over the TPU hosts' CPUs, the first host counted as already
  holding the compiled program's cache (300 MB per replica). Checkpoints are saved from there.
* `ReplicatedLoop`: one program run on every core, `count` times per session call: each iteration dequeues
  its inputs from the core's infeed, runs the mode's step on the SIMD mesh, and enqueues its scalars (or
  prediction arrays) on the core's outfeed. The inputs are broadcast: the input pipeline runs once, on the
  first host, with the whole batch, and the same batch is enqueued to every core, which keeps the slice its
  layout gives it (mesh-tensorflow's import_fully_replicated). A host thread feeds the infeed while another
  drains the outfeed, as TPUEstimator's infeed/outfeed controllers did.
* `TpuPlacement`: the placement of a TPU (devices/placement.py's questions answered for it). The jobs' steps run
  through execution/runner.py in that loop (`LoopSteps`): training up to `iterations` steps per session call (a
  variable sets how many, so one compiled program serves the shorter loops before a checkpoint; progress per
  step from the outfed scalars, checkpoints from the hosts), evaluation's batches in one call, prediction one
  fed batch per call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

import models  # noqa: F401  (TensorFlow without Keras, the mesh-tensorflow alias: devices/__init__.py)
import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from devices import gpus, peaks, tpu_access
from execution import meshes
from devices.placement import DeviceRequest, Placement
from devices.errors import DeviceError
from schema import ConfigError, GPTConfig

REPLICA_CACHE_BYTES = 300_000_000  # per replica, held by the first host (GPT-Neo's estimate)


@dataclass(frozen=True)
class TpuSystem:
    """What the program needs to know about the TPU: its topology and the hosts' job."""
    topology: object               # tf.tpu.experimental.Topology
    job: str = "worker"
    master: str = ""
    cluster_def: object = None     # tf.train.ClusterDef of the TPU's hosts, for the session

    @property
    def num_cores(self) -> int:
        return int(np.prod(self.topology.mesh_shape))

    @property
    def num_hosts(self) -> int:
        return int(self.topology.num_tasks)

    @property
    def physical_shape(self) -> list:
        return [int(s) for s in self.topology.mesh_shape]

    def device_assignment(self) -> tf.tpu.experimental.DeviceAssignment:
        """One replica per core (TPUEstimator's num_cores_per_replica=1)."""
        return tf.tpu.experimental.DeviceAssignment.build(
            self.topology, computation_shape=[1] * self.topology.mesh_rank, num_replicas=self.num_cores)

    def host_device(self, host: int) -> str:
        return f"/job:{self.job}/task:{host}/device:CPU:0"

    def host_devices(self) -> list:
        return [self.host_device(h) for h in range(self.num_hosts)]


def resolver(want: tpu_access.Target):
    """TPUClusterResolver for the checked target; its job name is the TPU hosts' job (localhost on a TPU VM,
    worker on a TPU Node)."""
    return tf.distribute.cluster_resolver.TPUClusterResolver(want.address, job_name=want.job)


def initialize_system(master: str, config: tf.ConfigProto, job: str) -> bytes:
    """Initialises the TPU system (once per run); returns its serialized topology."""
    with tf.Graph().as_default(), tf.Session(master, config=config) as session:
        return session.run(tf.tpu.initialize_system(job=job))


def connect(want: tpu_access.Target, timeout: float = tpu_access.DEFAULT_TIMEOUT) -> TpuSystem:
    """Finds the TPU (checked by devices/tpu_access.py), initialises its system and reads its topology; what
    TensorFlow reports on the way is one DeviceError line."""
    try:
        found = resolver(want)
        cluster_spec = found.cluster_spec()
        master = found.master()
    except (ValueError, RuntimeError, ImportError, OSError) as e:  # the Cloud TPU API lookup of a name
        raise DeviceError(f"--tpu {want.given}: the TPU could not be looked up ({_first_line(e)}): check its name, "
                          f"zone and project, or pass its address as grpc://HOST:8470")
    job = found.get_job_name()
    config = tf.ConfigProto(allow_soft_placement=True, operation_timeout_in_ms=int(timeout * 1000))
    if cluster_spec:
        config.cluster_def.CopyFrom(cluster_spec.as_cluster_def())
    try:
        serialized = initialize_system(master, config, job)
    except tf.errors.OpError as e:
        raise DeviceError(f"--tpu {want.given}: TensorFlow could not initialise the TPU system on /job:{job} "
                          f"({gpus.first_line(e.message)}); `python main.py --selfcheck --tpu {want.given}` reports the "
                          f"stack and device facts for an issue")
    topology = tf.tpu.experimental.Topology(serialized=serialized)
    return TpuSystem(topology, job, master, cluster_spec.as_cluster_def() if cluster_spec else None)


def _first_line(error) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:240]


@dataclass(frozen=True, kw_only=True)
class TpuPlacement(Placement):
    """A TPU's SIMD mesh (mesh-tensorflow's SimdMeshImpl, one replica per core), run in the replicated loop below;
    its master variables on the TPU hosts' CPUs."""
    tpu: str                                        # --tpu's argument
    system: TpuSystem                               # the TPU's topology and hosts
    facts: Optional[tpu_access.TpuFacts] = None     # the stack and machine it was reached from

    op_listing: ClassVar[Optional[str]] = "not listed on TPUs (XLA compiles the whole step, or fails)"
    whole_outputs: ClassVar[bool] = True  # the SIMD mesh exports only tensors whole on every core
    # Each program runs in a replicated loop of its own, whose count variable it sets as it goes (LoopSteps), with
    # its own infeed and outfeed: kept in a graph and session of its own, with its own copy of the weights.
    programs_share_weights: ClassVar[bool] = False

    @classmethod
    def matches(cls, request: DeviceRequest) -> bool:
        return bool(request.tpu)

    @classmethod
    def from_request(cls, request: DeviceRequest, cfg=None) -> "TpuPlacement":
        return placement(request.tpu, request.tpu_timeout)

    @property
    def device_kind(self) -> str:
        return "TPU"

    @property
    def n_devices(self) -> int:
        return self.system.num_cores

    @property
    def on_this_host(self) -> bool:
        return False

    @property
    def target(self) -> str:
        return self.system.master

    @property
    def hosts(self) -> tuple:
        return tuple(self.system.host_devices())

    @property
    def n_hosts(self) -> int:
        return self.system.num_hosts

    @property
    def variable_hosts(self) -> tuple:
        return self.hosts

    def describe(self) -> str:
        return f"TPU {self.tpu}"

    def session_config(self) -> tf.ConfigProto:
        config = tf.ConfigProto(allow_soft_placement=True, isolate_session_state=True)
        if self.system.cluster_def is not None:
            config.cluster_def.CopyFrom(self.system.cluster_def)
        return config

    def mesh(self, cfg: GPTConfig):
        return simd_mesh(cfg, self.system)

    def steps(self, make_inputs: Callable, build: Callable, steps_per_call: int) -> "LoopSteps":
        return LoopSteps(self.system, make_inputs, build, steps_per_call)

    def peak(self, dtype: str, seconds: float = peaks.PEAK_SECONDS) -> peaks.Peak:
        return peaks.Peak(0.0, "unknown for TPUs: pass --peak_tflops (one core's peak) for MFU")

    def start_up(self, plain_kernels: bool = False, xla: bool = False, precision: str = "float32",
                 tf32: bool = False) -> Placement:
        return dataclasses.replace(self, kernels="plain" if plain_kernels else "xla")  # TPUs have no TF32

    def device_facts(self) -> dict:
        facts = dict(super().device_facts(), tpu=self.tpu)
        if self.facts is not None:
            facts["tpu_facts"] = dataclasses.asdict(self.facts)
        facts.update(tpu_cores=self.system.num_cores, tpu_hosts=self.system.num_hosts,
                     tpu_topology=self.system.physical_shape)
        return facts


def placement(tpu: str, timeout: float = tpu_access.DEFAULT_TIMEOUT) -> TpuPlacement:
    """The Placement on the TPU `tpu` (--tpu's argument): checked, connected, its system initialised."""
    want, facts = tpu_access.check(tpu, timeout)
    return TpuPlacement(tpu=tpu, system=connect(want, timeout), facts=facts)


# ----------------------------------------------------------------------------------------------------
# The SIMD mesh


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


def variable_placer(system: TpuSystem) -> mtf.utils.BalancedVariablePlacer:
    hosts = system.host_devices()
    return mtf.utils.BalancedVariablePlacer(hosts, [REPLICA_CACHE_BYTES * system.num_cores] + [0] * (len(hosts) - 1))


def simd_mesh_arguments(cfg: GPTConfig, system: TpuSystem, assignment=None) -> dict:
    """The arguments of SimdMeshImpl for this config on this TPU."""
    shape = mtf.convert_to_shape(cfg.mesh_shape)
    if shape.size != system.num_cores:
        raise ConfigError(f"mesh_shape {cfg.mesh_shape!r} has {shape.size} devices but the TPU has "
                          f"{system.num_cores} cores: use a mesh of {system.num_cores} (e.g. --mesh_shape "
                          f"x:{system.num_cores} --layout batch:x, or --auto_layout_and_mesh_shape --num_devices "
                          f"{system.num_cores})")
    assignment = assignment or system.device_assignment()
    return dict(shape=shape, layout=mtf.convert_to_layout_rules(cfg.layout), device_assignment=assignment,
                logical_to_physical=logical_to_physical(shape.to_integer_list, system.physical_shape, assignment))


def simd_mesh(cfg: GPTConfig, system: TpuSystem, assignment=None):
    """(mtf.Mesh with the hosts' variable placer, SimdMeshImpl) for a program on this TPU."""
    impl = meshes.SlicedSimdMeshImpl(**simd_mesh_arguments(cfg, system, assignment))
    return meshes.new_mesh(variable_placer(system)), impl


# ----------------------------------------------------------------------------------------------------
# The replicated loop


class ReplicatedLoop:
    """`step(inputs) -> (outputs, op)` run on every core of the TPU, `count` times per session call.

    `inputs` are tensors on the first host (an iterator's next element, or placeholders fed per call): each
    iteration they are enqueued, whole, to every core's infeed (broadcast) and dequeued inside the program.
    `outputs` (a dict of tensors of static shape) are enqueued on each core's outfeed after `op` (the train op,
    or nothing) and read back on the hosts; the values of the first replica are returned (every replica
    computes the same scalars; mesh outputs are exported whole on every core)."""

    def __init__(self, system: TpuSystem, inputs: list, step: Callable, count: Optional[tf.Variable] = None):
        self.system = system
        self.assignment = system.device_assignment()
        n = system.num_cores
        self.count = count
        shapes = [t.shape.as_list() for t in inputs]
        dtypes = [t.dtype for t in inputs]
        self.enqueue_ops = []
        for replica in range(n):  # broadcast: the same tensors to every core, from the core's own host
            with tf.device(self.assignment.host_device(replica=replica, job=system.job)):
                self.enqueue_ops.append(tf.raw_ops.InfeedEnqueueTuple(
                    inputs=inputs, shapes=shapes, device_ordinal=self.assignment.tpu_ordinal(replica=replica)))
        built = {}

        def one_iteration(i):
            dequeued = tf.raw_ops.InfeedDequeueTuple(dtypes=dtypes, shapes=shapes)
            outputs, op = step(list(dequeued))
            built.setdefault("outputs", outputs)
            names = sorted(outputs)
            outfeed = tf.raw_ops.OutfeedEnqueueTuple(inputs=[outputs[k] for k in names])
            with tf.control_dependencies([outfeed] + ([op] if op is not None else [])):
                return i + 1

        def program():
            limit = self.count.read_value() if self.count is not None else 1
            return tf.while_loop(lambda i: i < limit, one_iteration, [tf.constant(0)], name="loop")

        with _control_flow_v1():
            results = tf.tpu.replicate(program, inputs=[[]] * n, device_assignment=self.assignment)
        self.loop_op = tf.group([r[0] if isinstance(r, (list, tuple)) else r for r in results])
        self.names = sorted(built["outputs"])
        out_dtypes = [built["outputs"][k].dtype for k in self.names]
        out_shapes = [built["outputs"][k].shape.as_list() for k in self.names]
        self.dequeue_ops = []
        for replica in range(n):  # every core's outfeed is drained, or the cores would block on it
            with tf.device(self.assignment.host_device(replica=replica, job=system.job)):
                self.dequeue_ops.append(tf.raw_ops.OutfeedDequeueTuple(
                    dtypes=out_dtypes, shapes=out_shapes, device_ordinal=self.assignment.tpu_ordinal(replica=replica)))

    def run(self, session, count: int, feed_dict=None) -> list:
        """Runs `count` iterations (the loop's count variable must already say so); per iteration the first
        replica's outputs as a dict."""
        results, errors = [], []

        def feed():
            try:
                for _ in range(count):
                    session.run(self.enqueue_ops, feed_dict=feed_dict)
            except Exception as e:  # noqa: BLE001  (re-raised in the calling thread)
                errors.append(e)

        def drain():
            try:
                for _ in range(count):
                    values = session.run(self.dequeue_ops)
                    results.append(dict(zip(self.names, values[0])))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=drain, daemon=True)]
        for t in threads:
            t.start()
        session.run(self.loop_op)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


@contextlib.contextmanager
def _control_flow_v1():
    """TF 1's while loop for the program: mesh-tensorflow creates the SIMD mesh's slice variables while it
    lowers the step, inside the loop body, and lifts their initial values out of the loop with
    `control_dependencies(None)`, which leaves a v1 loop's context but not a v2 loop's function graph."""
    before = tf.control_flow_v2_enabled()  # TF's public switch (not its internal flag)
    tf.disable_control_flow_v2()
    try:
        yield
    finally:
        if before:
            tf.enable_control_flow_v2()


def count_variable(initial: int) -> tf.Variable:
    """How many iterations the next session call runs: a variable the program reads, so the same
    compiled program runs a full loop of `iterations` steps and the shorter one before a checkpoint."""
    return tf.get_variable("iterations_per_loop", shape=[], dtype=tf.int32, trainable=False, use_resource=True,
                           initializer=tf.constant_initializer(initial), collections=[tf.GraphKeys.LOCAL_VARIABLES])


class LoopSteps:
    """A job's step in the replicated loop, up to `steps_per_call` steps per session call (the loop's count is a
    variable, so one compiled program also runs the shorter loops before a checkpoint). The global step and
    the count are left unplaced, as TPUEstimator left them: the program reads both (training increments the
    step). The inputs are made on the first host (the input pipeline runs there, or the feeds are fed there)."""

    def __init__(self, system: TpuSystem, make_inputs: Callable, build: Callable, steps_per_call: int):
        self.steps_per_call = steps_per_call
        tf.train.get_or_create_global_step()
        self.count = count_variable(steps_per_call)
        self._count_value = tf.placeholder(tf.int32, [])
        self._set_count = self.count.assign(self._count_value)
        self._count_now = steps_per_call
        with tf.device(system.host_device(0)):
            inputs = make_inputs()
        lowered = []

        def step(dequeued):
            lowered.append(build(tf.nest.pack_sequence_as(inputs, dequeued)))
            return lowered[-1].outputs, lowered[-1].train_op

        self.loop = ReplicatedLoop(system, tf.nest.flatten(inputs), step, self.count)
        self.lowered = lowered[0]

    def run(self, session, steps: int, feed_dict=None) -> list:
        """`steps` steps, up to steps_per_call in each session call; each step's outputs."""
        results = []
        while steps > 0:
            count = min(steps, self.steps_per_call)
            if count != self._count_now:
                session.run(self._set_count, {self._count_value: count})
                self._count_now = count
            results += self.loop.run(session, count, feed_dict=feed_dict)
            steps -= count
        return results
