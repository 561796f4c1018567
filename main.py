"""Train, evaluate and sample GPT models on a mesh of GPUs, CPU devices or a TPU.

    python main.py --model default                       # train the embedded default on this CPU
    python main.py --model default --predict --prompt p.txt
    python main.py --model colab_XL --gpu_ids device:GPU:0

Run `python main.py --help` for every flag; docs/training.md explains them, and docs/configs.md, docs/data.md
and docs/devices.md configs, datasets and meshes.
"""
from __future__ import annotations

import argparse
import os
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

    if "tensorflow" not in sys.modules:  # the first wait of every job: 2-8 s on 2 cores, before any line of its own
        print("loading TensorFlow ...", flush=True)
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
    except tf.errors.UnavailableError as e:  # a multi-host step that lost a task (killed, its host gone)
        from devices.cluster import lost_task
        line = lost_task(e)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
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
    """The switchboard: the config read once, the one job the flags ask for (jobs.py), its devices started, every
    check it makes, --new's question, then the job."""
    import jobs
    from cli import device_flags
    from config import load_config
    from devices import kinds

    if args.selfcheck:  # the device check (selfcheck/job.py): no config or model_path of the user's is used
        return jobs.SelfCheck(device_flags.request(args), args.selfcheck).run(None)
    cfg = load_config(args.model, config_overrides(args))
    job = job_for(args, cfg)
    if args.new:
        jobs.refuse_new_with(job)
    # A TPU, the hosts of a multi-host cluster (whose workers serve here until released), or this machine's GPUs
    # or CPU; the fused kernels' path; on GPUs the start-up line and the XLA:GPU check
    placement = kinds.start(device_flags.request(args), cfg) if job.uses_devices else None
    job.check(placement)  # every refusal, before anything is deleted or written
    if args.new and not confirm_new(cfg.model_path, args.yes):
        return 1
    return job.run(placement)


def confirm_new(model_path: str, yes: bool) -> bool:
    """--new's question, after the job's checks: whether model_path may be deleted (asked on a terminal, --yes
    without one); False when the user keeps it. A trainer running on it is refused here (modelpath/lock.py).
    Nothing is deleted yet: the training job deletes it when it runs (jobs.py)."""
    if not os.path.exists(model_path):
        return True
    from modelpath.lock import check_free  # here: the parser reads this module before TensorFlow loads
    check_free(model_path)
    if not yes:
        if not sys.stdin.isatty():
            print(f"error: --new would delete {model_path}; pass --yes to confirm without a prompt", file=sys.stderr)
            return False
        answer = input(f"--new deletes {model_path} and everything in it. Continue? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept it; nothing was deleted")
            return False
    return True


def config_overrides(args) -> dict:
    """The config keys this run's flags override."""
    from cli import eval_flags, plan_flags, predict_flags, train_flags
    overrides = {"mesh_shape": args.mesh_shape, "steps_per_checkpoint": args.steps_per_checkpoint}
    if args.layout is not None:
        overrides["layout"] = args.layout
    for flags in (train_flags, predict_flags, eval_flags, plan_flags):
        overrides.update(flags.config_overrides(args))
    return overrides


def job_for(args, cfg):
    """The job the flags ask for (jobs.py), with its options as the flag modules parse them; training when no
    other is asked for."""
    import jobs
    from cli import eval_flags, plan_flags, predict_flags, train_flags
    planning = plan_flags.planning(args)  # which of --dry_run, --auto_layout*, checked to go together
    if args.check_dataset:
        return jobs.DatasetCheck(cfg)
    if planning == "dry_run":
        return jobs.DryRun(cfg, args.model, args.device_memory)
    if planning:
        return jobs.AutoLayout(cfg, args.model, plan_flags.layout_devices(args, cfg), args.write_config)
    memory_check = not args.ignore_memory_check
    if args.export:
        return jobs.Export(cfg, args.model, memory_check, predict_flags.export_options(args))
    if args.predict:
        return jobs.Prediction(cfg, args.model, memory_check, predict_flags.predict_options(args))
    if args.eval:
        return jobs.Evaluation(cfg, args.model, memory_check, eval_flags.options(args, cfg))
    return jobs.Training(cfg, args.model, memory_check, train_flags.options(args), eval_flags.options(args, cfg),
                         new=args.new)


def leave(code: int) -> None:
    """Ends main.py with `code`. A multi-host chief first releases its workers, then leaves by
    devices/cluster.exit_process: the process holds a TF gRPC server, and a chief that could not release a worker
    (gone, or unreachable) was seen blocked in interpreter shutdown instead of exiting."""
    cluster = sys.modules.get("devices.cluster")  # imported only by multi-host runs
    if cluster is not None and cluster.release_held_workers():
        cluster.exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()  # before TensorFlow is imported: its C++ start-up chatter stays off the console
    try:
        code = main()
    except Exception:  # one no job turns into a line (a bug, an error of TensorFlow's): its traceback, then leave
        import traceback
        traceback.print_exc()
        code = 1
    leave(code)  # a multi-host chief releases its workers and leaves with os._exit, even after a traceback
