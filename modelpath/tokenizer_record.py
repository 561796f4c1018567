"""Which tokenizer encoded the data a model_path's checkpoints were trained on: `model_path/tokenizer_id.json`.

A config names its tokenizer (schema.py's reference_tokenizer: the model's tokenizer_id, else its
datasets', each as its config's key, the create_tfrecords manifests beside its files and its tokenizer_path say:
config.py), and a config whose data disagrees with it is refused when it is read. But a model trained
from scratch has no tokenizer of its own in its config, so pointing the config at data encoded by another
tokenizer and resuming (or --eval, --predict with that tokenizer) would pass every check. So training's start records the
data's tokenizer with the checkpoints (`record`: once, atomically, never over a record that disagrees), and
every job that gives the model tokens (training, --eval, --predict, --check_dataset) compares the config's
with it first (`check`). The record is a config's tokenizer_id (its vocabulary hash, size and end-of-text id);
a model_path trained before the record gets a warning, and its next training records it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Optional

from schema import (ConfigError, GPTConfig, TokenizerId, parse_tokenizer_id, reference_tokenizer,
                    warn_unrecorded_tokenizers)
from modelpath import checkpoints, files

RECORD = "tokenizer_id.json"


def data_tokenizer(cfg: GPTConfig) -> Optional[TokenizerId]:
    """The tokenizer of the config's model and data, with the config's eos_id where its record has none (one
    written before the end-of-text id was recorded); None when nothing in the config records one."""
    reference, _ = reference_tokenizer(cfg)
    if reference is not None and reference.eos_id is None and cfg.eos_id is not None:
        reference = dataclasses.replace(reference, eos_id=cfg.eos_id)
    return reference


def read(model_path: str) -> Optional[TokenizerId]:
    """model_path's record; None when it has none. A ConfigError when it is damaged."""
    path = os.path.join(model_path, RECORD)
    if not files.exists(path):
        return None
    try:
        with files.open_text(path) as f:
            value = json.loads(f.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is damaged ({type(e).__name__}): it records which tokenizer's data the checkpoints "
                          f"were trained on; restore it, or delete it if you know the config's data is that "
                          f"tokenizer's") from None
    return parse_tokenizer_id(value, path)


def _mismatch(model_path: str, recorded: TokenizerId, current: TokenizerId) -> ConfigError:
    return ConfigError(f"{model_path} was trained on data encoded with tokenizer {recorded}, as its {RECORD} "
                       f"records, but the config's tokenizer is {current}: use data encoded with the model's "
                       f"tokenizer{recorded.encode_hint()}, or another model_path (--new deletes this one and starts "
                       f"over)")


def check(cfg: GPTConfig) -> None:
    """A ConfigError when model_path records another tokenizer than the config's; a warning when one side records
    none, so nothing can be compared (an old model_path's ends when training records it; data that records no
    tokenizer gets schema.py's warning, naming model_path's)."""
    recorded, current = read(cfg.model_path), data_tokenizer(cfg)
    if recorded is not None and current is not None and not recorded.matches(current):
        raise _mismatch(cfg.model_path, recorded, current)
    if recorded is None and current is not None and checkpoints.steps(cfg.model_path):
        _warn(f"{cfg.model_path} has checkpoints but no {RECORD} saying which tokenizer's data trained them (made "
              f"before the record), so the config's tokenizer {current} is not checked against them; training "
              f"records it")
    elif recorded is not None and current is None:  # one line a dataset, main.py's own call adds none
        warn_unrecorded_tokenizers(cfg, against=f"{cfg.model_path} was trained on data encoded with {recorded}")


def record(cfg: GPTConfig) -> Optional[str]:
    """Writes model_path's record of the config's tokenizer when it has none (atomically: a temporary file
    renamed); returns its path, or None when there is nothing to record or it is already there. A record that
    disagrees is never rewritten: a ConfigError, as `check` gives."""
    current = data_tokenizer(cfg)
    if current is None:
        return None
    recorded = read(cfg.model_path)
    if recorded is not None:
        if not recorded.matches(current):
            raise _mismatch(cfg.model_path, recorded, current)
        return None
    path = os.path.join(cfg.model_path, RECORD)
    files.makedirs(cfg.model_path)
    files.write_atomically(path, json.dumps(current.to_json(), indent=1) + "\n")
    return path


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)
