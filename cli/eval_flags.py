"""main.py's flags for lm-evaluation-harness tasks (--harness_tasks, --harness_include_path, --num_fewshot,
--limit, --harness_batch_size, --harness_output, --log_samples) and the precision of evaluation
(--eval_precision): config overrides, and evals/harness.py's HarnessOptions of this run."""
from __future__ import annotations

from console.arguments import whole_number


def add_arguments(p) -> None:
    """The harness flags, added to main.py's parser."""
    p.add_argument("--harness_tasks", help="lm-eval tasks to run with --eval (and after each checkpoint when "
                   "training), comma-separated, e.g. lambada_openai,hellaswag (overrides the config's harness_tasks)")
    p.add_argument("--harness_include_path", help="a folder of task YAML files reading local data (e.g. "
                   "tests/fixtures/harness_tasks); overrides harness_include_path")
    p.add_argument("--num_fewshot", type=whole_number(0), default=None, help="few-shot examples per request "
                   "(default: each task's own)")
    p.add_argument("--limit", type=float, default=None, help="examples per harness task (a fraction when below 1)")
    p.add_argument("--harness_batch_size", type=whole_number(1), default=None,
                   help="rows per forward pass for the harness (default: eval_batch_size)")
    p.add_argument("--harness_output", help="the harness's results JSON (default: model_path/harness/results_STEP.json)")
    p.add_argument("--log_samples", action="store_true", help="also write each harness request's inputs and outputs "
                   "(beside the results JSON, as _samples.json)")
    p.add_argument("--eval_precision", choices=("auto", "float32"), default=None,
                   help="the precision --eval, the evaluations during training, the harness, --predict and --export "
                        "run the model in: auto (training's on these devices) or float32 (overrides the config's "
                        "eval_precision)")


def config_overrides(args) -> dict:
    """The config keys the flags override (None: the config's own)."""
    return {"harness_tasks": args.harness_tasks, "harness_include_path": args.harness_include_path,
            "harness_num_fewshot": args.num_fewshot, "harness_limit": args.limit,
            "eval_precision": args.eval_precision}


def options(args, cfg):
    """evals/harness.py's HarnessOptions of this run: the config's harness keys (the flags above already in
    them) and this run's own settings. (The job is imported here, not at the top: main.py's parser reads this
    module before TensorFlow loads.)"""
    from evals.harness import HarnessOptions
    return HarnessOptions.from_config(cfg, batch_size=args.harness_batch_size, output_path=args.harness_output,
                                      log_samples=args.log_samples)
