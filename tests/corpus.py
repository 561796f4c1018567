"""The tests' text: data/synthetic_text.py's generated Python-like source (the same bytes on every Python version
and machine), in the splits the tests read.

    train: 5 documents of ~10 KB; eval: 3 of ~14 KB; eval_large: 5 of ~30 KB (the sizes of the standard
    library files the tests read before); ladder: 20 of ~30 KB (tests/ladder/test_run.py's sizes train on it without
    repeating it much)."""
from __future__ import annotations

import os

from data.synthetic_text import NOUNS, VERBS, WORDS, Stream  # noqa: F401  (the tiny harness tasks' words)
from data import synthetic_text

_Stream = Stream  # tests/fixtures/harness_tasks/make_tiny_tasks.py's name for it

SPLITS = {"train": (1, 5, 10_000), "eval": (2, 3, 14_000), "eval_large": (3, 5, 30_000),
          "ladder": (4, 20, 30_000)}  # seed, documents, bytes


def documents(split: str) -> list[str]:
    """The split's documents ("train", "eval", "eval_large" or "ladder"): always the same text."""
    return synthetic_text.documents(*SPLITS[split])


def write_documents(folder, split: str) -> None:
    """The split's documents as folder/doc_<i>.txt (the folder is made if missing)."""
    os.makedirs(folder, exist_ok=True)
    for index, text in enumerate(documents(split)):
        with open(os.path.join(folder, f"doc_{index}.txt"), "w", encoding="utf-8") as f:
            f.write(text)
