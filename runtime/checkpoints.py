"""A model_path's checkpoints: found by their files, saved atomically, rotated like tf.train.Saver's.

A checkpoint is `model.ckpt-STEP.index` plus its `model.ckpt-STEP.data-*` shards (TensorFlow's V2 format,
so tf.train.load_variable, HF's `load_tf_weights_in_gpt_neo` and GPT-Neo's own readers take it). It exists
when its index file does: a save writes every file under a staging folder, moves the data shards into
model_path, then the index (each move is a rename), and only then records the step in the `checkpoint`
state file. A save killed at any point leaves the previous checkpoints complete and no index that points
at missing data; what it left behind is removed by the next start (`remove_leftovers`). Deleting goes the other way: the index
first.

Retention is tf.train.Saver's (the Estimator's): the newest `keep` checkpoints stay, and an older one is
kept only if `keep_every_hours` have passed since the last one kept that way (config keys
keep_checkpoint_max and keep_checkpoint_every_n_hours).
"""
from __future__ import annotations

import os
import re
import time
from typing import Optional

import tensorflow.compat.v1 as tf

from config.schema import ConfigError

PREFIX = "model.ckpt"
STAGING = ".saving-"              # model_path/.saving-STEP/: a save in progress (or killed)
_INDEX = re.compile(r"^model\.ckpt-(\d+)\.index$")


def prefix_of(model_path: str, step: int) -> str:
    return os.path.join(model_path, f"{PREFIX}-{step}")


def step_of(prefix: str) -> int:
    """model_path/model.ckpt-600 -> 600."""
    return int(prefix.rsplit("-", 1)[1])


def steps(model_path: str) -> list[int]:
    """The steps of every complete checkpoint in model_path (an index file), ascending."""
    if not tf.io.gfile.isdir(model_path):
        return []
    found = (_INDEX.match(name) for name in tf.io.gfile.listdir(model_path))
    return sorted(int(m.group(1)) for m in found if m)


def latest(model_path: str) -> Optional[str]:
    """The prefix of the newest complete checkpoint, or None."""
    found = steps(model_path)
    return prefix_of(model_path, found[-1]) if found else None


def latest_step(model_path: str) -> int:
    """The step of the newest checkpoint; 0 when there is none."""
    found = steps(model_path)
    return found[-1] if found else 0


_LEFTOVER = re.compile(r"^(\.saving-\d+|model\.ckpt-\d+_temp.*|model\.ckpt-\d+\.meta\.tmp.*|graph\.pbtxt\.tmp.*)$")
_DATA = re.compile(r"^(model\.ckpt-\d+)\.data-\d+-of-\d+$")


def remove_leftovers(model_path: str) -> list[str]:
    """What interrupted saves leave behind (this runner's staging folders, TF's `_temp` folders and `.tmp`
    files, data shards whose index never arrived), never a complete checkpoint. Returns the names removed."""
    if not tf.io.gfile.isdir(model_path):
        return []
    names = [n.rstrip("/") for n in tf.io.gfile.listdir(model_path)]
    complete = {f"{PREFIX}-{step}" for step in steps(model_path)}
    removed = []
    for name in names:
        data = _DATA.match(name)
        if _LEFTOVER.match(name) or (data and data.group(1) not in complete):
            path = os.path.join(model_path, name)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)
            removed.append(name)
    return removed


class CheckpointWriter:
    """Saves the variables of `saver` (sharded, relative paths) into model_path, atomically, and rotates."""

    def __init__(self, model_path: str, saver: tf.train.Saver, keep: int = 5, keep_every_hours: float = 2.0):
        self.model_path, self.saver = model_path, saver
        self.keep, self.keep_every_hours = keep, keep_every_hours
        self.started = time.time()

    def save(self, session: tf.Session, step: int) -> str:
        """Writes model.ckpt-STEP; returns its prefix."""
        tf.io.gfile.makedirs(self.model_path)
        staging = os.path.join(self.model_path, f"{STAGING}{step}")
        if tf.io.gfile.exists(staging):
            tf.io.gfile.rmtree(staging)
        tf.io.gfile.makedirs(staging)
        written = self.saver.save(session, os.path.join(staging, f"{PREFIX}-{step}"), write_meta_graph=False,
                                  write_state=False)
        final = prefix_of(self.model_path, step)
        if tf.io.gfile.exists(final + ".index"):  # saving a step again: the old one stops existing first
            _delete(final)
        names = sorted(tf.io.gfile.listdir(staging))
        for name in [n for n in names if ".data-" in n] + [n for n in names if n.endswith(".index")]:
            tf.io.gfile.rename(os.path.join(staging, name), os.path.join(self.model_path, name), overwrite=True)
        tf.io.gfile.rmtree(staging)
        assert os.path.basename(written) == os.path.basename(final)
        self._rotate(step)
        return final

    def _rotate(self, new: int) -> None:
        """tf.train.Saver's rotation, over the checkpoints the state file lists (this writer's and earlier
        runs'): the newest `keep` stay listed; one leaving the list is deleted unless keep_every_hours have
        passed since the last one kept that way. Checkpoints the state file does not list (kept ones, an
        imported step 0) are never deleted."""
        state = _read_state(self.model_path)
        listed = [step_of(p) for p in state.all_model_checkpoint_paths] if state else []
        listed = [s for s in listed if s != new and tf.io.gfile.exists(prefix_of(self.model_path, s) + ".index")]
        listed.append(new)
        last_kept = state.last_preserved_timestamp if state and state.last_preserved_timestamp else self.started
        while len(listed) > self.keep:
            old = listed.pop(0)
            saved = _save_time(prefix_of(self.model_path, old))
            if saved - last_kept >= self.keep_every_hours * 3600:
                last_kept = saved
            else:
                _delete(prefix_of(self.model_path, old))
        names = [os.path.basename(prefix_of(self.model_path, s)) for s in listed]  # relative: the folder can move
        tf.train.update_checkpoint_state(
            self.model_path, names[-1], all_model_checkpoint_paths=names,
            all_model_checkpoint_timestamps=[_save_time(prefix_of(self.model_path, s)) for s in listed],
            last_preserved_timestamp=last_kept)


def _read_state(model_path: str):
    try:
        return tf.train.get_checkpoint_state(model_path)
    except (tf.errors.OpError, ValueError):  # an unreadable state file: rebuilt from this save on
        return None


def _save_time(prefix: str) -> float:
    try:
        return tf.io.gfile.stat(prefix + ".index").mtime_nsec / 1e9
    except tf.errors.NotFoundError:
        return time.time()


def _delete(prefix: str) -> None:
    """Index first, so that a delete cut short leaves no checkpoint that looks complete."""
    folder, base = os.path.split(prefix)
    tf.io.gfile.remove(prefix + ".index")
    for name in tf.io.gfile.listdir(folder):
        if name.startswith(base + ".data-") or name == base + ".meta":
            tf.io.gfile.remove(os.path.join(folder, name))


def require_checkpoint(folder: str) -> str:
    """The newest checkpoint in `folder` (a model_path); a one-line error when there is none."""
    found = latest(folder)
    if not found:
        raise ConfigError(f"no checkpoint in {folder}: train first (python main.py --model ...)")
    return found
