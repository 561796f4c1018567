"""Multi-host training on TensorFlow's own distributed runtime: a cluster of hosts, one server per host,
one placement mesh over all of their devices.

Every host runs `python main.py ... --cluster cluster.json --task_index I` (or `--workers h0:p,h1:p`).
Each starts a `tf.distribute.Server` for its entry of the cluster. Task 0, the chief, builds the one
training graph (in-graph replication, as mesh-tensorflow's placement mesh works): every mesh device is
`/job:worker/task:T/device:GPU:J` (or CPU), so slices and their ops run on the host that owns the device,
and the chief's session drives all of them through its server. Master variables are spread over the
hosts' CPUs (mesh-tensorflow's BalancedVariablePlacer); a checkpoint is saved by each host for the
variables it holds, so model_path must be storage every host sees at the same path (NFS, GCS).

The other tasks serve until the chief releases them: at exit (normal or by exception) the chief enqueues a
token on a queue that each worker's own device holds, the worker's blocking dequeue returns, and it exits.
The chief waits at most 30 s for those calls, then leaves all the same (`release_workers`).
A worker whose chief never comes gives up after --worker_timeout seconds; one whose chief answered and then
went away (killed, its host lost) leaves seconds later (devices/task_watch.py), exit code 3 for both.
A worker that ends before it is released (killed, its host gone) ends the chief with an error line
(devices/task_watch.py): TensorFlow would leave the chief's step waiting for it without a limit.

Preemption: SIGTERM on the chief stops training after the current step with a checkpoint (train/loop.py). A
worker that gets SIGTERM keeps serving (the chief's save needs it: each host saves the variables it holds), asks
the chief to stop by a token on a queue the chief's CPU holds (`ChiefStop` looks at it between steps), and
leaves with exit code 143 once the chief has saved and released it. So SIGTERM to any task, or to all of them
(SLURM's scancel and time limit, Kubernetes deleting the job), ends in one checkpoint and a resumable run.

A cluster file is JSON: {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, or TF_CONFIG's form
{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 0}} (then --task_index may be left out).

Launchers set the cluster in the environment, and `find` reads it when no --cluster/--workers is given
(those override it; --task_index overrides the environment's task): TF_CONFIG (Kubernetes' training operators,
Ray's TensorflowTrainer, Vertex AI: a "chief" or "master" entry is task 0, the "worker" entries follow), or
SLURM's variables under `srun` (the step's node list, SLURM_PROCID, the task count and tasks per node; task i of
a node listens on --cluster_port + i).
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import re
import signal
import sys
import threading
import time
import dataclasses
from dataclasses import dataclass
from typing import Optional

import models  # noqa: F401  (TensorFlow without Keras, the mesh-tensorflow alias: devices/__init__.py)
import tensorflow.compat.v1 as tf

from schema import ConfigError
from devices import gpus
from devices.task_watch import REFUSED, TaskWatch, missed
from devices.placement import DeviceError, DeviceRequest, Placement, configure, cpu_devices, normalize
from execution.preemption import DeferredSignal, StopOnSignal, exit_code, name as signal_name

JOB = "worker"
RELEASE_QUEUE = "gpt_cluster_release"
STOP_QUEUE = "gpt_cluster_stop"     # on the chief's CPU: a worker's SIGTERM (its task index) asks the chief to stop
_ADDRESS = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d+$")


@dataclass(frozen=True)
class Cluster:
    workers: tuple          # "host:port" per task, task 0 (the chief) first
    task_index: int
    source: str = ""        # where it came from, for the start-up line: "--workers", "TF_CONFIG", "SLURM job 42"

    @property
    def is_chief(self) -> bool:
        return self.task_index == 0

    @property
    def size(self) -> int:
        return len(self.workers)

    def cluster_def(self):
        return tf.train.ClusterSpec({JOB: list(self.workers)}).as_cluster_def()

    def task_device(self, task: int, local: str = "device:CPU:0") -> str:
        kind, index = normalize(local)
        return f"/job:{JOB}/replica:0/task:{task}/device:{kind}:{index}"

    def mesh_devices(self, local_devices: list) -> list:
        """Every host's local devices, host by host: the placement mesh's device list."""
        return [self.task_device(task, d) for task in range(self.size) for d in local_devices]

    def host_devices(self) -> list:
        """Each host's CPU: where master variables live."""
        return [self.task_device(task) for task in range(self.size)]


