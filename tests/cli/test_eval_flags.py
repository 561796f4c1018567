"""cli/eval_flags.py: the harness flags and --eval_precision override their config keys, and this run's own
settings reach the harness's options."""
import os

import main
from cli import eval_flags
from evals.harness import HarnessOptions
from tiny import tiny_config

TASKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "harness_tasks")


def test_the_harness_flags_override_their_config_keys_and_reach_the_harness_options():
    """The flags' names are not the keys' (--num_fewshot is harness_num_fewshot, --limit harness_limit): each
    overrides its key (as main.py's load_config merges them), this run's batch size, output and samples reach
    HarnessOptions, and without the flags the config's keys stand. Bug caught: --num_fewshot and --limit crossed
    over in config_overrides (a few-shot count of 0.5, refused, or 3 examples per task)."""
    config = dict(harness_tasks=["tiny_rolling"], harness_num_fewshot=1, harness_limit=10.0)
    args = main.parse_args(["--eval", "--harness_tasks", "tiny_lambada,tiny_choice", "--harness_include_path", TASKS,
                            "--num_fewshot", "3", "--limit", "0.5", "--harness_batch_size", "2", "--harness_output",
                            "out.json", "--log_samples", "--eval_precision", "float32"])
    given = {key: value for key, value in main.config_overrides(args).items() if value is not None}
    cfg = tiny_config(**{**config, **given})
    assert cfg.eval_precision == "float32"
    assert eval_flags.options(args, cfg) == HarnessOptions(
        tasks=("tiny_lambada", "tiny_choice"), include_path=TASKS, num_fewshot=3, limit=0.5, batch_size=2,
        output_path="out.json", log_samples=True)
    bare = main.parse_args(["--eval"])
    assert {key for key, value in eval_flags.config_overrides(bare).items() if value is not None} == set()
    assert eval_flags.options(bare, tiny_config(**config)) == HarnessOptions(tasks=("tiny_rolling",), num_fewshot=1,
                                                                             limit=10.0)
