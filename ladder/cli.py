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
    for name, text in (("plan", "the table of every run and its LR schedules (OUT/plots/NAME_lr_schedule.png); trains nothing"),
                       ("run", "train every run not done (resumable); with a launcher: write one script per trunk"),
                       ("status", "the training overview of every run, from its model_path"),
                       ("fit", "fit L(N, D) = E + A/N^alpha + B/D^beta to the runs' annealed evaluations"),
                       ("branch", "start a branch: copy its trunk's checkpoint into its model_path (the launcher "
                                  "scripts run it; `run` does it itself)")):
        c = commands.add_parser(name, help=text, description=text)
        c.add_argument("spec", help="a ladder spec: a name in configs/ladders/ or a path to a .json")
        if name == "branch":
            c.add_argument("run", help="the branch's name, as `plan` lists it (e.g. n25K-x0.25)")
        if name == "fit":
            c.add_argument("--hold_out", nargs="+", default=[], metavar="SIZE",
                           help="leave every run of these sizes (e.g. n170K) out of the fit and predict their annealed "
                                "eval losses")
            c.add_argument("--budget", nargs="+", default=[], metavar="FLOPS",
                           help="compute budgets (FLOPs, e.g. 1e18) for the compute-optimal N and D")
            c.add_argument("--predict", nargs="+", default=[], metavar="CONFIG",
                           help="model configs (e.g. gpt3_XL) whose loss at their train_steps the fit predicts")
            c.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples (of lineages) for the intervals")
            c.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from schema import ConfigError
    if args.command != "fit" or args.predict:  # fit reads what plan and run wrote: no TensorFlow (--predict
        import models  # noqa: F401               # counts a config's graph); the mesh-tensorflow alias first
        import tensorflow.compat.v1 as tf
        tf.get_logger().setLevel("ERROR")
    try:
        return _run(args)
    except ConfigError as e:  # LadderError among them
        print(f"error: {e}", file=sys.stderr)
        return 1


def _run(args) -> int:
    from ladder.spec import load_spec
    spec = load_spec(args.spec)
    if args.command == "fit":
        from ladder import fit
        return fit.command(spec, args.hold_out, args.budget, args.predict, args.bootstrap, args.seed)
    if args.command == "status":
        from ladder import status
        print(status.table(spec))
        return 0
    if args.command == "branch":
        from ladder import run, status
        records = status.size_records(spec)
        record = next((r for r in records if r["name"] == args.run), None)
        if record is None or record.get("kind") != "branch":
            from ladder.spec import LadderError
            branches = [r["name"] for r in records if r.get("kind") == "branch"]
            raise LadderError(f"{args.run} is not a branch of ladder {spec.name}: its branches are "
                              f"{', '.join(branches) or 'none (schedule base)'}")
        prefix = run.start_branch(records, args.run) if record["start_step"] else None
        print(f"{args.run}: " + (f"starts from {prefix}" if prefix else "has its own checkpoints (or starts from step 0)"))
        return 0
    from ladder import plan as ladder_plan
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