def _check(workers: list, task_index: Optional[int], source: str, origin: str = "") -> Cluster:
    if not isinstance(workers, list) or not workers or not all(isinstance(w, str) for w in workers):
        raise DeviceError(f"{source} must list the workers as \"host:port\" strings, task 0 (the chief) first")
    for w in workers:
        if not _ADDRESS.match(w):
            raise DeviceError(f"worker address {w!r} in {source} is not host:port")
    if len(set(workers)) != len(workers):
        raise DeviceError(f"{source} names a worker twice")
    if task_index is None:
        raise DeviceError(f"which worker is this? pass --task_index (0 for the chief, up to {len(workers) - 1})")
    if not 0 <= task_index < len(workers):
        raise DeviceError(f"--task_index {task_index} is not a worker of {source} (0..{len(workers) - 1})")
    return Cluster(tuple(workers), task_index, origin or source)


def from_file(path: str, task_index: Optional[int] = None) -> Cluster:
    if not os.path.isfile(path):
        raise DeviceError(f"cluster file {path} not found: write {{\"worker\": [\"host0:port\", \"host1:port\"]}}")
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise DeviceError(f"cluster file {path} is not valid JSON: {e.msg} at line {e.lineno}")
    if not isinstance(raw, dict):
        raise DeviceError(f"cluster file {path} must hold a JSON object")
    if "cluster" in raw:  # TF_CONFIG's form
        task = raw.get("task") or {}
        if task_index is None and isinstance(task.get("index"), int):
            task_index = task["index"]
        raw = raw["cluster"]
    extra = set(raw) - {JOB}
    if extra:
        raise DeviceError(f"cluster file {path} has jobs {sorted(extra)}: only \"{JOB}\" (one entry per host) "
                          f"is used; the chief is worker 0")
    return _check(raw.get(JOB), task_index, f"cluster file {path}")


def from_flags(workers: str, task_index: Optional[int]) -> Cluster:
    return _check([w.strip() for w in workers.split(",") if w.strip()], task_index, "--workers")


def from_tf_config(text: str, task_index: Optional[int] = None) -> Optional[Cluster]:
    """The cluster of a TF_CONFIG value (None when it names one task: one host). Its "chief" (or "master") task is
    task 0, its "worker" tasks follow in order."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise DeviceError(f"TF_CONFIG is not valid JSON ({e}): unset it, or pass --cluster FILE")
    spec = raw.get("cluster") if isinstance(raw, dict) else None
    if not isinstance(spec, dict):
        raise DeviceError('TF_CONFIG has no "cluster" object: it should read {"cluster": {"worker": ["host:port", '
                          '...]}, "task": {"type": "worker", "index": 0}}')
    chiefs = [job for job in ("chief", "master") if spec.get(job)]
    extra = sorted(set(job for job, tasks in spec.items() if tasks) - {"chief", "master", JOB})
    if extra or len(chiefs) > 1:
        raise DeviceError(f"TF_CONFIG has jobs {sorted(extra + chiefs[1:])}: training uses one chief (\"chief\" or "
                          f"\"master\") and \"worker\" tasks only (no parameter servers or evaluators)")
    leaders = list(spec[chiefs[0]]) if chiefs else []
    if len(leaders) > 1:
        raise DeviceError(f"TF_CONFIG's {chiefs[0]} lists {len(leaders)} tasks: a cluster has one chief")
    workers = leaders + list(spec.get(JOB) or [])
    if len(workers) < 2:
        return None
    if task_index is None:
        task = raw.get("task") or {}
        kind, index = task.get("type"), task.get("index", 0)
        if kind not in (JOB, "chief", "master") or not isinstance(index, int):
            raise DeviceError(f"TF_CONFIG's task {task!r} is not a task of its cluster: it needs "
                              f"{{\"type\": \"worker\" (or \"chief\"), \"index\": N}}")
        task_index = index + (len(leaders) if kind == JOB else 0)
    return _check(workers, task_index, "TF_CONFIG")


def expand_hostlist(text: str) -> list:
    """SLURM's compressed host list -> host names: "node[01-03,07],gpu-a1,rack[1-2]-n[1-2]" -> node01, node02,
    node03, node07, gpu-a1, rack1-n1, rack1-n2, rack2-n1, rack2-n2 (what `scontrol show hostnames` prints)."""
    hosts, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            if text[start:i].strip():
                hosts.extend(_expand_one(text[start:i].strip()))
            start = i + 1
    return hosts


def _expand_one(pattern: str) -> list:
    match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", pattern)
    if not match:
        return [pattern]
    head, ranges, tail = match.groups()
    names = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise DeviceError(f"SLURM node list {pattern!r} has a range {part!r} that is not numbers")
        for n in range(int(low), int(high or low) + 1):
            names.append(f"{head}{n:0{len(low)}d}")
    return [name + rest for name in names for rest in _expand_one(tail)] if tail else names


def tasks_per_node(text: str) -> list:
    """SLURM_TASKS_PER_NODE "2(x3),1" -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise DeviceError(f"SLURM tasks per node {text!r} is not understood")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


