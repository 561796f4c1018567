"""main.py's planning and scale flags and what they do: --dry_run, --auto_layout, --auto_layout_and_mesh_shape,
and multi-host (--cluster / --workers / --task_index, or the launcher's TF_CONFIG or SLURM variables).
`add_arguments` declares them on main.py's parser, which hands over to `dispatch` (and, on a multi-host chief,
`chief_placement`).
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Optional

from console import number_above, restore, whole_number


def add_arguments(p) -> None:
    """The planning and scale flags, added to main.py's parser. No training starts with the first three."""
    p.add_argument("--dry_run", action="store_true", help="print parameters, FLOPs/token, tokens/step, micro-batches "
                   "and per-device memory (with and without recompute_grad) for the mesh and layout, then exit")
    p.add_argument("--device_memory", help="with --dry_run: one device's memory (80GB, 16GiB); also finds the "
                   "smallest mesh that fits")
    p.add_argument("--auto_layout", action="store_true", help="print a memory-efficient layout for the mesh_shape "
                   "(mesh-tensorflow's auto_mtf), then exit")
    p.add_argument("--auto_layout_and_mesh_shape", action="store_true", help="print a mesh shape and layout for "
                   "--num_devices devices, then exit")
    p.add_argument("--num_devices", type=whole_number(1), help="devices for --auto_layout_and_mesh_shape (default: as many as "
                   "--gpu_ids names, else the config's mesh size)")
    p.add_argument("--write_config", metavar="PATH", help="with --auto_layout*: write a copy of the config using "
                   "the found mesh_shape and layout")
    p.add_argument("--cluster", metavar="FILE", help='multi-host: cluster file {"worker": ["host:port", ...]}, '
                   "chief (task 0) first")
    p.add_argument("--workers", metavar="LIST", help="multi-host: the cluster as host0:port,host1:port,...")
    p.add_argument("--task_index", type=whole_number(0), help="multi-host: this host's index in the cluster (0 trains)")
    p.add_argument("--worker_timeout", type=number_above(0), help="multi-host: a non-chief exits after this many seconds "
                   "without being released by the chief (default: wait)")
    p.add_argument("--checkpoint_minutes", type=float, default=None, metavar="N",
                   help="also save a checkpoint whenever N minutes have passed since the last save (for long steps; "
                   "with steps_per_checkpoint, whichever comes first)")
    p.add_argument("--cluster_port", type=whole_number(1), default=None, metavar="PORT",
                   help="multi-host under SLURM's srun: the port of each node's first task (the next tasks of a node "
                   "take the next ports; default 8888)")
    p.add_argument("--ignore_memory_check", action="store_true",
                   help="train (or --eval, --predict) even when the dry run's memory estimate exceeds the host RAM "
                   "available or a GPU's free memory "
                   "(plan/memory_check.py)")


def config_overrides(args) -> dict:
    """--auto_layout* replace the layout, so the config's own is not checked against a new --mesh_shape."""
    if getattr(args, "auto_layout", False) or getattr(args, "auto_layout_and_mesh_shape", False):
        return {"layout": ""}
    return {}


def multi_host(args) -> bool:
    """A cluster from --cluster/--workers or from the launcher's environment (TF_CONFIG, SLURM's srun)."""
    from runtime import cluster as cluster_lib
    return cluster_lib.from_args(args) is not None


def _config_path(args) -> str:
    from cli.config_loading import resolve_config_path
    return resolve_config_path(args.model)


