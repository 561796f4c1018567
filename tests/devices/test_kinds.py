"""devices/kinds.py: a device request placed by the first kind of placement that matches it (a TPU, a multi-host
cluster, else this host's devices), started up with the kernels' path the request asks for."""
import pytest

from devices import kinds
from devices.cluster import ClusterPlacement
from devices.placement import DeviceRequest, Placement
from devices.tpu import TpuPlacement
from tiny import tiny_config


class Reached(Exception):
    """Stands in for reaching a TPU's or a cluster's devices: says which kind `place` chose."""


@pytest.mark.parametrize("asked,kind", [(dict(tpu="my-tpu"), TpuPlacement), (dict(cluster="two hosts"), ClusterPlacement),
                                        (dict(tpu="local", cluster="two hosts"), TpuPlacement)],
                         ids=["tpu", "cluster", "tpu-over-cluster"])
def test_a_request_is_placed_by_the_first_kind_that_matches_it(monkeypatch, asked, kind):
    """A --tpu request reaches the TPU, a launcher's cluster the cluster; every request matches this host's
    devices, so that kind is asked last. Bug caught: KINDS with Placement first (a --tpu run or a cluster's chief
    trained on this host's CPU devices alone)."""
    def reach(cls, request, cfg=None):
        raise Reached(cls)

    for each in (TpuPlacement, ClusterPlacement):
        monkeypatch.setattr(each, "from_request", classmethod(reach))
    with pytest.raises(Reached) as info:
        kinds.place(DeviceRequest(**asked), tiny_config())
    assert info.value.args[0] is kind


def test_this_hosts_devices_are_the_meshs_with_the_kernels_path_asked_for():
    """Without --gpu_ids, as many CPU devices as the config's mesh (one without a config: --selfcheck's default),
    their fused kernels XLA-compiled unless --plain_kernels asks for plain ops."""
    two = tiny_config(mesh_shape="x:2", layout="batch:x")
    placement = kinds.place(DeviceRequest(plain_kernels=True), two)
    assert type(placement) is Placement and placement.devices == ("/device:CPU:0", "/device:CPU:1")
    assert placement.kernels == "plain"
    alone = kinds.place(DeviceRequest())
    assert alone.devices == ("/device:CPU:0",) and alone.kernels == "xla"
