"""main.py's planning flags: --dry_run, --auto_layout, --auto_layout_and_mesh_shape (jobs.py's DryRun and
AutoLayout, which print a plan and exit; `planning` says which), and --ignore_memory_check (the jobs' memory
check, plan/memory_check.py).
"""
from __future__ import annotations

from typing import Optional

from console.arguments import whole_number


def add_arguments(p) -> None:
    """The planning flags, added to main.py's parser. No training starts with the first three."""
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
    p.add_argument("--ignore_memory_check", action="store_true",
                   help="train (or --eval, --predict) even when the dry run's memory estimate exceeds the host RAM "
                   "available or a GPU's free memory "
                   "(plan/memory_check.py)")


def config_overrides(args) -> dict:
    """--auto_layout* replace the layout, so the config's own is not checked against a new --mesh_shape."""
    if getattr(args, "auto_layout", False) or getattr(args, "auto_layout_and_mesh_shape", False):
        return {"layout": ""}
    return {}


PLANNING = ("dry_run", "auto_layout", "auto_layout_and_mesh_shape")


def planning(args) -> Optional[str]:
    """Which planning job the flags ask for (a PLANNING name), or None; a ConfigError for flags that do not go
    together."""
    from schema import ConfigError
    chosen = [flag for flag in PLANNING if getattr(args, flag)]
    if len(chosen) > 1:
        raise ConfigError(f"pass one of --dry_run, --auto_layout, --auto_layout_and_mesh_shape, not "
                          f"{' and '.join('--' + c for c in chosen)}")
    if args.device_memory and not args.dry_run:
        raise ConfigError("--device_memory goes with --dry_run")
    if args.write_config and not (args.auto_layout or args.auto_layout_and_mesh_shape):
        raise ConfigError("--write_config goes with --auto_layout or --auto_layout_and_mesh_shape")
    return chosen[0] if chosen else None


def layout_devices(args, cfg) -> Optional[int]:
    """--auto_layout_and_mesh_shape's device count (--num_devices, else --gpu_ids', else the config's mesh);
    None for --auto_layout, which keeps the config's mesh."""
    if not args.auto_layout_and_mesh_shape:
        return None
    return args.num_devices or (len(args.gpu_ids) if args.gpu_ids else cfg.n_devices)
