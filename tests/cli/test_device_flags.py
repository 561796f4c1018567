"""cli/device_flags.py: the device flags read once into the device request."""
import main
from tests.devices.test_cluster import tf_config


def test_the_device_request_holds_the_launchers_cluster_but_not_for_selfcheck_or_a_tpu():
    """cli/device_flags.py reads the cluster once, into the device request; --selfcheck checks this host's devices
    (or a TPU) and a TPU's hosts are not a cluster, so neither reads the launcher's environment. Bug caught: the
    selfcheck's request taking TF_CONFIG's cluster (it would then start as a cluster's chief or worker)."""
    from cli import device_flags
    env = {"TF_CONFIG": tf_config({"worker": ["a:1", "b:1"]}, "worker", 1)}
    request = device_flags.request(main.parse_args(["--gpu_ids", "device:CPU:0"]), env)
    assert request.cluster.workers == ("a:1", "b:1") and request.cluster.task_index == 1
    assert request.gpu_ids == ("device:CPU:0",)
    assert device_flags.request(main.parse_args(["--selfcheck"]), env).cluster is None
    assert device_flags.request(main.parse_args(["--tpu", "local"]), env).cluster is None
