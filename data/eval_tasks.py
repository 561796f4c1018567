"""Evaluation tasks (config key `eval_tasks`): the registry, and each task's examples, the rows a model scores
and the metrics from its scores. Running them on a checkpoint, and the results file, are evals/tasks.py's.

LAMBADA: each example is a passage whose last word must be predicted from the rest. The passage is split at
its last space; the context and " word" are tokenized separately (a word may be several tokens), and one
forward pass scores the word's tokens:

* `lambada_acc`: the fraction of examples whose every word token is the model's argmax (greedy) choice;
* `lambada_ppl`: exp of the mean, over examples, of the word's negative log-likelihood (summed over its tokens).

The reference downloaded the data; here `lambada_path` names a local jsonl file with one {"text": ...} per
line (e.g. OpenAI's lambada_test.jsonl).

A new task is one entry of TASKS: how it runs given a scorer and the tokenizer, and what it checks in a config.
The registry sits here, below the jobs, because the config check (config.py) reads it: an unknown task
or a task's missing setting is refused when the config is read, before anything runs.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from schema import ConfigError, GPTConfig
from data.errors import DataError


def read_lambada(path: str) -> list[str]:
    """Texts of a LAMBADA jsonl file (blank lines skipped)."""
    if not os.path.isfile(path):
        raise DataError(f"lambada_path {path} not found: point it at a local LAMBADA jsonl "
                        f"(one {{\"text\": ...}} per line)")
    texts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} line {number} is not JSON: {e.msg}")
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataError(f"{path} line {number} has no \"text\" string")
            texts.append(record["text"])
    if not texts:
        raise DataError(f"{path} holds no examples")
    return texts


def last_word_examples(texts: list[str], encode: Callable[[str], list], n_ctx: int) -> list[tuple[list, list]]:
    """(context ids, last-word ids) per text; contexts are cut from the left to fit n_ctx + 1 tokens."""
    examples = []
    for text in texts:
        text = text.rstrip()
        context, space, word = text.rpartition(" ")
        if not space or not context or not word:
            raise DataError(f"LAMBADA example {text[:60]!r} has no context before its last word")
        context_ids, word_ids = encode(context), encode(" " + word)
        if not context_ids or not word_ids or len(word_ids) >= n_ctx:
            raise DataError(f"LAMBADA example {text[:60]!r} does not fit n_ctx {n_ctx}")
        keep = n_ctx + 1 - len(word_ids)
        examples.append((context_ids[-keep:], word_ids))
    return examples


def scoring_rows(examples: list[tuple[list, list]], n_ctx: int, padding_id: int):
    """Rows for one forward pass each: tokens, targets (tokens shifted by one) and the word's span in them."""
    tokens = np.full([len(examples), n_ctx], padding_id, np.int32)
    targets = np.full([len(examples), n_ctx], padding_id, np.int32)
    spans = []
    for i, (context, word) in enumerate(examples):
        full = context + word
        tokens[i, :len(full) - 1] = full[:-1]
        targets[i, :len(full) - 1] = full[1:]
        spans.append((len(context) - 1, len(full) - 1))
    return tokens, targets, spans


def last_word_metrics(token_loss: np.ndarray, token_correct: np.ndarray, spans: list[tuple[int, int]]) -> dict:
    nll = np.array([token_loss[i, a:b].sum() for i, (a, b) in enumerate(spans)], np.float64)
    hit = np.array([bool(token_correct[i, a:b].all()) for i, (a, b) in enumerate(spans)])
    return {"lambada_acc": float(hit.mean()), "lambada_ppl": float(math.exp(min(nll.mean(), 700.0))),
            "lambada_examples": len(spans)}


def lambada(cfg, score, tokenizer) -> dict:
    examples = last_word_examples(read_lambada(cfg.lambada_path), tokenizer.encode, cfg.n_ctx)
    padding = cfg.padding_id if cfg.padding_id is not None else 0
    tokens, targets, spans = scoring_rows(examples, cfg.n_ctx, padding)
    token_loss, token_correct = score(tokens, targets)
    return last_word_metrics(token_loss, token_correct, spans)


def _check_lambada(cfg: GPTConfig) -> None:
    if not cfg.lambada_path:
        raise ConfigError("eval task 'lambada' needs lambada_path: set it to a local LAMBADA jsonl "
                          "(one {\"text\": ...} per line)")


@dataclass(frozen=True)
class EvalTask:
    """One registered eval task: `run(cfg, score, tokenizer) -> metrics`, and its config checks."""
    run: Callable[..., dict]
    check: Callable[[GPTConfig], None]


TASKS = {"lambada": EvalTask(lambada, _check_lambada)}
