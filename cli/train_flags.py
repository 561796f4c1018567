"""main.py's training flags (--new, --yes, --log_every, --peak_tflops, --checkpoint_minutes, --sacred_id;
--train_steps, --lr, --warmup_steps), parsed into the options of train/job.py and the config keys a run overrides
(a fine-tune's everyday changes, recorded in run_info.json). --new's question is main.py's, its deletion the
training job's (jobs.py), after every check."""
from __future__ import annotations

import math

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
