"""Your own text for an imported model (tools/hf.py's from_hf and from_neo --text_dir): the documents of a folder
split into a training and a held-out part, both encoded with the model's tokenizer (create_tfrecords.py) in the
way the model config's dataset entry reads them, and registered as one dataset that records that tokenizer.

The held-out part is every tenth input file in sorted order (at least one file, never all), unless the held-out
text has a folder of its own. Documents mode (the documents_* sampling modes) keeps documents long enough for
`stitch` of them to fill a window of n_ctx + 1 tokens; chunks mode (chunks, sequential) cuts the text into those
windows. The held-out text keeps every document: evaluation reads it whole.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from data import create_tfrecords as ct
from data.documents import list_input_files
from data.errors import DataError
from data.inputs import SAMPLING_MODES
from data.tokenizer import LoadedTokenizer

HELD_OUT_EVERY = 10  # every tenth input file is held out for evaluation


@dataclass(frozen=True)
class Encoded:
    """What encode_own_text wrote: the dataset config and the two summaries."""
    config_path: str
    train: ct.Summary
    held_out: ct.Summary
    held_out_files: int


def held_out_split(files: list[str]) -> tuple[list[str], list[str]]:
    """(training files, held-out files): every HELD_OUT_EVERY-th file held out, at least one."""
    if len(files) < 2:
        raise DataError(f"{files[0] if files else 'the folder'} is the only input file: hold-out text needs one of "
                        f"its own; pass --eval_text_dir with held-out documents, or put your text in several files")
    held = [path for i, path in enumerate(files) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1] or [files[-1]]
    return [path for path in files if path not in held], held


def encode_own_text(text_dir: str, eval_text_dir: Optional[str], dataset_id: str, tokenizer: LoadedTokenizer,
                    n_ctx: int, stitch: int, sampling_mode: str, data_dir: str, registry: str,
                    show_progress: bool = True) -> Encoded:
    """Encodes text_dir (and eval_text_dir, or text_dir's held-out files) into data_dir/{train,eval} with
    `tokenizer`, shaped for a dataset entry [dataset_id, stitch, sampling_mode, ...] of a model with context
    n_ctx, and writes registry/dataset_id.json (paths relative to the folder holding configs/ where they are
    inside it, and the tokenizer's record)."""
    ct._check_dataset_id(dataset_id)
    files = list_input_files(text_dir)
    if eval_text_dir:
        train_files, held_out = files, list_input_files(eval_text_dir)
    else:
        train_files, held_out = held_out_split(files)
    if SAMPLING_MODES[sampling_mode].prechunked:
        shape = dict(mode="chunks", n_ctx=n_ctx, minimum_size=1)
    else:  # stitch documents of at least this many tokens fill a window
        shape = dict(mode="documents", minimum_size=-(-(n_ctx + 1) // stitch))
    train_dir, eval_dir = os.path.join(data_dir, "train"), os.path.join(data_dir, "eval")
    train = ct.create_tfrecords(input_dir=text_dir, output_dir=train_dir, name=dataset_id, tokenizer=tokenizer,
                                files=train_files, show_progress=show_progress, **shape)
    held = ct.create_tfrecords(input_dir=eval_text_dir or text_dir, output_dir=eval_dir, name=f"{dataset_id}_eval",
                               tokenizer=tokenizer, files=held_out, mode="documents", minimum_size=1,
                               show_progress=show_progress)
    ct.write_dataset_config(dataset_id, train_dir, dataset_id, tokenizer, "train", registry, note_missing_split=False)
    path = ct.write_dataset_config(dataset_id, eval_dir, f"{dataset_id}_eval", tokenizer, "eval", registry)
    return Encoded(path, train, held, len(held_out))
