"""Train, evaluate and sample GPT models on a mesh of GPUs, CPU devices or a TPU.

    python main.py --model default                       # train the embedded default on this CPU
    python main.py --model default --predict --prompt p.txt
    python main.py --model colab_XL --gpu_ids device:GPU:0

Run `python main.py --help` for every flag; README.md explains configs, datasets and meshes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings

from console import ArgumentParser, whole_number

warnings.filterwarnings("ignore")  # mesh-tensorflow's own deprecation warnings say nothing to users


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="config name in configs/ or a path to a .json (default: default)")
    p.add_argument("--tpu", help="TPU name (or 'colab') to run on; omit for GPUs/CPU")
    p.add_argument("--gpu_ids", nargs="+", default=None,
                   help="devices of the mesh, e.g. device:GPU:0 device:GPU:1; device:CPU:i names split the CPU "
                        "(default: as many CPU devices as the mesh has)")
    p.add_argument("--steps_per_checkpoint", type=int, help="save a checkpoint every N steps (overrides the config)")
    p.add_argument("--mesh_shape", help="override the config's mesh_shape, e.g. all:1")
    p.add_argument("--layout", help="override the config's layout, e.g. batch:all ('' for none)")
    p.add_argument("--new", action="store_true", help="delete model_path and start from scratch (asks first)")
    p.add_argument("--yes", action="store_true", help="answer yes to --new's question (for scripts)")
    p.add_argument("--eval", action="store_true", help="report loss and perplexity on eval_path")
    p.add_argument("--predict", action="store_true", help="sample text from the latest checkpoint")
    p.add_argument("--export", action="store_true", help="write a SavedModel serving generation and logits")
    from cli import gpu_flags, predict_flags
    predict_flags.add_arguments(p)  # --prompt, sampling overrides, --predict_output, --export_dir
    gpu_flags.add_arguments(p)  # --gpu_memory, --plain_kernels
    p.add_argument("--check_dataset", action="store_true", help="print token id range and a decoded sample")
    p.add_argument("--log_every", type=whole_number(1), default=None, help="print training progress every N steps")
    p.add_argument("--peak_tflops", type=float, default=None,
                   help="one device's peak TFLOP/s for MFU (one GPU or TPU core; default: the datasheet peak of a known "
                   "GPU, else measured on the first mesh device in the training dtype; runtime/peaks.py)")
    p.add_argument("--sacred_id", help="the Sacred run tracking this run (run_experiment.py sets it); recorded in "
                   "model_path/run_info.json")
    p.add_argument("--xla", action="store_true", help="fuse element-wise ops with XLA (matmuls stay TF's); faster "
                   "training steps after a one-off compile (runtime/xla.py)")
    # Planning and scale (cli/scale_flags.py): no training starts with the first three.
    p.add_argument("--dry_run", action="store_true", help="print parameters, FLOPs/token, tokens/step, micro-batches "
                   "and per-device memory (with and without recompute_grad) for the mesh and layout, then exit")
    p.add_argument("--device_memory", help="with --dry_run: one device's memory (80GB, 16GiB); also finds the "
                   "smallest mesh that fits")
    p.add_argument("--auto_layout", action="store_true", help="print a memory-efficient layout for the mesh_shape "
                   "(mesh-tensorflow's auto_mtf), then exit")
    p.add_argument("--auto_layout_and_mesh_shape", action="store_true", help="print a mesh shape and layout for "
                   "--num_devices devices, then exit")
    p.add_argument("--num_devices", type=int, help="devices for --auto_layout_and_mesh_shape (default: as many as "
                   "--gpu_ids names, else the config's mesh size)")
    p.add_argument("--write_config", metavar="PATH", help="with --auto_layout*: write a copy of the config using "
                   "the found mesh_shape and layout")
    p.add_argument("--cluster", metavar="FILE", help='multi-host: cluster file {"worker": ["host:port", ...]}, '
                   "chief (task 0) first")
    p.add_argument("--workers", metavar="LIST", help="multi-host: the cluster as host0:port,host1:port,...")
    p.add_argument("--task_index", type=int, help="multi-host: this host's index in the cluster (0 trains)")
    p.add_argument("--worker_timeout", type=float, help="multi-host: a non-chief exits after this many seconds "
                   "without being released by the chief (default: wait)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias)
    import tensorflow.compat.v1 as tf
    if args.xla:
        from runtime.xla import enable_xla_fusion
        enable_xla_fusion()
    from cli.gpu_flags import apply_plain_kernels
    apply_plain_kernels(args)  # --plain_kernels: before any graph is built
    from data.errors import DataError
    from runtime.devices import DeviceError
    from train.loop import Interrupted
    from config.schema import ConfigError

    tf.get_logger().setLevel("ERROR")
    try:
        return run(args)
    except (ConfigError, DeviceError, DataError) as e:  # runtime/checkpoints.py's CheckpointError among them
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a write the jobs do not check themselves (run_info.json, event files, eval results)
        import errno
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR,
                           errno.EISDIR):
            raise
        print(f"error: could not write {e.filename or 'a file'} ({e.strerror}): free space or fix the folder, then run "
              f"again (the checkpoints saved so far are intact)", file=sys.stderr)
        return 1
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:  # bad data found while training reads it
        from data.inputs import pipeline_error
        error = pipeline_error(e)
        if error is None:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Interrupted as e:  # the first Ctrl-C: the step in progress finished and was saved
        print(str(e), file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130


def run(args) -> int:
    from cli import gpu_flags, predict_flags, scale_flags
    from cli.config_loading import load_config
    from config.schema import ConfigError
    from runtime import devices
    from runtime.devices import Placement

    overrides = {"mesh_shape": args.mesh_shape, "steps_per_checkpoint": args.steps_per_checkpoint}
    if args.layout is not None:
        overrides["layout"] = args.layout
    overrides.update(predict_flags.config_overrides(args))
    overrides.update(scale_flags.config_overrides(args))
    cfg = load_config(args.model, overrides)

    if args.check_dataset:
        return check_dataset(cfg)

    handled = scale_flags.dispatch(args, cfg)  # --dry_run, --auto_layout*, non-chief hosts of a cluster
    if handled is not None:
        return handled
    if args.tpu:
        from runtime import tpu
        placement = tpu.placement(args.tpu)
    elif scale_flags.multi_host(args):
        placement = scale_flags.chief_placement(args, cfg)
    else:
        names = devices.configure(args.gpu_ids or devices.cpu_devices(cfg.n_devices), args.gpu_memory)
        devices.check_mesh_fits(cfg.mesh_shape, cfg.n_devices, names)
        placement = Placement(devices=tuple(names))
        gpu_flags.start_up(args, placement)  # GPUs: the start-up line, the XLA:GPU check (runtime/gpus.py)

    if not cfg.model_path:
        raise ConfigError("the config has no model_path: set it to the folder for checkpoints and logs")
    if os.path.exists(cfg.model_path) and not os.path.isdir(cfg.model_path):
        raise ConfigError(f"model_path {cfg.model_path} is a file, not a folder: set model_path to a folder for "
                          f"checkpoints and logs (or move the file away)")
    if args.new and not start_fresh(cfg.model_path, args.yes):
        return 1
    if args.export:
        return export(cfg, args)
    if args.predict:
        return predict(cfg, placement, args)
    if args.eval:
        return evaluate(cfg, placement)
    from tools.runs import write_run_info
    from train.job import run_training
    # run_info.json: tokens/step and FLOPs/token for tools/plot_runs.py, and the Sacred run that trained it
    run_training(cfg, placement, args.peak_tflops, args.log_every,
                 on_start=lambda step: write_run_info(cfg, step, args.sacred_id))
    return 0


def start_fresh(model_path: str, yes: bool) -> bool:
    if not os.path.exists(model_path):
        return True
    if not yes:
        if not sys.stdin.isatty():
            print(f"error: --new would delete {model_path}; pass --yes to confirm without a prompt", file=sys.stderr)
            return False
        answer = input(f"--new deletes {model_path} and everything in it. Continue? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept it; nothing was deleted")
            return False
    shutil.rmtree(model_path)
    print(f"deleted {model_path}")
    return True


def evaluate(cfg, placement) -> int:
    from config.schema import ConfigError
    from data.tokenizer import load_for_config
    from evals import tasks, validation
    step = require_checkpoint(cfg)
    from runtime import checkpoints
    checkpoints.check_writable(cfg.model_path, "make it writable (evaluation writes model_path/eval and its "
                                               "results file), or evaluate a writable copy")
    has_eval_path = bool(cfg.tokenizer_dataset and cfg.tokenizer_dataset.eval_path)
    if not has_eval_path and not cfg.eval_tasks:
        raise ConfigError("nothing to evaluate: set eval_path in the dataset config or eval_tasks in the model config")
    if has_eval_path:
        validation.report(cfg, placement)
    if cfg.eval_tasks:
        tasks.run_eval_tasks(cfg, placement, load_for_config(cfg), step)
    return 0


def require_checkpoint(cfg) -> int:
    """The step of model_path's newest checkpoint that can be read (found by its files; a newer one cut short is
    skipped with a warning); an error when there is none."""
    from runtime import checkpoints
    return checkpoints.step_of(checkpoints.require_checkpoint(cfg.model_path))


def predict(cfg, placement, args) -> int:
    from data.tokenizer import load_for_config
    from infer.predict import predict as sample, read_prompts
    read_prompts(args.prompt, args.prompt_per_line)  # a missing prompt file is reported before anything else
    step = require_checkpoint(cfg)
    return sample(cfg, placement, args, step, load_for_config(cfg))


def export(cfg, args) -> int:
    from runtime import checkpoints
    from infer.export import export_saved_model
    step = require_checkpoint(cfg)
    path = export_saved_model(cfg, checkpoints.prefix_of(cfg.model_path, step),
                              args.export_dir or os.path.join(cfg.model_path, "export", str(step)))
    print(f"exported step {step} to {path} (signatures: serving_default/generate, logits; "
          f"batch {cfg.predict_batch_size}, n_ctx {cfg.n_ctx})")
    return 0


def check_dataset(cfg) -> int:
    from data.errors import DataError
    from data.inputs import token_stats
    from data.tokenizer import load_for_dataset

    failures = []
    for use in cfg.datasets:
        ds = use.dataset
        for kind, path in (("train", ds.path), ("eval", ds.eval_path)):
            if not path:
                continue
            stats = token_stats(path)
            print(f"{ds.id} ({kind}) {path}: {stats['files']} files, {stats['documents']} documents, "
                  f"{stats['tokens']} tokens, token ids {stats['min_token_id']}..{stats['max_token_id']}, "
                  f"document lengths {stats['min_document_tokens']}..{stats['max_document_tokens']}")
            top = stats["max_token_id"]
            if top is not None and top >= cfg.n_vocab:
                failures.append(f"{ds.id} ({kind}) has token id {top} >= the model's n_vocab {cfg.n_vocab}: "
                                f"raise n_vocab or re-encode with a smaller tokenizer")
            elif top is not None and top >= ds.n_vocab:
                failures.append(f"{ds.id} ({kind}) has token id {top} >= its registered n_vocab {ds.n_vocab}: "
                                f"fix n_vocab in its dataset config to the tokenizer's size")
        if ds.tokenizer_path:
            sample = first_tokens(ds.path or ds.eval_path, 64)
            print(f"{ds.id} decoded sample: {load_for_dataset(ds).decode(sample)!r}")
    if failures:
        raise DataError("; ".join(failures))
    print("dataset check passed")
    return 0


def first_tokens(path: str, count: int) -> list[int]:
    import tensorflow as tf
    files = sorted(tf.io.gfile.glob(path))
    for record in tf.data.TFRecordDataset(files[:1]).take(1):
        example = tf.train.Example.FromString(record.numpy())
        return list(example.features.feature["text"].int64_list.value[:count])
    return []


if __name__ == "__main__":
    from console import quiet_tensorflow
    quiet_tensorflow()  # before TensorFlow is imported: its C++ start-up chatter stays off the console
    sys.exit(main())
