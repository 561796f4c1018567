"""Train, evaluate and sample GPT models on a mesh of GPUs, CPU devices or a TPU.

    python main.py --model default                       # train the embedded default on this CPU
    python main.py --model default --predict --prompt p.txt
    python main.py --model colab_XL --gpu_ids device:GPU:0

Run `python main.py --help` for every flag; docs/training.md explains them, and docs/configs.md, docs/data.md
and docs/devices.md configs, datasets and meshes.
"""
from __future__ import annotations

import argparse
import sys
import warnings

from console.arguments import ArgumentParser

warnings.filterwarnings("ignore")  # mesh-tensorflow's own deprecation warnings say nothing to users


def parse_args(argv=None) -> argparse.Namespace:
    from cli import device_flags, eval_flags, plan_flags, predict_flags, train_flags
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="config name in configs/ or a path to a .json (default: default)")
    # The job; training when none is given.
    p.add_argument("--eval", action="store_true", help="report loss, perplexity and bits per byte on eval_path, the "
                   "eval tasks and the harness tasks")
    p.add_argument("--predict", action="store_true", help="sample text from the latest checkpoint")
    p.add_argument("--export", action="store_true", help="write a SavedModel serving generation and logits")
    p.add_argument("--check_dataset", action="store_true", help="print token id range and a decoded sample")
    # Config keys this run overrides.
    p.add_argument("--steps_per_checkpoint", type=int, help="save a checkpoint every N steps (overrides the config)")
    p.add_argument("--mesh_shape", help="override the config's mesh_shape, e.g. all:1")
    p.add_argument("--layout", help="override the config's layout, e.g. batch:all ('' for none)")
    device_flags.add_arguments(p)  # --tpu, --gpu_ids, --xla, --gpu_memory, --plain_kernels, --selfcheck, multi-host
    train_flags.add_arguments(p)  # --new, --yes, --log_every, --peak_tflops, --checkpoint_minutes, --train_steps, ...
    predict_flags.add_arguments(p)  # --prompt, sampling overrides, --predict_output, --export_dir
    eval_flags.add_arguments(p)  # --harness_tasks, --harness_include_path, --num_fewshot, --limit, ...
    plan_flags.add_arguments(p)  # --dry_run, --auto_layout*, --ignore_memory_check
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias)
    import tensorflow.compat.v1 as tf
    if args.xla:
        from execution.xla import enable_xla_fusion
        enable_xla_fusion()
    from data.errors import DataError
    from devices.placement import DeviceError
    from train.loop import Interrupted
    from schema import ConfigError
    from execution.preemption import Terminated, terminate_with_a_line

    tf.get_logger().setLevel("ERROR")
    try:
        with terminate_with_a_line():  # SIGTERM (a scheduler's): one line, not a silent death
            return run(args)
    except (ConfigError, DeviceError, DataError) as e:  # modelpath/checkpoints.py's CheckpointError among them
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
    except Interrupted as e:  # the first Ctrl-C or SIGTERM: the step in progress finished and was saved
        print(str(e), file=sys.stderr)
        return e.exit_code
    except Terminated as e:  # SIGTERM before training started
        print(str(e), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130


def run(args) -> int:
    """The switchboard: the config read once, then the one job the flags ask for, each given its typed options."""
    from cli import device_flags, eval_flags, plan_flags, predict_flags, train_flags
    from schema import warn_unrecorded_tokenizers
    from config import load_config
    from data import check as data_check
    from evals.job import run_evaluation
    from infer.job import run_export, run_prediction
    from modelpath import checkpoints, tokenizer_record
    from train.job import check_training, run_training

    if args.selfcheck:  # the device check (selfcheck/job.py): no config or model_path of the user's is used
        return device_flags.selfcheck(args)
    overrides = {"mesh_shape": args.mesh_shape, "steps_per_checkpoint": args.steps_per_checkpoint}
    if args.layout is not None:
        overrides["layout"] = args.layout
    overrides.update(train_flags.config_overrides(args))
    overrides.update(predict_flags.config_overrides(args))
    overrides.update(eval_flags.config_overrides(args))
    overrides.update(plan_flags.config_overrides(args))
    cfg = load_config(args.model, overrides)

    if args.check_dataset:
        tokenizer_record.check(cfg)  # the tokenizer model_path's checkpoints were trained on
        return data_check.run(cfg)
    train_options = train_flags.options(args)  # checked here, before anything runs
    handled = plan_flags.dispatch(args, cfg)  # --dry_run, --auto_layout*: they read nothing in model_path
    if handled is not None:
        return handled
    if not (args.export or args.new):  # the tokenizer model_path's checkpoints were trained on (--new deletes them)
        tokenizer_record.check(cfg)
    if not args.export:  # training, --eval and --predict read the data's tokens (--check_dataset warns itself)
        warn_unrecorded_tokenizers(cfg)
    # A TPU, the hosts of a multi-host cluster (whose workers serve here until released), or this machine's GPUs
    # or CPU; the fused kernels' path; on GPUs the start-up line and the XLA:GPU check
    placement = device_flags.placement(device_flags.request(args), cfg)
    # Every refusal comes before anything is deleted or written: --new deletes model_path last, once the
    # question is answered and every check has passed (the memory check, training's data).
    checkpoints.check_model_path(cfg.model_path)
    if args.new and not train_flags.confirm_new(cfg.model_path, args.yes):  # a running trainer is refused here
        return 1
    if not args.export:
        plan_flags.check_memory(args, cfg, placement)  # the dry run's estimate against host RAM and GPUs' memory
    training = not (args.export or args.predict or args.eval)
    if training:
        # no datasets, a model_path that cannot be written, data that cannot give windows, unknown harness tasks
        check_training(cfg, eval_flags.options(args, cfg))
    if args.new:
        train_flags.delete_model_path(cfg.model_path)
    if args.export:
        return run_export(cfg, placement, predict_flags.export_options(args))
    if args.predict:
        return run_prediction(cfg, placement, predict_flags.predict_options(args))
    if args.eval:
        return run_evaluation(cfg, placement, eval_flags.options(args, cfg))

    run_training(cfg, placement, train_options, harness_options=eval_flags.options(args, cfg))
    return 0


if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()  # before TensorFlow is imported: its C++ start-up chatter stays off the console
    code = main()
    from cli.device_flags import leave
    leave(code)  # a multi-host chief releases its workers and leaves with os._exit
