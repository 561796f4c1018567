"""The ladder's command line: `python -m ladder {plan,run,status,fit} SPEC [flags]`. Bad input of any kind is one
`error:` line."""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from console.arguments import ArgumentParser

warnings.filterwarnings("ignore")  # mesh-tensorflow's own deprecation warnings say nothing to users


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m ladder", description=__doc__)
    commands = p.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for name, text in (("plan", "the table of every size and its LR schedules (OUT/plots/NAME_lr_schedule.png); trains nothing"),
                       ("run", "train every size not done (resumable); with a launcher: write one script per size"),
                       ("status", "the training overview of every size, from its model_path"),
                       ("fit", "fit L(N, D) = E + A/N^alpha + B/D^beta to the sizes' evaluations")):
        c = commands.add_parser(name, help=text, description=text)
        c.add_argument("spec", help="a ladder spec: a name in configs/ladders/ or a path to a .json")
        if name == "fit":
            c.add_argument("--hold_out", nargs="+", default=[], metavar="SIZE",
                           help="leave these sizes out of the fit and predict their final eval loss")
            c.add_argument("--budget", nargs="+", default=[], metavar="FLOPS",
                           help="compute budgets (FLOPs, e.g. 1e18) for the compute-optimal N and D")
            c.add_argument("--predict", nargs="+", default=[], metavar="CONFIG",
                           help="model configs (e.g. gpt3_XL) whose loss at their train_steps the fit predicts")
            c.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the intervals")
            c.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias)
    import tensorflow.compat.v1 as tf
    from schema import ConfigError
    tf.get_logger().setLevel("ERROR")
    try:
        return _run(args)
    except ConfigError as e:  # LadderError among them
        print(f"error: {e}", file=sys.stderr)
        return 1


def _run(args) -> int:
    from ladder import plan as ladder_plan
    from ladder.spec import load_spec
    spec = load_spec(args.spec)
    if args.command == "status":
        from ladder import status
        print(status.table(spec))
        return 0
    if args.command == "fit":
        from ladder import fit
        return fit.command(spec, args.hold_out, args.budget, args.predict, args.bootstrap, args.seed)
    ladder = ladder_plan.make_ladder(spec)
    if args.command == "plan":
        written = ladder_plan.write_configs(ladder)
        print(ladder_plan.table(ladder))
        picture = ladder_plan.plot_lr(ladder, os.path.join(spec.out, "plots", f"{spec.name}_lr_schedule.png"))
        print(f"wrote {len(written)} size configs to {os.path.dirname(written[0])} "
              f"(python main.py --model CONFIG --dry_run shows one in full) and {picture}")
        return 0
    from ladder import run
    return run.run(ladder)
