"""--tpu: everything up to the hardware edge, on fake v3-8, v3-32 and v3-512 topologies.

A TPU system reports its topology (which core sits where, on which host) when it is initialised. Here the
topology is built by hand (TF's Topology and DeviceAssignment are plain Python), and every graph the TPU
would run is built on it without running: the device assignment, the logical-to-physical mapping, the
replicated training loop with its broadcast infeed and its outfeed, where master and slice variables live,
and the layout's split of every tensor of the training graph on the SIMD mesh.
"""
import math
from collections import Counter

import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from plan import model_graph
from evals import validation
from infer import run
from execution import runner
from devices import tpu
from train import loop as training_loop
from devices.placement import Placement
from schema import ConfigError
from tiny import tiny_config

PODS = {"v3-8": ([2, 2, 1, 2], 8), "v3-32": ([4, 4, 1, 2], 8), "v3-512": ([16, 16, 1, 2], 8)}


def fake_topology(mesh_shape, cores_per_host=8):
    """The topology a pod whose mesh_shape is [x, y, z, cores_per_chip] reports, hosts in order."""
    x, y, z, c = mesh_shape
    coords = [(i, j, k, core) for k in range(z) for j in range(y) for i in range(x) for core in range(c)]
    n = len(coords)
    hosts = max(1, n // cores_per_host)
    return tf.tpu.experimental.Topology(mesh_shape=list(mesh_shape),
                                        device_coordinates=np.array(coords, np.int32).reshape(hosts, n // hosts, 4))


def fake_placement(pod: str) -> Placement:
    system = tpu.TpuSystem(fake_topology(*PODS[pod]), job="worker", master="grpc://10.0.0.0:8470")
    return tpu.TpuPlacement(tpu=pod, system=system)


def batches(cfg):
    return runner.fixed_batches(np.zeros([2 * cfg.train_batch_size, cfg.n_ctx + 1], np.int32), cfg.train_batch_size)


def _chip(pnum, physical):
    """(row, column) of the chip holding physical core pnum, in mtf's 3-D view [y*z, x, cores]."""
    x, y, z, c = physical
    chip = pnum // c
    return chip // x, chip % x


@pytest.mark.parametrize("physical,logical", [
    ([2, 2, 1, 2], [8]), ([2, 2, 1, 2], [4, 2]), ([2, 2, 1, 2], [2, 4]),     # v2-8 / v3-8
    ([4, 4, 1, 2], [32]), ([4, 4, 1, 2], [16, 2]), ([4, 4, 1, 2], [4, 8]),    # v3-32
    ([16, 16, 1, 2], [64, 8]), ([16, 16, 1, 2], [128, 4]),                   # v3-512 (gpt3_13B's x:64,y:8)
])
def test_logical_to_physical_keeps_the_last_mesh_dimension_close(physical, logical):
    mapping = tpu.logical_to_physical(logical, physical)
    n = math.prod(physical)
    assert sorted(mapping) == list(range(n))
    # Neighbours along the last (fastest) logical dimension share a chip: its all-reduce stays on-chip first.
    if logical[-1] % 2 == 0:
        for k in range(0, n, 2):
            assert mapping[k] // physical[3] == mapping[k + 1] // physical[3]
    if len(logical) == 1:  # a ring: consecutive chips are torus neighbours, the last wraps to the first
        rows, cols = physical[1] * physical[2], physical[0]
        chips = [_chip(mapping[k], physical) for k in range(0, n, physical[3])]
        for (a, b), (c, d) in zip(chips, chips[1:] + chips[:1]):
            assert min(abs(a - c), rows - abs(a - c)) + min(abs(b - d), cols - abs(b - d)) == 1


def test_logical_to_physical_falls_back_and_checks_sizes():
    # One core per chip (mesh-tensorflow's heuristic expects two and has no answer): lexicographic order.
    assert tpu.logical_to_physical([2, 2], [2, 2, 1, 1]) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="has 16 devices but the TPU has 8 cores"):
        tpu.logical_to_physical([16], [2, 2, 1, 2])


@pytest.mark.parametrize("pod", list(PODS))
def test_device_assignment_gives_every_core_one_replica_on_its_own_host(pod):
    system = fake_placement(pod).system
    physical, per_host = PODS[pod]
    cores = math.prod(physical)
    assert (system.num_cores, system.num_hosts) == (cores, cores // per_host)
    assignment = system.device_assignment()
    assert assignment.num_replicas == cores and assignment.num_cores_per_replica == 1
    assert len({assignment.coordinates(r, 0) for r in range(cores)}) == cores  # each core once
    topology = system.topology
    for r in range(cores):
        task = topology.task_ordinal_at_coordinates(assignment.coordinates(r, 0))
        assert assignment.host_device(replica=r, job=system.job) == f"/job:worker/task:{task}/device:CPU:0"
        assert 0 <= assignment.tpu_ordinal(replica=r) < per_host
    assert system.host_devices() == [f"/job:worker/task:{h}/device:CPU:0" for h in range(cores // per_host)]


@pytest.mark.slow
def test_training_loop_on_a_v3_32_pod():
    placement = fake_placement("v3-32")
    system = placement.system
    cfg = tiny_config(mesh_shape="x:16,y:2", layout="batch:x,heads:y", train_batch_size=32, iterations=5)
    loop = training_loop.training_program(cfg, placement, batches(cfg), start_step=0)
    ops = loop.graph.get_operations()
    assert loop.steps_per_call == 5

    # One program replicated over the 32 cores, with the device assignment's layout.
    metadata = [op for op in ops if op.type == "TPUReplicateMetadata"]
    assert len(metadata) == 1 and metadata[0].get_attr("num_replicas") == 32
    assignment = loop.driver.loop.assignment

    # Broadcast infeed: the input pipeline runs on host 0 and the whole batch goes to every core from the
    # core's own host; each core has an outfeed that its host drains.
    pipeline = [op for op in ops if op.type in ("IteratorV2", "IteratorGetNext")]
    assert pipeline and all(op.device == "/job:worker/task:0/device:CPU:0" for op in pipeline)
    next_batch = [op for op in ops if op.type == "IteratorGetNext"][0]
    enqueues = [op for op in ops if op.type == "InfeedEnqueueTuple"]
    dequeues = [op for op in ops if op.type == "OutfeedDequeueTuple"]
    assert len(enqueues) == len(dequeues) == 32
    for replica, (enqueue, dequeue) in enumerate(zip(enqueues, dequeues)):
        host = assignment.host_device(replica=replica, job="worker")
        assert enqueue.device == dequeue.device == host
        assert enqueue.get_attr("device_ordinal") == dequeue.get_attr("device_ordinal") == \
            assignment.tpu_ordinal(replica=replica)
        assert [t.op for t in enqueue.inputs] == [next_batch, next_batch]
        assert [tf.TensorShape(s).as_list() for s in enqueue.get_attr("shapes")] == [[32, 16], [32, 16]]
    assert Counter(op.device for op in enqueues) == {f"/job:worker/task:{h}/device:CPU:0": 8 for h in range(4)}
    assert sorted(loop.driver.loop.names) == ["grad_norm", "learning_rate", "loss", "objective"]

    # Master variables on the hosts' CPUs (balanced; the first host holds the program cache), the slices of
    # each on the 32 cores.
    masters = [op for op in ops if op.type == "VarHandleOp" and op.name.startswith("gpt2/") and "_slice_" not in op.name]
    hosts = Counter(op.device for op in masters)
    assert "/job:worker/task:0/device:CPU:0" not in hosts
    assert set(hosts) == {f"/job:worker/task:{h}/device:CPU:0" for h in (1, 2, 3)}
    slices = [op for op in ops if op.type == "VarHandleOp" and "gpt2/wte_slice_" in op.name]
    assert sorted(op.device for op in slices) == sorted(assignment.tpu_device(replica=r) for r in range(32))
    # Adam updates each variable on its own on a TPU mesh, in one grouped Assign, so autostack combines the small
    # variables of one shape (the fused pass of CPU and GPU meshes keeps it off: a v3-512 graph took 2.9 times as
    # long to build; docs/tpus.md): 16 slice variables per core, not 51. Bugs caught: train/step.py passing
    # fused=True on SIMD meshes, or models/optimizers.make_optimizer not handing it to the optimizer it builds;
    # models/optimizers._per_variable returning its Assigns uncombined (none stacked).
    sliced = {op.name.rsplit("_slice_", 1)[0] for op in ops if op.type == "VarHandleOp" and "_slice_" in op.name}
    assert any("/stacked/" in name for name in sliced) and len(sliced) == 16

    # The SIMD mesh maps logical positions to physical cores, and the layout splits every tensor of the
    # training graph evenly on it.
    args = tpu.simd_mesh_arguments(cfg, system, assignment)
    assert args["logical_to_physical"] == tpu.logical_to_physical([16, 2], [4, 4, 1, 2], assignment)
    impl = mtf.simd_mesh_impl.SimdMeshImpl(**args)
    built = model_graph.build(cfg)
    for op in built.graph.operations:
        for t in op.outputs:
            impl.tensor_layout(t.shape)  # raises for an uneven split or a dimension split twice
    assert impl.slice_shape(mtf.Shape([mtf.Dimension("batch", 32), mtf.Dimension("heads", 4)])) == [2, 2]


@pytest.mark.slow
def test_a_v3_512_pod_builds_gpt3_13b_shaped_meshes():
    """A v3-512 pod's training program: one replica per core, infeed from each of its 64 hosts, and the cores'
    slice variables made without mesh-tensorflow's unused zeros initializers (2 ops a slice, 8,192 slices: a
    quarter of the build). (Bug: devices/tpu.simd_mesh making mesh-tensorflow's own SimdMeshImpl.)"""
    placement = fake_placement("v3-512")
    cfg = tiny_config(n_layer=1, attention_types=[[["global"], 1]], n_embd=64, n_head=8, mesh_shape="x:64,y:8",
                      layout="batch:x,heads:y", train_batch_size=64)
    loop = training_loop.training_program(cfg, placement, batches(cfg), start_step=0)
    ops = loop.graph.get_operations()
    assert [op.get_attr("num_replicas") for op in ops if op.type == "TPUReplicateMetadata"] == [512]
    assert sum(op.type == "InfeedEnqueueTuple" for op in ops) == 512
    hosts = {op.device for op in ops if op.type == "InfeedEnqueueTuple"}
    assert hosts == {f"/job:worker/task:{h}/device:CPU:0" for h in range(64)}
    assert loop.lowered.train_op is not None
    # the cores' slices are bare variables (every session fills them from the masters), in no checkpoint
    slices = {op.name for op in ops if op.type == "VarHandleOp" and "_slice_" in op.name}
    assert len(slices) == 512 * 16, len(slices)
    assert not [op for op in ops if op.type == "VarIsInitializedOp" and op.inputs[0].op.name in slices]
    assert not [v for v in loop.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES) if v.op.name in slices]


def test_a_mesh_that_is_not_the_pod_is_refused_before_building():
    placement = fake_placement("v3-32")
    cfg = tiny_config(mesh_shape="x:8", layout="batch:x", train_batch_size=32)
    with pytest.raises(ConfigError, match="has 8 devices but the TPU has 32 cores"):
        tpu.simd_mesh_arguments(cfg, placement.system)
    with pytest.raises(ConfigError, match="has 8 devices but the TPU has 32 cores"):
        training_loop.training_program(cfg, placement, batches(cfg), start_step=0)


@pytest.mark.slow
def test_evaluation_and_prediction_loops_on_a_two_host_pod():
    system = tpu.TpuSystem(fake_topology([2, 2, 1, 2], cores_per_host=4), job="worker")
    placement = tpu.TpuPlacement(tpu="pod", system=system)
    cfg = tiny_config(mesh_shape="x:8", layout="batch:x", train_batch_size=8, eval_batch_size=8,
                      predict_batch_size=8, max_new_tokens=3)
    evaluation = validation.evaluation_program(cfg, placement, lambda: batches(cfg)(0), steps=3)
    assert evaluation.driver.loop.names == ["loss"]
    assert sum(op.type == "OutfeedDequeueTuple" for op in evaluation.graph.get_operations()) == 8

    rows = {"tokens": np.zeros([5, cfg.n_ctx], np.int32), "prompt_length": np.ones([5], np.int32),
            "seed": np.zeros([5], np.int32)}
    prediction = run.prediction_program(cfg, placement, rows, batch_size=8)
    assert all(p.op.device == "/job:worker/task:0/device:CPU:0" and p.shape.as_list()[0] == 8
               for p in prediction.inputs.placeholders.values())  # fed on the first host, a whole batch
    dequeue = [op for op in prediction.graph.get_operations() if op.type == "OutfeedDequeueTuple"]
    assert len(dequeue) == 8 and {op.device for op in dequeue} == {f"/job:worker/task:{h}/device:CPU:0" for h in (0, 1)}
    shapes = dict(zip(prediction.driver.loop.names,
                      (tf.TensorShape(s).as_list() for s in dequeue[0].get_attr("shapes"))))
    assert shapes == {"lengths": [8], "tokens": [8, cfg.n_ctx]}


def test_the_loop_runs_at_most_its_count_per_call_and_sets_the_count_only_when_it_changes():
    """devices/tpu.py's LoopSteps.run (training's calls up to a checkpoint, evaluation's one call): each session
    call runs at most steps_per_call iterations of the compiled loop, and the count variable is assigned only when
    a call's count differs from the last one's. Bugs caught: all the steps asked for in one call (more than the
    loop was built for), the count left as it was before a shorter call."""
    system = tpu.TpuSystem(fake_topology([2, 2, 1, 2], cores_per_host=4), job="worker")
    cfg = tiny_config(n_layer=1, attention_types=[[["global"], 1]], mesh_shape="x:8", layout="batch:x",
                      train_batch_size=8, eval_batch_size=8)
    program = validation.evaluation_program(cfg, tpu.TpuPlacement(tpu="pod", system=system),
                                            lambda: batches(cfg)(0), steps=4)
    loop, ran, assigned = program.driver, [], []
    loop.loop.run = lambda session, count, feed_dict=None: ran.append(count) or [{"loss": 0.0}] * count

    class CountOnly:  # the session: the count's assignment is all that runs outside the (stubbed) loop
        def run(self, fetches, feed_dict):
            assert fetches is loop._set_count
            assigned.extend(feed_dict.values())

    assert len(program.run(CountOnly(), 10)) == 10 and ran == [4, 4, 2] and assigned == [2]
    program.run(CountOnly(), 2)
    program.run(CountOnly(), 4)
    assert ran[3:] == [2, 4] and assigned == [2, 4]


class FakeResolver:
    """Stands in for TPUClusterResolver, which asks the TPU's metadata service for these."""

    def __init__(self, name):
        self.name = name

    def master(self):
        return "grpc://10.0.0.0:8470"

    def get_job_name(self):
        return "worker"

    def cluster_spec(self):
        return tf.train.ClusterSpec({"worker": ["10.0.0.0:8470", "10.0.0.1:8470", "10.0.0.2:8470", "10.0.0.3:8470"]})


def test_placement_for_tpu_name_initialises_the_system_and_reads_its_topology(monkeypatch):
    asked = []
    facts = tpu.tpu_access.TpuFacts(metadata_answers=True)
    monkeypatch.setattr(tpu.tpu_access, "check", lambda name, timeout: (tpu.tpu_access.target(name), facts))
    monkeypatch.setattr(tpu, "resolver", lambda want: asked.append(want.address) or FakeResolver(want.address))
    initialised = []

    def initialize(master, config, job):
        initialised.append((master, job, [list(j.tasks.values()) for j in config.cluster_def.job]))
        return fake_topology([4, 4, 1, 2]).serialized()

    monkeypatch.setattr(tpu, "initialize_system", initialize)
    placement = tpu.placement("my-tpu")
    assert asked == ["my-tpu"] and placement.device_kind == "TPU" and placement.facts is facts
    assert initialised == [("grpc://10.0.0.0:8470", "worker", [[f"10.0.0.{i}:8470" for i in range(4)]])]
    assert placement.system.num_cores == 32 and placement.system.num_hosts == 4
    assert placement.hosts == tuple(f"/job:worker/task:{h}/device:CPU:0" for h in range(4))
    config = placement.session_config()
    assert [list(j.tasks.values()) for j in config.cluster_def.job] == [[f"10.0.0.{i}:8470" for i in range(4)]]