DEFAULT_PORT = 8888  # TensorFlow's SlurmClusterResolver's first port


def from_slurm(env, port: Optional[int] = None, task_index: Optional[int] = None) -> Optional[Cluster]:
    """The cluster of the tasks `srun` started (None outside srun, or for one task): the step's nodes in order,
    its tasks laid out on them as SLURM does by default (block distribution: a node's tasks are consecutive), and
    task i of a node listening on port + i."""
    def first(*names):
        return next((env[n] for n in names if env.get(n)), None)

    procid, ntasks = first("SLURM_PROCID"), first("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if procid is None or ntasks is None or int(ntasks) < 2:
        return None
    nodes = expand_hostlist(first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") or "")
    per_node = first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    counts = tasks_per_node(per_node) if per_node else [int(ntasks) // max(1, len(nodes))] * len(nodes)
    if len(counts) != len(nodes) or sum(counts) != int(ntasks):
        raise DeviceError(f"SLURM's environment does not add up: {int(ntasks)} tasks, nodes {nodes}, tasks per node "
                          f"{per_node!r}: launch with srun, or pass --workers")
    base = DEFAULT_PORT if port is None else port
    workers = [f"{node}:{base + i}" for node, count in zip(nodes, counts) for i in range(count)]
    job = first("SLURM_JOB_ID")
    return _check(workers, int(procid) if task_index is None else task_index, "SLURM's environment",
                  f"SLURM{' job ' + job if job else ''}")


def find(cluster_file: Optional[str] = None, workers: Optional[str] = None, task_index: Optional[int] = None,
         port: Optional[int] = None, on_tpu: bool = False, env=None) -> Optional[Cluster]:
    """The cluster named by --cluster (`cluster_file`) or --workers (with --task_index), else by the launcher's
    environment (TF_CONFIG, then SLURM's srun variables, task i of a node on `port` + i), or None for one host.
    `on_tpu`: the run is on a TPU, whose own hosts (Vertex sets TF_CONFIG there too) are not this cluster."""
    env = os.environ if env is None else env
    if cluster_file and workers:
        raise DeviceError("pass --cluster FILE or --workers LIST, not both")
    if cluster_file:
        return from_file(cluster_file, task_index)
    if workers:
        return from_flags(workers, task_index)
    if not on_tpu:
        found = None
        if env.get("TF_CONFIG"):
            found = from_tf_config(env["TF_CONFIG"], task_index)
        if found is None:
            found = from_slurm(env, port, task_index)
        if found is not None:
            return found
    if task_index is not None:
        raise DeviceError("--task_index needs --cluster FILE or --workers LIST")
    return None


def describe(cluster: Cluster) -> str:
    """The start-up line's account of the cluster: where it came from and which task this is."""
    role = "the chief" if cluster.is_chief else "a worker"
    return (f"cluster of {cluster.size} tasks from {cluster.source}: this is task {cluster.task_index} ({role}) at "
            f"{cluster.workers[cluster.task_index]}")


@dataclass(frozen=True)
class ClusterPlacement(Placement):
    """The chief's placement mesh over every host's devices (/job:worker/task:T/... names): its session drives them
    through `master`, the chief's server; master variables are spread over `hosts` (each host's CPU) and ops
    placed nowhere else run on `default_device` (the chief's CPU)."""
    master: str = ""
    hosts: tuple = ()
    default_device: Optional[str] = None

    @classmethod
    def matches(cls, request: DeviceRequest) -> bool:
        return request.cluster is not None

    @classmethod
    def from_request(cls, request: DeviceRequest, cfg=None) -> "ClusterPlacement":
        """The chief's: this host's server started, the placement over every host's devices (the workers are
        released when this process exits)."""
        cluster = request.cluster
        local = local_devices(request, cfg)
        configure(local)
        placement, _ = chief_placement(cluster, local, cfg.n_devices)
        print(f"chief of {cluster.size} hosts: mesh over {', '.join(placement.devices)}", flush=True)
        return placement

    @property
    def on_this_host(self) -> bool:
        return False

    @property
    def target(self) -> str:
        return self.master

    @property
    def n_hosts(self) -> int:
        return max(1, len(self.hosts))

    @property
    def variable_hosts(self) -> tuple:
        return self.hosts

    def device_function(self):
        """Puts ops on `default_device` only where no job, task or device was given: explicitly placed ops (mesh
        slices, master variables) keep theirs."""
        if not self.default_device:
            return None
        base = tf.DeviceSpec.from_string(self.default_device)
        return lambda op: base.make_merged_spec(tf.DeviceSpec.from_string(op.device or "")).to_string()

    def stop_watcher(self) -> "ChiefStop":
        """The chief also stops when one of its workers got SIGTERM (the stop queue, `ChiefStop`)."""
        return ChiefStop(self)

    def start_up(self, plain_kernels: bool = False, xla: bool = False, precision: str = "float32",
                 tf32: bool = False) -> "Placement":
        """The kernels' path asked for, and this host's float32 matmuls as the config asks (TF32 only with
        allow_tf32; each worker sets its own: `serve_worker`); the chief probes no GPUs of its workers."""
        gpus.set_tf32(tf32)
        return dataclasses.replace(self, kernels="plain" if plain_kernels else "xla")


def local_devices(request: DeviceRequest, cfg) -> list:
    """This host's devices of the mesh: --gpu_ids, else the mesh's share of CPU devices."""
    if request.gpu_ids:
        return list(request.gpu_ids)
    if cfg.n_devices % request.cluster.size:
        raise ConfigError(f"mesh_shape {cfg.mesh_shape!r} has {cfg.n_devices} devices, which {request.cluster.size} "
                          f"hosts cannot share evenly: pass --gpu_ids with the devices of each host")
    return cpu_devices(cfg.n_devices // request.cluster.size)


# ----------------------------------------------------------------------------------------------------
# Servers


def start_server(cluster: Cluster, local_devices: list):
    """This host's server, with as many CPU devices as local_devices names (device:CPU:i splits the CPU)."""
    cpus = max([normalize(d)[1] + 1 for d in local_devices if normalize(d)[0] == "CPU"] or [1])
    config = tf.ConfigProto(device_count={"CPU": cpus}, allow_soft_placement=True)
    try:
        return tf.distribute.Server(cluster.cluster_def(), job_name=JOB, task_index=cluster.task_index,
                                    config=config, start=True)
    except tf.errors.OpError as e:  # "Could not start gRPC server": most often the port is taken
        address = cluster.workers[cluster.task_index]
        port = int(address.rsplit(":", 1)[1])
        why = f"port {port} is in use by another process" if _port_taken(port) else e.message
        raise DeviceError(f"task {cluster.task_index} could not start its server at {address} ({why}): stop what "
                          f"holds the port, or give this task another one (in --workers or the cluster file; "
                          f"--cluster_port under SLURM)") from e


def _port_taken(port: int) -> bool:
    """Whether another process holds `port` on this host (a TF server listens on every interface)."""
    import socket
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def _release_queue(cluster: Cluster, task: int):
    with tf.device(cluster.task_device(task)):
        return tf.FIFOQueue(cluster.size, [tf.int32], shapes=[[]], shared_name=RELEASE_QUEUE,
                            name=f"release_{task}")


def _stop_queue(cluster_or_device):
    device = cluster_or_device.task_device(0) if isinstance(cluster_or_device, Cluster) else cluster_or_device
    with tf.device(device):
        return tf.FIFOQueue(64, [tf.int32], shapes=[[]], shared_name=STOP_QUEUE, name="stop_requests")


def serve_worker(request: DeviceRequest, cfg) -> int:
    """A worker (not the chief) of `request`'s cluster: serves this host's devices until the chief releases it;
    returns the process's exit code (see `serve`)."""
    local = local_devices(request, cfg)
    configure(local)
    gpus.set_tf32(bool(cfg.allow_tf32))  # this host's GPUs run the chief's float32 matmuls as the config asks
    return serve(request.cluster, start_server(request.cluster, local), request.worker_timeout)


# A non-chief's wait for the chief's release, in seconds, between looks at its signals.
RELEASE_WAIT = 0.25
# How long past --worker_timeout a worker leaves even if TensorFlow's call has not come back: in a cluster the
# runtime does not always honour a call's deadline (a session's creation or step waiting inside it on a task
# that never answers, tensorflow/tensorflow#14489), and a worker must not outlive its timeout by more than this.
WATCHDOG_GRACE = 5.0


def serve(cluster: Cluster, server, timeout: Optional[float], log=print) -> int:
    """A non-chief task: hold this host's devices for the chief until it releases us. 0 when released,
    3 when the timeout passed first or the chief is gone (it answered, then stopped: TaskWatch), 143 when
    released after a SIGTERM (which asked the chief to stop)."""
    log(f"worker {cluster.task_index} of {cluster.size} serving at {cluster.workers[cluster.task_index]}; "
        f"waiting for the chief ({cluster.workers[0]})", flush=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    me = f"/job:{JOB}/task:{cluster.task_index}"
    chief_gone = []  # (task, address, reason), once the chief has answered and then stopped (TaskWatch)
    with tf.Graph().as_default(), \
            DeferredSignal("the chief saves a checkpoint (it was asked to stop) and then releases this worker") as term, \
            _watchdog(cluster, timeout, term, log), \
            TaskWatch({0: cluster.workers[0]}, lambda *gone: chief_gone.append(gone)):
        dequeue = _release_queue(cluster, cluster.task_index).dequeue()
        # Only this task's devices: a session over the whole cluster would first wait for every other task.
        config = tf.ConfigProto(device_filters=[me])
        asked = False
        with tf.Session(server.target, config=config) as session:
            while True:
                if term.received and not asked:
                    asked = True
                    _ask_chief_to_stop(cluster, server, log)
                # A signal's handler runs between waits (the wait itself blocks in TensorFlow): a SIGTERM is seen,
                # and the chief asked to stop, within RELEASE_WAIT seconds (a wait: one call on this host's queue).
                wait = RELEASE_WAIT if deadline is None else min(RELEASE_WAIT, deadline - time.monotonic())
                wait_ms = max(1, int(wait * 1000))  # 0 would wait without a limit
                try:
                    session.run(dequeue, options=tf.RunOptions(timeout_in_ms=wait_ms))
                    if term.received:
                        log(f"worker {cluster.task_index}: released by the chief after {signal_name(term.received)}; "
                            f"exiting", flush=True)
                        return exit_code(term.received)
                    log(f"worker {cluster.task_index}: released by the chief", flush=True)
                    return 0
                except tf.errors.DeadlineExceededError:
                    if chief_gone:  # it cannot come back for this run: the step it ran needed this host
                        _, address, reason = chief_gone[0]
                        log(f"worker {cluster.task_index}: the chief ({address}) is gone: its server stopped "
                            f"answering ({reason}); exiting unreleased: start every task again to resume from the "
                            f"last checkpoint", flush=True)
                        return _unreleased_exit_code(term)
                    if deadline is not None and time.monotonic() >= deadline:
                        log(f"worker {cluster.task_index}: no release from the chief within {timeout:.0f} s; "
                            f"exiting", flush=True)
                        return _unreleased_exit_code(term)


def _unreleased_exit_code(term) -> int:
    """A worker leaving without its release: 3, or the code of the signal it got (143 after SIGTERM)."""
    return exit_code(term.received) if term.received else 3


@contextlib.contextmanager
def _watchdog(cluster: Cluster, timeout: Optional[float], term, log):
    """Ends the process (exit code 3, or the signal's) WATCHDOG_GRACE seconds after `timeout` unless the wait
    inside returns first: the timer's thread runs while TensorFlow's call, which releases the GIL, has not come
    back. Cancelled on leaving: released (or gave up) in time, the process may go on."""
    if timeout is None:
        yield
        return

    def leave():
        log(f"worker {cluster.task_index}: no release from the chief within {timeout:.0f} s, and TensorFlow's wait "
            f"did not return within {WATCHDOG_GRACE:.0f} s more; exiting", flush=True)
        exit_process(_unreleased_exit_code(term))

    timer = threading.Timer(timeout + WATCHDOG_GRACE, leave)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _ask_chief_to_stop(cluster: Cluster, server, log) -> None:
    """Puts this worker's index on the chief's stop queue (skipped with a line when the chief is gone). Its own
    graph: a session places every op of its graph, and the serving session sees this task's devices only."""
    with tf.Graph().as_default() as graph:
        enqueue = _stop_queue(cluster).enqueue(cluster.task_index)
    config = tf.ConfigProto(device_filters=[f"/job:{JOB}/task:0"], operation_timeout_in_ms=20000)
    try:
        with tf.Session(server.target, graph=graph, config=config) as session:
            session.run(enqueue, options=tf.RunOptions(timeout_in_ms=20000))
    except tf.errors.OpError as e:
        log(f"worker {cluster.task_index}: could not ask the chief to stop ({type(e).__name__}); still serving",
            flush=True)


class ChiefStop(StopOnSignal):
    """The chief's stop watch: its own SIGINT/SIGTERM, and a worker's SIGTERM (a token on the stop queue), looked
    at between steps at most every `interval` seconds."""

    def __init__(self, placement: ClusterPlacement, interval: float = 0.2, say=print):
        super().__init__(say)
        self._interval, self._last = interval, 0.0
        graph = tf.Graph()
        with graph.as_default():
            queue = _stop_queue(placement.default_device)
            self._size, self._take = queue.size(), queue.dequeue()
        task = placement.default_device.split("/device:")[0].replace("/replica:0", "")
        self._session = tf.Session(placement.master, graph=graph, config=tf.ConfigProto(device_filters=[task]))

    def poll(self) -> None:
        if time.monotonic() - self._last < self._interval:
            return
        self._last = time.monotonic()
        try:
            if self._session.run(self._size, options=tf.RunOptions(timeout_in_ms=10000)):
                task = self._session.run(self._take, options=tf.RunOptions(timeout_in_ms=10000))
                self.request(signal.SIGTERM, f" on worker {task}")
        except tf.errors.OpError:
            pass  # the queue could not be read this time; the next step looks again

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._session.close()


# How long a leaving chief waits, in all, for its workers to take their releases.
RELEASE_TIMEOUT_S = 30.0


def release_workers(cluster: Cluster, server, timeout_s: Optional[float] = None) -> None:
    """The chief: tell every other task it may exit, waiting at most `timeout_s` in all. The releases run on a
    thread of their own that the chief stops waiting for: TensorFlow blocks without a limit when a worker is
    gone (a new session's creation waits for every task, and closing a session whose call failed with
    UnavailableError retries the task), and a chief leaving (main.leave, os._exit) must not wait on that. A worker
    not released leaves at its --worker_timeout."""
    if cluster.size < 2:
        return
    timeout_s = RELEASE_TIMEOUT_S if timeout_s is None else timeout_s
    answered = threading.Event()

    def release():
        with tf.Graph().as_default():
            enqueues = [_release_queue(cluster, task).enqueue(0) for task in range(1, cluster.size)]
            session = tf.Session(server.target, config=tf.ConfigProto(allow_soft_placement=True))
            failed = False
            for task, op in enumerate(enqueues, start=1):
                try:
                    session.run(op, options=tf.RunOptions(timeout_in_ms=int(timeout_s * 1000)))
                except tf.errors.OpError as e:  # a worker that ended first (even just after taking its release)
                    failed = True
                    print(f"could not release worker {task} ({type(e).__name__}): it has ended or cannot be "
                          f"reached", file=sys.stderr, flush=True)
            answered.set()
            if not failed:  # a failed session's close can block (above); the process is leaving anyway
                session.close()

    threading.Thread(target=release, name="release_workers", daemon=True).start()
    if not answered.wait(timeout_s):
        print(f"could not release the workers within {timeout_s:.0f} s (a worker is gone or cannot be reached); "
              f"leaving: a worker not released leaves at its --worker_timeout", file=sys.stderr, flush=True)


# The (cluster, server, watch) of each cluster this process leads as the chief, until its workers are released.
_held: list = []


def release_held_workers() -> bool:
    """Releases the workers this process holds as a chief (each cluster once: at `leave` or, failing that, at
    exit). True when this process started a chief's server: a TF gRPC server cannot be shut down, and interpreter
    shutdown can block on its threads, so such a process leaves with os._exit (main.leave)."""
    held = bool(_held)
    while _held:
        cluster, server, watch = _held.pop()
        watch.stop()  # released workers end: no longer a failure
        release_workers(cluster, server)
    return held


def _worker_gone(task: int, address: str, reason: str) -> None:
    """The chief's end when a worker it holds is gone (TaskWatch, or a session call that failed for it:
    `lost_task`): its step cannot finish, nor can a save. The other workers leave when they find the chief gone."""
    print(f"error: worker {task} ({address}) is gone: its server stopped answering ({reason}), and the chief cannot "
          f"go on without its devices and the variables it holds: start every task again to resume from the last "
          f"checkpoint", file=sys.stderr, flush=True)
    exit_process(1)


# A session call's UnavailableError names the tasks whose calls failed ("UNAVAILABLE: From
# /job:worker/replica:0/task:1:\nSocket closed"), the chief's own (task 0) among them when a transfer to it broke off
_LOST = re.compile(r"From /job:\w+/replica:\d+/task:(\d+):\s*\n?\s*([^\n]+)")
PROBES, PROBE_INTERVAL_S = 3, 0.5  # a dying worker's port may take a moment to close
PROBE_TIMEOUT_S = 1.0              # per connection: a host that is down must not hold the chief's end for long


def lost_task(error: tf.errors.UnavailableError) -> Optional[str]:
    """The chief's end when one of its session calls failed with UnavailableError, as a step does when a worker is
    killed while the step waits on it (the other way it goes is a step that waits for good: TaskWatch). A worker
    the error names (any worker, if it names none) that now refuses connections ends the chief as the watch would
    (`_worker_gone`: its line, exit code 1, no release). Otherwise the line for main.py to print; None in a process
    that leads no cluster."""
    if not _held:
        return None
    cluster = _held[-1][0]
    named = [(int(task), said.strip()) for task, said in _LOST.findall(error.message or "")
             if 0 < int(task) < cluster.size]
    probed = sorted({task for task, _ in named}) or range(1, cluster.size)
    for round_ in range(PROBES):
        if round_:
            time.sleep(PROBE_INTERVAL_S)
        for task in probed:
            if missed(cluster.workers[task], PROBE_TIMEOUT_S) == REFUSED:
                _worker_gone(task, cluster.workers[task], REFUSED)
    said = (f"task {named[0][0]}: {named[0][1]}" if named
            else next((line.strip() for line in (error.message or "").splitlines() if line.strip()), "no message"))
    return (f"a task of the cluster could not be reached during a session call ({said}): check that every task is "
            f"running and that the hosts reach each other, then start every task again to resume from the last "
            f"checkpoint")


def chief_placement(cluster: Cluster, local_devices: list, mesh_devices_expected: int):
    """Task 0: starts this host's server, checks the mesh size, and returns the Placement that trains over
    the whole cluster. The workers are released when main.py leaves (`release_held_workers`)."""
    mesh_devices = cluster.mesh_devices(local_devices)
    if len(mesh_devices) != mesh_devices_expected:
        raise DeviceError(f"the mesh has {mesh_devices_expected} devices but the cluster has {len(mesh_devices)} "
                          f"({cluster.size} hosts x {len(local_devices)} devices each): change --mesh_shape or "
                          f"the devices per host (--gpu_ids)")
    server = start_server(cluster, local_devices)
    if not _held:
        atexit.register(release_held_workers)
    watch = TaskWatch({task: cluster.workers[task] for task in range(1, cluster.size)}, _worker_gone).start()
    _held.append((cluster, server, watch))
    return ClusterPlacement(devices=tuple(mesh_devices), master=server.target, hosts=tuple(cluster.host_devices()),
                            default_device=cluster.task_device(0)), server


def exit_process(code: int) -> None:
    """Ends this process now. A TF gRPC server cannot be shut down cleanly, and interpreter shutdown can
    block on its threads, so a process that started one leaves with os._exit after flushing its output."""
    from console.stderr_filter import restore
    sys.stdout.flush()
    sys.stderr.flush()
    restore()  # the console filter passes on what it holds
    os._exit(code)
