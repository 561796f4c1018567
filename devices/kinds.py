"""A run's device request turned into its placement, for main.py's jobs and --selfcheck alike.

Each kind of placement is one entry of `KINDS`: a Placement class that says whether a request is for it
(`matches`) and reaches the devices (`from_request`), then answers every question the jobs ask of it
(devices/placement.py). A new device kind is one more entry here.
"""
from __future__ import annotations

from typing import Optional

from schema import GPTConfig
from devices.cluster import ClusterPlacement
from devices.placement import DeviceRequest, Placement
from devices.tpu import TpuPlacement

# Asked in this order; the first that matches reaches the devices. This host's devices match every request.
KINDS = (TpuPlacement, ClusterPlacement, Placement)


def place(request: DeviceRequest, cfg: Optional[GPTConfig] = None, precision: Optional[str] = None) -> Placement:
    """The placement `request` asks for, for the mesh of `cfg`, started up: the fused kernels' path chosen, and on
    GPUs float32 matmuls in float32 (TF32 only with the config's allow_tf32), the start-up line printed and XLA:GPU
    checked in the precision that trains (`precision`, default the config's). Without a config (--selfcheck, which
    sizes its model to the devices): one CPU device by default, TF32 off."""
    kind = next(kind for kind in KINDS if kind.matches(request))
    placement = kind.from_request(request, cfg)
    return placement.start_up(request.plain_kernels, request.xla, precision or (cfg.precision if cfg else "float32"),
                              tf32=bool(cfg and cfg.allow_tf32))


def start(request: DeviceRequest, cfg: GPTConfig) -> Placement:
    """main.py's placement for a job on `cfg` (`place`). On a multi-host run first the line saying where the
    cluster came from and which task this is; a worker (not the chief) serves its devices here until the chief
    releases it, and leaves the process (cluster.exit_process)."""
    from devices import cluster
    if request.cluster is not None:
        print(cluster.describe(request.cluster), flush=True)
        if not request.cluster.is_chief:
            cluster.exit_process(cluster.serve_worker(request, cfg))
    return place(request, cfg)
