"""The --predict and --export flags of main.py: the config keys they override for one run, and the options of
infer/job.py's jobs."""
from __future__ import annotations

# Flags that override the config key of the same name for this run.
SAMPLING_FLAGS = {
    "temperature": float, "top_k": int, "top_p": float, "sampling_seed": int, "stop_token": int,
    "max_new_tokens": int,
}


def add_arguments(p) -> None:
    """The --predict (and --export) flags, added to main.py's parser."""
    p.add_argument("--prompt", nargs="+", metavar="FILE",
                   help="text file(s) holding the prompt(s) for --predict (default: start of text)")
    p.add_argument("--prompt_per_line", action="store_true",
                   help="each non-empty line of the --prompt files is a separate prompt")
    p.add_argument("--num_samples", type=int, default=None,
                   help="samples per prompt (default: one batch of predict_batch_size for a single prompt, else 1)")
    p.add_argument("--predict_output", metavar="PREFIX",
                   help="write PREFIX.txt and PREFIX.jsonl (default: <model_path>/predictions_<step>)")
    for name, kind in SAMPLING_FLAGS.items():
        p.add_argument(f"--{name}", type=kind, default=None, help=f"override the config's {name}")
    p.add_argument("--remove_partial_sequences", action="store_true", default=None,
                   help="output only the new tokens, not the prompt")
    p.add_argument("--entmax_sampling", action="store_true",
                   help="sample from entmax instead of the softmax (GPT-Neo's flag; the config's sampling_use_entmax)")
    p.add_argument("--no_kv_cache", action="store_true",
                   help="sample by recomputing the whole context each step instead of using the key/value cache")
    p.add_argument("--no_compiled_decoding", action="store_true",
                   help="sample with the mtf loop instead of the whole generation as one XLA program")
    p.add_argument("--export_dir", help="where --export writes the SavedModel (default: <model_path>/export/<step>)")


def config_overrides(args) -> dict:
    """Config keys set by this run's flags."""
    overrides = {name: getattr(args, name, None) for name in SAMPLING_FLAGS}
    if getattr(args, "remove_partial_sequences", None):
        overrides["remove_partial_sequences"] = True
    if getattr(args, "entmax_sampling", False):
        overrides["sampling_use_entmax"] = True
    if getattr(args, "no_kv_cache", False):
        overrides["kv_cache"] = False
    if getattr(args, "no_compiled_decoding", False):
        overrides["compiled_decoding"] = False
    return {k: v for k, v in overrides.items() if v is not None}


# The jobs' option types are imported in the functions that build them, not at the top: main.py's parser reads
# this module, and `--help` or a mistyped flag should not wait for TensorFlow to load.

def predict_options(args):
    """infer/predict.py's PredictOptions of this run."""
    from infer.predict import PredictOptions
    return PredictOptions(prompt_files=tuple(args.prompt or ()), prompt_per_line=args.prompt_per_line,
                          num_samples=args.num_samples, output_prefix=args.predict_output)


def export_options(args):
    """infer/job.py's ExportOptions of this run."""
    from infer.job import ExportOptions
    return ExportOptions(export_dir=args.export_dir)
