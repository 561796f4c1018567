"""`main.py --predict`: prompts in, samples out as text and as jsonl.

Prompts come from `--prompt FILE [FILE ...]`: each file is one prompt, or with `--prompt_per_line` each
non-empty line of each file is one. No prompt samples from the start of text (the eos token). Every prompt
gets `--num_samples` samples (default: a single prompt fills one batch, as the reference did; several prompts
get one each); they are batched `predict_batch_size` rows at a time (the last batch is padded
and the padding rows dropped). Sampling options are config keys (temperature, top_k, top_p, sampling_seed,
stop_token, max_new_tokens, remove_partial_sequences, kv_cache) that the flags of the same names override
(cli/predict_flags.py).

Writes `<model_path>/predictions_<step>.txt` (the samples, as before) and `.jsonl` (one object per sample:
prompt, completion, token ids, whether it stopped at the stop token, its seed, the step and the precision the
model ran in), or to
`--predict_output PREFIX.txt/.jsonl`. A later run at the same step writes `predictions_<step>_2.*`, `_3`, ...:
every run's samples are kept.
"""
from __future__ import annotations

import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from typing import Optional

import numpy as np

from data.errors import DataError
from infer import run
from models.attention import incremental_unsupported
from models.sampling import SamplingOptions
from modelpath import checkpoints
from devices import precision

@dataclass(frozen=True)
class PredictOptions:
    """What to sample (cli/predict_flags.py fills it from --prompt, --prompt_per_line, --num_samples and
    --predict_output; the sampling settings themselves are config keys)."""
    prompt_files: tuple = ()              # each file is one prompt; none: sample from the start of text
    prompt_per_line: bool = False         # each non-empty line of the files is one prompt
    num_samples: Optional[int] = None     # per prompt; default: one batch for a single prompt, else 1
    output_prefix: Optional[str] = None   # PREFIX.txt and PREFIX.jsonl; default: unused_prefix(model_path, step)


def read_prompts(paths, per_line: bool) -> list[str]:
    if not paths:
        return [""]
    prompts = []
    for path in paths:
        if os.path.isdir(path):
            raise DataError(f"prompt file {path} is a folder: pass the text files in it (--prompt "
                            f"{os.path.join(path, '*.txt')}) or one text file to --prompt")
        if not os.path.isfile(path):
            raise DataError(f"prompt file {path} not found: pass a text file to --prompt")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:  # a gzip, an image, text in another encoding
            text = None
        except OSError as e:  # unreadable: permissions, an I/O error
            raise DataError(f"prompt file {path} cannot be read ({e.strerror}): pass a readable text file to "
                            f"--prompt") from None
        if text is None or "\x00" in text:  # NUL: binary that happens to decode, or UTF-16 without a BOM
            raise DataError(f"prompt file {path} is not UTF-8 text (a binary file, or text in another encoding): "
                            f"pass a plain UTF-8 text file to --prompt")
        if not text.strip():  # a file saved empty by mistake would otherwise sample from nothing, unasked
            raise DataError(f"prompt file {path} is empty (or holds only blank lines): write the prompt into it, or "
                            f"leave out --prompt to sample from the start of text")
        prompts.extend([line for line in text.splitlines() if line.strip()] if per_line else [text])
    return prompts


def sample_seeds(seed: int, count: int) -> np.ndarray:
    """One seed per sample, derived from the run's seed, so that every sample (in whichever batch and row it
    lands) draws different noise and the same run seed repeats them all."""
    return ((seed * 1_000_003 + np.arange(count, dtype=np.int64)) % (2 ** 31)).astype(np.int32)


@dataclass
class Batch:
    tokens: np.ndarray        # [rows, n_ctx]
    prompt_length: np.ndarray  # [rows]
    seed: np.ndarray          # [rows]
    prompt_index: list        # per row
    prompt_ids: list          # per row


def build_rows(cfg, tokenizer, prompts: list[str], num_samples: int, seed: int) -> Batch:
    """Encoded, left-truncated prompts (room is left for at least one new token), one row per sample."""
    start_id = cfg.eos_id if cfg.eos_id is not None else 0
    padding = cfg.padding_id if cfg.padding_id is not None else 0
    encoded = []
    for text in prompts:
        ids = tokenizer.encode(text)
        if len(ids) > cfg.n_ctx - 1:
            print(f"warning: a prompt of {len(ids)} tokens keeps its last {cfg.n_ctx - 1} (n_ctx is {cfg.n_ctx})")
        encoded.append(ids[-(cfg.n_ctx - 1):] or [start_id])
    rows = [(p, ids) for p, ids in enumerate(encoded) for _ in range(num_samples)]
    tokens = np.full([len(rows), cfg.n_ctx], padding, np.int32)
    for i, (_, ids) in enumerate(rows):
        tokens[i, :len(ids)] = ids
    return Batch(tokens, np.array([len(ids) for _, ids in rows], np.int32), sample_seeds(seed, len(rows)),
                 [p for p, _ in rows], [ids for _, ids in rows])


def stop_id(cfg):
    return SamplingOptions.from_config(cfg).stop_id