def dispatch(args, cfg) -> Optional[int]:
    """Runs the planning commands and non-chief workers; returns their exit code, or None to go on."""
    from config.schema import ConfigError
    chosen = [flag for flag in ("dry_run", "auto_layout", "auto_layout_and_mesh_shape") if getattr(args, flag)]
    if len(chosen) > 1:
        raise ConfigError(f"pass one of --dry_run, --auto_layout, --auto_layout_and_mesh_shape, not "
                          f"{' and '.join('--' + c for c in chosen)}")
    if args.tpu and (args.cluster or args.workers or args.task_index is not None):
        raise ConfigError("--tpu runs on the TPU's own hosts: leave out --cluster/--workers/--task_index")
    if args.checkpoint_minutes is not None and not 0 < args.checkpoint_minutes < math.inf:  # NaN fails both
        raise ConfigError(f"--checkpoint_minutes must be more than 0 (a finite number of minutes), got {args.checkpoint_minutes:g}")
    if args.device_memory and not args.dry_run:
        raise ConfigError("--device_memory goes with --dry_run")
    if args.write_config and not (args.auto_layout or args.auto_layout_and_mesh_shape):
        raise ConfigError("--write_config goes with --auto_layout or --auto_layout_and_mesh_shape")
    if args.dry_run:
        return dry_run(args, cfg)
    if args.auto_layout or args.auto_layout_and_mesh_shape:
        return auto_layout(args, cfg)
    from runtime import cluster as cluster_lib
    cluster = None if args.tpu else cluster_lib.from_args(args)
    if cluster is not None:
        print(cluster_lib.describe(cluster), flush=True)  # where the cluster came from, which task this is
        if not cluster.is_chief:
            serve(args, cfg, cluster)  # does not return
    return None


def check_memory(args, cfg, placement) -> None:
    """Before training, --eval or --predict: refuses in one line when the dry run's estimate exceeds the host RAM
    available (or a GPU's free memory), unless --ignore_memory_check."""
    if args.ignore_memory_check:
        return
    from plan import memory_check
    if args.predict or args.eval:
        memory_check.check_inference(cfg, placement, args.model, "predict" if args.predict else "eval")
    else:
        memory_check.check_training(cfg, placement, args.model)


def dry_run(args, cfg) -> int:
    from plan import dry_run as plan
    start = time.perf_counter()
    result = plan.make_plan(cfg, args.device_memory)
    print(plan.describe(result, args.model))
    print(f"(planned in {time.perf_counter() - start:.1f} s)")
    return 0


def auto_layout(args, cfg) -> int:
    from plan import auto_layout as layout_planner
    if args.auto_layout:
        result = layout_planner.auto_layout(cfg)
    else:
        n = args.num_devices or (len(args.gpu_ids) if args.gpu_ids else cfg.n_devices)
        result = layout_planner.auto_layout_and_mesh_shape(cfg, n)
    print(layout_planner.describe(result, args.model, with_mesh=args.auto_layout_and_mesh_shape))
    if args.write_config:
        path = layout_planner.write_config(_config_path(args), result, args.write_config)
        print(f"wrote {path}: train with python main.py --model {path}")
    return 0


def _local_devices(args, cfg, cluster) -> list:
    from runtime import devices
    from config.schema import ConfigError
    if args.gpu_ids:
        return list(args.gpu_ids)
    if cfg.n_devices % cluster.size:
        raise ConfigError(f"mesh_shape {cfg.mesh_shape!r} has {cfg.n_devices} devices, which {cluster.size} hosts "
                          f"cannot share evenly: pass --gpu_ids with the devices of each host")
    return devices.cpu_devices(cfg.n_devices // cluster.size)


def serve(args, cfg, cluster) -> None:
    """A non-chief worker: serve this host's devices until the chief releases it, then exit the process."""
    from runtime import cluster as cluster_lib
    from runtime import devices
    local = _local_devices(args, cfg, cluster)
    devices.configure(local)
    server = cluster_lib.start_server(cluster, local)
    exit_process(cluster_lib.serve(cluster, server, args.worker_timeout))


def exit_process(code: int) -> None:
    """Ends this process now. A TF gRPC server cannot be shut down cleanly, and interpreter shutdown can
    block on its threads, so a process that started one leaves with os._exit after flushing its output."""
    sys.stdout.flush()
    sys.stderr.flush()
    restore()  # the console filter passes on what it holds
    os._exit(code)


def chief_placement(args, cfg):
    """The chief of a multi-host run: its server, and the Placement over every host's devices."""
    from runtime import cluster as cluster_lib
    from runtime import devices
    cluster = cluster_lib.from_args(args)
    local = _local_devices(args, cfg, cluster)
    devices.configure(local)
    placement, _ = cluster_lib.chief_placement(cluster, local, cfg.n_devices)
    print(f"chief of {cluster.size} hosts: mesh over {', '.join(placement.devices)}", flush=True)
    return placement
