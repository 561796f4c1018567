"""main.py's device flags and the one device request made of them: which devices (--gpu_ids, --tpu, a multi-host
run's --cluster/--workers/--task_index or the launcher's environment), how (--gpu_memory, --plain_kernels, --xla,
--tpu_timeout, --cluster_port, --worker_timeout), and --selfcheck, which checks them. `request` reads them once into
devices/placement.py's DeviceRequest; devices/kinds.py's `start` turns it and the config into the placement."""
from __future__ import annotations

import argparse
import os

from console.arguments import number_above, whole_number
from devices.tpu_access import DEFAULT_TIMEOUT as DEFAULT_TPU_TIMEOUT

PLAIN_KERNELS_ENV = "GPT_NEO_PLAIN_KERNELS"  # the environment's way to say --plain_kernels (read here only)


def add_arguments(p) -> None:
    """The device flags, added to main.py's parser."""
    p.add_argument("--tpu", help="the TPU to run on: local (a TPU VM), its name, grpc://HOST:PORT (a TPU Node) or colab; "
                   "omit for GPUs/CPU")
    p.add_argument("--gpu_ids", nargs="+", default=None,
                   help="devices of the mesh, e.g. device:GPU:0 device:GPU:1; device:CPU:i names split the CPU "
                        "(default: as many CPU devices as the mesh has)")
    p.add_argument("--xla", action="store_true", help="fuse element-wise ops with XLA (matmuls stay TF's); faster "
                   "training steps after a one-off compile (execution/xla.py)")
    p.add_argument("--gpu_memory", default="growth", metavar="growth|FRACTION", type=gpu_memory,
                   help="GPU memory for TensorFlow on the --gpu_ids GPUs: 'growth' allocates as needed (default), a "
                        "fraction such as 0.9 reserves that share of each GPU's memory up front")
    p.add_argument("--plain_kernels", action="store_true",
                   help="run the fused kernels (GELU, LayerNorm, softmax gradient, cross-entropy, Adam) as plain "
                        "TensorFlow ops, not XLA-compiled (chosen automatically where XLA:GPU cannot compile; the "
                        f"environment variable {PLAIN_KERNELS_ENV}=1 does the same)")
    p.add_argument("--selfcheck", nargs="?", const="float32", choices=("float32", "bfloat16", "float16"),
                   help="check the devices (--gpu_ids, --tpu; default the CPU): a tiny model trains a few steps there "
                        "and on the CPU in this dtype (default float32), compared step by step; prints a verdict "
                        "line and a JSON report (the first command to run on new hardware)")
    p.add_argument("--tpu_timeout", type=number_above(0), default=DEFAULT_TPU_TIMEOUT, metavar="SECONDS",
                   help=f"with --tpu: how long a TPU Node's address (or the metadata server that looks up a TPU "
                        f"name) may take to answer, and the TPU system to initialise (default {DEFAULT_TPU_TIMEOUT:g})")
    p.add_argument("--cluster", metavar="FILE", help='multi-host: cluster file {"worker": ["host:port", ...]}, '
                   "chief (task 0) first")
    p.add_argument("--workers", metavar="LIST", help="multi-host: the cluster as host0:port,host1:port,...")
    p.add_argument("--task_index", type=whole_number(0), help="multi-host: this host's index in the cluster (0 trains)")
    p.add_argument("--worker_timeout", type=number_above(0), help="multi-host: a non-chief exits after this many seconds "
                   "without being released by the chief (default: wait)")
    p.add_argument("--cluster_port", type=whole_number(1), default=None, metavar="PORT",
                   help="multi-host under SLURM's srun: the port of each node's first task (the next tasks of a node "
                   "take the next ports; default 8888)")


def gpu_memory(text: str) -> str:
    """--gpu_memory's argparse type: 'growth' or a fraction in (0, 1] (devices/gpus.py reads it), checked when the
    command line is read, also on a machine without GPUs, where it would otherwise never be looked at."""
    from devices.errors import DeviceError
    from devices.gpus import parse_gpu_memory
    try:
        parse_gpu_memory(text)
    except DeviceError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--gpu_memory ")) from None
    return text


def plain_kernels(args, environ=os.environ) -> bool:
    """Whether the fused kernels run as plain TF ops: --plain_kernels or GPT_NEO_PLAIN_KERNELS=1."""
    forced = environ.get(PLAIN_KERNELS_ENV, "").strip().lower() not in ("", "0", "false", "no")
    return bool(args.plain_kernels) or forced


def request(args, environ=os.environ):
    """devices/placement.py's DeviceRequest of these flags, made once. The cluster is read here (the flags, else the
    launcher's environment: TF_CONFIG, SLURM's srun), not for --selfcheck, which checks this host's devices or a
    TPU."""
    from schema import ConfigError
    from devices import cluster
    from devices.placement import DeviceRequest
    if args.tpu and (args.cluster or args.workers or args.task_index is not None):
        raise ConfigError("--tpu runs on the TPU's own hosts: leave out --cluster/--workers/--task_index")
    found = None if args.selfcheck else cluster.find(args.cluster, args.workers, args.task_index, args.cluster_port,
                                                      on_tpu=bool(args.tpu), env=environ)
    return DeviceRequest(gpu_ids=tuple(args.gpu_ids or ()), gpu_memory=args.gpu_memory, tpu=args.tpu,
                         tpu_timeout=args.tpu_timeout, plain_kernels=plain_kernels(args, environ), xla=args.xla,
                         cluster=found, worker_timeout=args.worker_timeout)
