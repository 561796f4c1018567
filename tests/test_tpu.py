"""--tpu: everything up to the hardware edge, on TF's own TPU context over fake pod topologies.

TPUEstimator reads a TPU system's cores, hosts and topology from the TPU it connects to. Here that metadata
is built by hand for v3-8 / v3-32 / v3-512-shaped pods (TF's Topology and DeviceAssignment classes are
plain Python) and handed to TPUEstimator's internal context, so its own checks, batch sizes and host
placement run as they would on the pod; then the model_fn's mesh pieces are built from that context.
"""
import math

import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf
from tensorflow.compat.v1 import estimator as tf_estimator
from tensorflow.python.tpu import tpu_system_metadata
from tensorflow_estimator.python.estimator.tpu import tpu_context

from engine import estimator, model_graph, tpu
from models.config import ConfigError
from tiny import tiny_config

MASTER = "grpc://10.0.0.0:8470"


def fake_pod(mesh_shape, cores_per_host=8):
    """TPU system metadata for a pod whose topology mesh_shape is [x, y, z, cores_per_chip]."""
    x, y, z, c = mesh_shape
    coords = [(i, j, k, core) for k in range(z) for j in range(y) for i in range(x) for core in range(c)]
    n = len(coords)
    hosts = max(1, n // cores_per_host)
    topology = tf.tpu.experimental.Topology(mesh_shape=list(mesh_shape),
                                            device_coordinates=np.array(coords, np.int32).reshape(hosts, n // hosts, 4))
    return tpu_system_metadata.TPUSystemMetadata(num_cores=n, num_hosts=hosts, num_of_cores_per_host=n // hosts,
                                                 topology=topology, devices=[])


def tpu_estimator_context(cfg, metadata, mode=tf_estimator.ModeKeys.TRAIN):
    """TPUEstimator's internal context for cfg (with our TPUConfig) on the fake pod, in `mode`."""
    hosts = tf.train.ClusterSpec({"worker": [f"10.0.0.{i}:8470" for i in range(metadata.num_hosts)]})
    config = tf_estimator.tpu.RunConfig(master=MASTER, tpu_config=tpu.tpu_config(cfg),
                                        session_config=tf.ConfigProto(cluster_def=hosts.as_cluster_def()))
    internal = tpu_context._get_tpu_context(config, cfg.train_batch_size, cfg.eval_batch_size,
                                            cfg.predict_batch_size, True, True, None)
    internal._lazy_tpu_system_metadata_dict[MASTER] = metadata
    with internal.with_mode(mode) as ctx:
        return ctx


def model_fn_context(ctx):
    """What the model_fn receives as params["context"]."""
    return tpu_context.TPUContext(ctx, call_from_input_fn=False)


def test_cluster_resolver_argument_and_tpu_config():
    assert tpu.cluster_resolver_argument("colab") is None
    assert tpu.cluster_resolver_argument("my-tpu-v3-32") == "my-tpu-v3-32"
    with pytest.raises(ConfigError):
        tpu.cluster_resolver_argument("")
    cfg = tiny_config(mesh_shape="x:16,y:2", layout="batch:x,heads:y", train_batch_size=32, iterations=50)
    config = tpu.tpu_config(cfg)
    assert config.num_shards == 32 and config.num_cores_per_replica == 1 and config.iterations_per_loop == 50
    assert config.per_host_input_for_training == tf_estimator.tpu.InputPipelineConfig.BROADCAST


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


def test_tpu_estimator_context_on_a_v3_32_pod():
    cfg = tiny_config(mesh_shape="x:16,y:2", layout="batch:x,heads:y", train_batch_size=32)
    ctx = tpu_estimator_context(cfg, fake_pod([4, 4, 1, 2]))
    ctx._validate_tpu_configuration()  # TPUEstimator's own checks: num_shards == cores, batch sizes
    assert (ctx.num_hosts, ctx.num_replicas) == (4, 32)
    # BROADCAST: the input_fn runs once with the whole batch; every core imports it and keeps its slice.
    assert ctx.batch_size_for_input_fn == 32 and ctx.batch_size_for_model_fn == 32
    params_context = model_fn_context(ctx)
    assert tpu.host_devices(params_context) == [f"/job:worker/task:{i}/device:CPU:0" for i in range(4)]

    args = tpu.simd_mesh_arguments(cfg, params_context)
    assert args["shape"] == mtf.convert_to_shape("x:16,y:2")
    assert set(args["layout"]._pairs) == {("batch", "x"), ("heads", "y")}
    assert args["devices"] == [""] * 32
    assert args["device_assignment"] is params_context.device_assignment
    assert list(args["device_assignment"].topology.mesh_shape) == [4, 4, 1, 2]
    assert args["logical_to_physical"] == tpu.logical_to_physical([16, 2], [4, 4, 1, 2])

    # The model_fn's mesh (engine/estimator.py) is this SimdMeshImpl, and the layout splits every tensor of
    # the training graph evenly on it.
    impl, placer = estimator._mesh_impl(cfg, estimator.Placement(tpu="pod"), {"context": params_context})
    assert isinstance(impl, mtf.simd_mesh_impl.SimdMeshImpl) and impl.size == 32
    assert [impl.l2p(i) for i in range(32)] == args["logical_to_physical"]
    built = model_graph.build(cfg)
    for op in built.graph.operations:
        for t in op.outputs:
            impl.tensor_layout(t.shape)  # raises for an uneven split or a dimension split twice
    assert impl.slice_shape(mtf.Shape([mtf.Dimension("batch", 32), mtf.Dimension("heads", 4)])) == [2, 2]

    # Master variables go to the hosts' CPUs, balanced; the first host already holds the program cache.
    with tf.Graph().as_default():
        with tf.device(placer.device_function):
            variables = [tf.get_variable(f"v{i}", [1000, 1000]) for i in range(6)]
        hosts = [v.device for v in variables]
    assert "/job:worker/task:0/device:CPU:0" not in hosts
    assert sorted(set(hosts)) == [f"/job:worker/task:{i}/device:CPU:0" for i in (1, 2, 3)]
    assert all(hosts.count(h) == 2 for h in set(hosts))


def test_a_mesh_that_is_not_the_pod_is_refused_before_running():
    cfg = tiny_config(mesh_shape="x:8", layout="batch:x", train_batch_size=32)
    ctx = tpu_estimator_context(cfg, fake_pod([4, 4, 1, 2]))
    with pytest.raises(ValueError, match="num_shards"):  # TPUEstimator: 8 shards on a 32-core TPU
        ctx._validate_tpu_configuration()
    with pytest.raises(ConfigError, match="has 8 devices but the TPU has 32 cores"):
        tpu.simd_mesh_arguments(cfg, model_fn_context(ctx))


def test_predict_and_eval_on_a_pod_use_the_broadcast_input():
    cfg = tiny_config(mesh_shape="x:8", layout="batch:x", train_batch_size=8, eval_batch_size=8,
                      predict_batch_size=8)
    pod = fake_pod([2, 2, 1, 2], cores_per_host=4)  # two hosts
    for mode in (tf_estimator.ModeKeys.EVAL, tf_estimator.ModeKeys.PREDICT):
        ctx = tpu_estimator_context(cfg, pod, mode)
        ctx._validate_tpu_configuration()  # multi-host eval/predict are only allowed with BROADCAST
        assert ctx.batch_size_for_input_fn == 8


class FakeResolver:
    """Stands in for TPUClusterResolver, which asks the TPU's metadata service for these."""

    def __init__(self, name):
        self.name = name

    def master(self):
        return MASTER

    def cluster_spec(self):
        return tf.train.ClusterSpec({"worker": ["10.0.0.0:8470", "10.0.0.1:8470"]})


def test_make_estimator_builds_the_tpu_estimator_for_tpu_name(monkeypatch, tmp_path):
    made = []
    monkeypatch.setattr(tpu, "cluster_resolver", lambda name: made.append(name) or FakeResolver(name))
    cfg = tiny_config(mesh_shape="x:16", layout="batch:x", train_batch_size=16, iterations=20,
                      model_path=str(tmp_path / "run"))
    est = estimator.make_estimator(cfg, estimator.Placement(tpu="my-tpu"))
    assert made == ["my-tpu"]
    assert isinstance(est, tf_estimator.tpu.TPUEstimator) and est._ctx._use_tpu
    assert est.config.master == MASTER
    assert list(est.config.session_config.cluster_def.job[0].tasks.values()) == ["10.0.0.0:8470", "10.0.0.1:8470"]
    assert est.config.tpu_config.num_shards == 16 and est.config.tpu_config.iterations_per_loop == 20
    assert est.config.tpu_config.per_host_input_for_training == tf_estimator.tpu.InputPipelineConfig.BROADCAST