def completion(cfg, prompt_length: int, tokens, length: int) -> tuple[list, bool]:
    """The new token ids of one output row (graph layout per remove_partial_sequences), without the stop
    token, and whether the sample ended at it."""
    new = [int(t) for t in (tokens[:length] if cfg.remove_partial_sequences else tokens[prompt_length:length])]
    stop = stop_id(cfg)
    stopped = bool(new) and stop is not None and new[-1] == stop
    return (new[:-1] if stopped else new), stopped


def run_rows(cfg, placement, rows: Batch, checkpoint: str) -> dict:
    """Samples every row from the checkpoint, predict_batch_size rows at a time: {"tokens", "lengths"}. The kv
    cache's prefill runs over the bucket of the longest prompt (models/sampling.prefill_bucket), not all n_ctx."""
    features = {"tokens": rows.tokens, "prompt_length": rows.prompt_length, "seed": rows.seed}
    label = f"sampling {len(rows.tokens)} x {cfg.max_new_tokens} new tokens"
    options = SamplingOptions.from_config(cfg).with_prefill_bucket(rows.prompt_length, cfg.n_ctx)
    return run.predict(cfg, placement, features, cfg.predict_batch_size, checkpoint, options, progress=True,
                       label=label)


def unused_prefix(model_path: str, step: int) -> str:
    """model_path/predictions_STEP, or predictions_STEP_2, _3, ... when earlier runs at this step wrote those:
    each run's samples are kept, none overwritten."""
    base = os.path.join(model_path, f"predictions_{step}")
    prefix, run_number = base, 1
    while any(os.path.exists(prefix + suffix) for suffix in (".txt", ".jsonl")):
        run_number += 1
        prefix = f"{base}_{run_number}"
    return prefix


def write_samples(prefix: str, records: list, step: int) -> None:
    """PREFIX.txt and PREFIX.jsonl, each written whole under a temporary name, then renamed. When that fails
    (disk full, read-only), the samples (already printed) go to a file in the temporary folder that the
    CheckpointError names: finished samples are never lost."""
    texts = {".txt": "".join(f"======== sample {r['index']} ========\n{r['text']}\n" for r in records),
             ".jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
        for suffix, text in texts.items():
            with open(prefix + suffix + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(prefix + suffix + ".tmp", prefix + suffix)
    except OSError as e:
        for suffix in texts:
            if os.path.exists(prefix + suffix + ".tmp"):
                try:
                    os.remove(prefix + suffix + ".tmp")
                except OSError:
                    pass
        try:
            fd, kept = tempfile.mkstemp(prefix=f"predictions_{step}_", suffix=".jsonl")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(texts[".jsonl"])
            where = f"printed above and saved in {kept}"
        except OSError:
            where = "printed above (and nowhere else)"
        raise checkpoints.CheckpointError(
            f"could not write {prefix}.txt and .jsonl ({checkpoints.reason(e)}): the {len(records)} samples are "
            f"{where}; free space, or pass --predict_output PREFIX to write them elsewhere") from e


def predict(cfg, placement, options: PredictOptions, step: int, tokenizer) -> int:
    """Samples every prompt from the checkpoint at `step`, prints the samples and writes them."""
    prompts = read_prompts(options.prompt_files, options.prompt_per_line)
    num_samples = options.num_samples
    if num_samples is None:
        num_samples = cfg.predict_batch_size if len(prompts) == 1 else 1
    if num_samples < 1:
        raise DataError(f"--num_samples must be at least 1, got {num_samples}")
    seed = cfg.sampling_seed if cfg.sampling_seed is not None else secrets.randbelow(2 ** 31)
    rows = build_rows(cfg, tokenizer, prompts, num_samples, seed)
    prefix = options.output_prefix or unused_prefix(cfg.model_path, step)
    checkpoints.check_writable(os.path.dirname(os.path.abspath(prefix)),  # before sampling, not after
                               "make it writable, or pass --predict_output PREFIX to write the samples elsewhere")
    outputs = run_rows(cfg, placement, rows, checkpoints.prefix_of(cfg.model_path, step))

    ran_in = precision.running(cfg)
    records = []
    for i in range(len(rows.tokens)):
        p = rows.prompt_index[i]
        new, stopped = completion(cfg, int(rows.prompt_length[i]), outputs["tokens"][i], int(outputs["lengths"][i]))
        text = tokenizer.decode(new)
        records.append({
            "index": i, "prompt_index": p, "prompt": prompts[p], "prompt_ids": rows.prompt_ids[i],
            "completion": text, "tokens": new, "stopped": stopped, "seed": int(rows.seed[i]), "step": step,
            "precision": ran_in, "text": text if cfg.remove_partial_sequences else prompts[p] + text})
    for r in records:
        print(f"======== sample {r['index']} (step {step}) in {ran_in} ========\n{r['text']}")
    write_samples(prefix, records, step)
    why = incremental_unsupported(cfg)
    mode = "kv cache" if cfg.kv_cache and why is None else f"full recompute ({why or 'kv_cache is false'})"
    print(f"wrote {len(records)} samples ({len(prompts)} prompts x {num_samples}, seed {seed}, {mode}, {ran_in}) to "
          f"{prefix}.txt and {prefix}.jsonl")
    return 0
