"""main.py's training flags (--new, --yes, --log_every, --peak_tflops, --checkpoint_minutes, --sacred_id;
--train_steps, --lr, --warmup_steps) and what they do: the options of train/job.py, the config keys a run overrides
(a fine-tune's everyday changes, recorded in run_info.json), and --new's question and deletion (main.py deletes
last, after every check)."""
from __future__ import annotations

import math
import os
import shutil
import sys

from console.arguments import number_above, whole_number


def add_arguments(p) -> None:
    """The training flags, added to main.py's parser."""
    p.add_argument("--new", action="store_true", help="delete model_path and start from scratch (asks first)")
    p.add_argument("--yes", action="store_true", help="answer yes to --new's question (for scripts)")
    p.add_argument("--log_every", type=whole_number(1), default=None, help="print training progress every N steps")
    p.add_argument("--peak_tflops", type=number_above(0), default=None,
                   help="one device's peak TFLOP/s for MFU (one GPU or TPU core; default: the datasheet peak of a known "
                   "GPU, else measured on the first mesh device in the training dtype; devices/peaks.py)")
    p.add_argument("--checkpoint_minutes", type=float, default=None, metavar="N",
                   help="also save a checkpoint whenever N minutes have passed since the last save (for long steps; "
                   "with steps_per_checkpoint, whichever comes first)")
    p.add_argument("--sacred_id", help="the Sacred run tracking this run (run_experiment.py sets it); recorded in "
                   "model_path/run_info.json")
    p.add_argument("--train_steps", type=whole_number(1), default=None,
                   help="train to this step (overrides the config's train_steps; counts from the imported step 0 "
                   "in a fine-tune)")
    p.add_argument("--lr", type=number_above(0), default=None, help="peak learning rate (overrides the config's lr)")
    p.add_argument("--warmup_steps", type=whole_number(0), default=None,
                   help="steps of linear learning-rate warm-up (overrides the config's warmup_steps)")


def config_overrides(args) -> dict:
    """The config keys the training flags override (None: the config's own); run_info.json records the values
    trained with."""
    return {"train_steps": args.train_steps, "lr": args.lr, "warmup_steps": args.warmup_steps}


def options(args):
    """train/job.py's TrainOptions of this run, checked (main.py makes them before anything runs). (The job is
    imported here, not at the top: main.py's parser reads this module, and `--help` or a mistyped flag should not
    wait for TensorFlow to load.)"""
    from schema import ConfigError
    from train.job import TrainOptions
    minutes = args.checkpoint_minutes
    if minutes is not None and not 0 < minutes < math.inf:  # NaN fails both
        raise ConfigError(f"--checkpoint_minutes must be more than 0 (a finite number of minutes), got {minutes:g}")
    return TrainOptions(peak_tflops=args.peak_tflops, log_every=args.log_every, checkpoint_minutes=minutes,
                        sacred_id=args.sacred_id)


def confirm_new(model_path: str, yes: bool) -> bool:
    """--new's question, before the job's checks: whether model_path may be deleted (asked on a terminal, --yes
    without one); False when the user keeps it. A trainer running on it is refused here (modelpath/lock.py).
    Nothing is deleted yet: main.py calls delete_model_path once every check has passed."""
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


def delete_model_path(model_path: str) -> None:
    """--new, confirmed and every check passed: deletes model_path, holding its lock meanwhile (a trainer that
    started since the question is refused in one error line naming it)."""
    if not os.path.exists(model_path):
        return
    from modelpath.lock import TrainerLock
    with TrainerLock(model_path):
        shutil.rmtree(model_path)
    print(f"deleted {model_path}")
