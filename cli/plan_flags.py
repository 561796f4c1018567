"""main.py's planning flags and what they do: --dry_run, --auto_layout, --auto_layout_and_mesh_shape (which
print a plan and exit, `dispatch`), and the memory check before a job (`check_memory`, --ignore_memory_check).
"""
from __future__ import annotations

import time
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


def _config_path(args) -> str:
    from schema import resolve_config_path
    return resolve_config_path(args.model)


def dispatch(args, cfg) -> Optional[int]:
    """Runs the planning commands; returns their exit code, or None to go on."""
    from schema import ConfigError
    chosen = [flag for flag in ("dry_run", "auto_layout", "auto_layout_and_mesh_shape") if getattr(args, flag)]
    if len(chosen) > 1:
        raise ConfigError(f"pass one of --dry_run, --auto_layout, --auto_layout_and_mesh_shape, not "
                          f"{' and '.join('--' + c for c in chosen)}")
    if args.device_memory and not args.dry_run:
        raise ConfigError("--device_memory goes with --dry_run")
    if args.write_config and not (args.auto_layout or args.auto_layout_and_mesh_shape):
        raise ConfigError("--write_config goes with --auto_layout or --auto_layout_and_mesh_shape")
    if args.dry_run:
        return dry_run(args, cfg)
    if args.auto_layout or args.auto_layout_and_mesh_shape:
        return auto_layout(args, cfg)
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
