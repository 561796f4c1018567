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
keep_checkpoint_max and keep_checkpoint_every_n_hours), or if its step is one of `keep_steps` (config key
keep_checkpoint_steps: the ladder branches runs from them).

What model_path can do to a run is checked before anything is written (CheckpointError, one line each): the
newest checkpoint that can be read is the one restored (`restorable`: one cut short or with an unreadable index
is skipped, saying so; none readable stops the run), its variables and shapes must be the config's graph's
(`check_fits`, from execution/mesh_session.py), the folders a job writes must be writable (`check_writable`), and
a failed save removes what it wrote and leaves every earlier checkpoint as it was, and weights holding inf or NaN
are never saved (`NonFiniteWeights`, raised by execution/mesh_session.py's save before anything is written). A missing or broken state
file never hides a checkpoint (they are found by their files) and is rewritten at the next start
(`repair_state`).

Finding checkpoints (`steps`, `latest`) reads file names only, without TensorFlow (modelpath/files.py); reading
an index (`problem`, `restorable`, `check_fits`) and writing (`CheckpointWriter`, `copy`, the state file) use it.
"""
from __future__ import annotations

import os
import re
import sys
import time
from typing import Mapping, Optional

from schema import ConfigError
from modelpath import files


def _tf():
    import tensorflow.compat.v1 as tf
    return tf


class CheckpointError(ConfigError):
    """A model_path whose checkpoints cannot be restored, do not fit the config, or cannot be written; or an output
    folder that cannot be written. One line: what is wrong and how to fix it (main.py prints it as `error: ...`)."""


class NonFiniteWeights(CheckpointError):
    """A save refused before anything was written: variables holding inf or NaN (`names`), a diverged
    run (execution/mesh_session.py checks; train/divergence.py says what to do)."""

    def __init__(self, model_path: str, step: int, names: list):
        self.step, self.names = step, names
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        super().__init__(f"not saving {PREFIX}-{step} in {model_path}: {names[0]}{more} hold inf or NaN")


PREFIX = "model.ckpt"
STAGING = ".saving-"              # model_path/.saving-STEP/: a save in progress (or killed)
STATE = "checkpoint"              # model_path/checkpoint: TensorFlow's list of the checkpoints, newest last
_INDEX = re.compile(r"^model\.ckpt-(\d+)\.index$")


def prefix_of(model_path: str, step: int) -> str:
    return os.path.join(model_path, f"{PREFIX}-{step}")


def step_of(prefix: str) -> int:
    """model_path/model.ckpt-600 -> 600."""
    return int(prefix.rsplit("-", 1)[1])


def weights_origin(prefix: Optional[str]) -> str:
    """Where a program's weights come from, for the line before its build: "restoring model.ckpt-600", or
    "initialising the weights" without a checkpoint."""
    return f"restoring {os.path.basename(prefix)}" if prefix else "initialising the weights"


def steps(model_path: str) -> list[int]:
    """The steps of every complete checkpoint in model_path (an index file), ascending."""
    if not files.isdir(model_path):
        return []
    found = (_INDEX.match(name) for name in files.listdir(model_path))
    return sorted(int(m.group(1)) for m in found if m)


def latest(model_path: str) -> Optional[str]:
    """The prefix of the newest complete checkpoint (its index file is there), or None. The one definition of a
    model_path's latest checkpoint: the `checkpoint` state file is TensorFlow's readers', rewritten to agree with
    this (`repair_state`), never read to find it. (`restorable` is the newest that can also be read.)"""
    found = steps(model_path)
    return prefix_of(model_path, found[-1]) if found else None


def latest_step(model_path: str) -> int:
    """The step of `latest` (0 without a checkpoint)."""
    found = steps(model_path)
    return found[-1] if found else 0


def warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def reason(error: BaseException) -> str:
    """One line of what an I/O or TensorFlow error says (its strerror, or the line of a session error's message
    that names the problem, without the node and stack trace around it)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    lines = [line.strip() for line in (getattr(error, "message", None) or str(error)).splitlines() if line.strip()]
    after_node = [i + 1 for i, line in enumerate(lines) if line.startswith("Node:")]
    if after_node and after_node[0] < len(lines):
        return lines[after_node[0]]
    return lines[0] if lines else type(error).__name__


def problem(prefix: str) -> Optional[str]:
    """Why the checkpoint at `prefix` cannot be restored (its index unreadable, a data shard missing or shorter
    than the index says: a copy or a disk cut short), or None. Reads the index and the data files' sizes only.
    FileNotFoundError when a file is removed while it is looked at."""
    tf = _tf()
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError) as e:
        return f"its index cannot be read: {reason(e)}"
    folder, base = os.path.split(prefix)
    shards = {}
    for name in files.listdir(folder):
        match = _DATA.match(name)
        if match and match.group(1) == base:
            shards[name] = files.size(os.path.join(folder, name))
    count = int(next(iter(shards)).rsplit("-of-", 1)[1]) if shards else 1
    wanted = [f"{base}.data-{i:05d}-of-{count:05d}" for i in range(count)]
    missing = [name for name in wanted if name not in shards]
    if missing:
        return f"its data file {missing[0]} is missing"
    if any(dtype == tf.string for dtype in dtypes.values()):
        return None  # string tensors have no fixed size to compare with
    need = sum(int(dtypes[name].size) * int(_product(shape)) for name, shape in shapes.items())
    have = sum(shards[name] for name in wanted)
    if have < need:
        return f"its data files hold {have} of the {need} bytes its index lists: cut short"
    return None


def _product(shape) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


_warned: set = set()


def restorable(model_path: str, say=warn) -> Optional[str]:
    """The prefix of the newest checkpoint that can be restored, found by its files (the state file is not
    needed); None when model_path has none. Newer ones that cannot be read are skipped, saying so in one line;
    when there are checkpoints and none can be read, a CheckpointError (a run never starts from scratch over
    them). A checkpoint removed while it is looked at (a trainer rotating it away: readers take no lock) is not
    one that cannot be read: the folder is listed once more."""
    found, vanished = _restorable(model_path, say, relist=True)
    return _restorable(model_path, say, relist=False)[0] if vanished else found


def _restorable(model_path: str, say, relist: bool) -> tuple:
    """(restorable's answer, whether a checkpoint vanished while it was looked at). On a vanished one: with
    `relist`, (None, True) at once; without, it is passed over like a checkpoint that never was."""
    skipped = []
    for step in reversed(steps(model_path)):
        prefix = prefix_of(model_path, step)
        try:
            why = problem(prefix)
        except FileNotFoundError as e:  # a data file removed between the listing and its size
            why = reason(e)
        if why is not None and not files.exists(prefix + ".index"):
            if relist:
                return None, True
            continue
        if why is None:
            if skipped and say and (model_path, skipped[0][0]) not in _warned:  # once per process
                _warned.add((model_path, skipped[0][0]))
                newest, newest_why = skipped[0]
                others = f" (and {len(skipped) - 1} more between)" if len(skipped) > 1 else ""
                say(f"{PREFIX}-{newest} in {model_path} cannot be read ({newest_why}){others}; using "
                    f"{PREFIX}-{step}, the newest checkpoint that can be read")
            return prefix, False
        skipped.append((step, why))
    if skipped:
        newest, why = skipped[0]
        others = f" (nor can the {len(skipped) - 1} older ones)" if len(skipped) > 1 else ""
        raise CheckpointError(f"no checkpoint in {model_path} can be read: {PREFIX}-{newest} {why}{others}: put back "
                              f"a good copy of its files, or pass --new to start over (it deletes {model_path})")
    return None, False


def slot_of(name: str, names, slot_patterns: Mapping[str, str]) -> Optional[str]:
    """The optimizer (a key of `slot_patterns`: opt_name -> the pattern of its slot names, models/optimizers.py's)
    whose slot `name` is, its variable being one of `names`; None for a variable of the model."""
    for opt_name, pattern in slot_patterns.items():
        match = re.fullmatch(pattern, name)
        if match and match.group("variable") in names:
            return opt_name
    return None


def check_fits(checkpoint: str, variables: dict, optional=(), slot_patterns: Mapping[str, str] = {}) -> None:
    """A CheckpointError unless the checkpoint holds every variable of the graph (`variables`: name -> shape;
    `optional` ones may be absent) with the same shape, and no model variable the graph lacks. Optimizer slots
    (the names `slot_patterns` match: opt_name -> pattern, from the job) in the checkpoint are not model
    variables, and neither are scopes the graph has no variable in, such as global_step in a sampling graph; a
    training graph's slots of one optimizer against a checkpoint with another's is its own error. Run before the
    checkpoint is restored and before anything is written."""
    folder, base = os.path.split(checkpoint)
    tf = _tf()
    try:
        stored = dict(tf.train.list_variables(checkpoint))
    except (tf.errors.OpError, ValueError) as e:
        raise CheckpointError(f"{base} in {folder} cannot be read ({reason(e)}): put back a good copy of its files, "
                              f"or delete them to use the previous checkpoint") from e
    stored_slots = {name: slot_of(name, stored, slot_patterns) for name in stored}
    stored_slots = {name: opt for name, opt in stored_slots.items() if opt}
    trains_with = {slot_of(name, variables, slot_patterns) for name in variables} - {None}
    trained_with = set(stored_slots.values())
    if trains_with and trained_with and not trains_with & trained_with:
        example = min(stored_slots)
        held, wanted = " and ".join(sorted(trained_with)), " and ".join(sorted(trains_with))
        raise CheckpointError(f"{base} in {folder} holds the optimizer state of {held} (e.g. {example}), but this "
                              f"config trains with opt_name {wanted}: set opt_name to {sorted(trained_with)[0]} to go "
                              f"on training it, or use another model_path (--new deletes this one and starts over)")
    differences = []
    for name in sorted(variables):
        shape = list(variables[name])
        if name in stored and list(stored[name]) != shape:
            differences.append(f"{name} is {list(stored[name])} there but {shape} in this config")
    for name in sorted(variables):
        if name not in stored and name not in optional:
            differences.append(f"{name} {list(variables[name])} is in this config but not in the checkpoint")
    scopes = {name.split("/")[0] for name in variables}
    for name in sorted(stored):
        if name not in variables and name.split("/")[0] in scopes and name not in stored_slots:
            differences.append(f"{name} {list(stored[name])} is in the checkpoint but not in this config")
    if differences:
        more = f" (and {len(differences) - 2} more)" if len(differences) > 2 else ""
        raise CheckpointError(f"{base} in {folder} is another model than the config's: {'; '.join(differences[:2])}"
                              f"{more}: use the config that trained it, or another model_path (--new deletes this "
                              f"one and starts over)")


def check_model_path(model_path: str) -> None:
    """A ConfigError unless model_path is set and is (or can become) a folder; run before any job uses it."""
    if not model_path:
        raise ConfigError("the config has no model_path: set it to the folder for checkpoints and logs")
    if os.path.exists(model_path) and not os.path.isdir(model_path):
        raise ConfigError(f"model_path {model_path} is a file, not a folder: set model_path to a folder for "
                          f"checkpoints and logs (or move the file away)")


def check_writable(folder: str, fix: str) -> None:
    """A CheckpointError unless this process can write in `folder` (or make it: then in its nearest existing
    parent), found with a write test that leaves nothing behind; `fix` says what to do instead. Local paths only
    (a bucket's permissions show at its first write)."""
    if files.is_remote(folder):
        return
    path = os.path.abspath(folder)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        where = folder if path == os.path.abspath(folder) else f"{path} (in {folder})"
        raise CheckpointError(f"{where} is a file, not a folder: {fix}")
    test = os.path.join(path, f".write-test-{os.getpid()}")
    try:
        with open(test, "w"):
            pass
        os.remove(test)
    except OSError as e:
        raise CheckpointError(f"cannot write in {path} ({reason(e)}): {fix}") from e


def repair_state(model_path: str, keep: int, restored: Optional[int]) -> Optional[str]:
    """Rewrites the `checkpoint` state file when it is missing, unreadable or out of step with the checkpoint
    files (listing one that is gone, or not the newest), so that TensorFlow's readers (tf.train.latest_checkpoint,
    HF's converter) find what this runner finds. It lists the checkpoints it listed that still exist, then the
    newer ones, up to `restored` (the step training restored; newer ones could not be read); rebuilt from
    nothing, the newest `keep` (older ones stay unlisted, so rotation never deletes them, as with the checkpoints
    keep_checkpoint_every_n_hours kept). Returns a line saying what was repaired, or None."""
    found = [s for s in steps(model_path) if restored is not None and s <= restored]
    if not found:
        return None
    state_path = os.path.join(model_path, STATE)
    state = _read_state(model_path)
    listed = None
    if state is not None and state.model_checkpoint_path:
        try:
            listed = [step_of(p) for p in state.all_model_checkpoint_paths] or [step_of(state.model_checkpoint_path)]
        except ValueError:
            listed = None
    if listed is None:
        why = "missing" if not files.exists(state_path) else "unreadable"
        wanted = found[-keep:] if keep else found
    else:
        kept = [s for s in listed if s in found]
        wanted = sorted(kept + [s for s in found if s > max(kept, default=-1)])
        current = step_of(state.model_checkpoint_path)
        if wanted == listed and current == wanted[-1]:
            return None
        why = "out of step with the checkpoint files"
    _write_state(model_path, wanted, state.last_preserved_timestamp if listed is not None else None)
    return (f"repaired {state_path} (it was {why}): it lists "
            f"{', '.join(f'{PREFIX}-{s}' for s in wanted)}")


def _write_state(model_path: str, listed: list, last_preserved: Optional[float]) -> None:
    names = [os.path.basename(prefix_of(model_path, s)) for s in listed]  # relative: the folder can move
    _tf().train.update_checkpoint_state(
        model_path, names[-1], all_model_checkpoint_paths=names,
        all_model_checkpoint_timestamps=[_save_time(prefix_of(model_path, s)) for s in listed],
        last_preserved_timestamp=last_preserved or time.time())


_LEFTOVER = re.compile(r"^(\.saving-\d+|model\.ckpt-\d+_temp.*|model\.ckpt-\d+\.meta\.tmp.*|graph\.pbtxt\.tmp.*"
                       r"|checkpoint\.tmp.*|\.write-test-\d+)$")
_DATA = re.compile(r"^(model\.ckpt-\d+)\.data-\d+-of-\d+$")


def remove_leftovers(model_path: str) -> list[str]:
    """What interrupted saves leave behind (this runner's staging folders, TF's `_temp` folders and `.tmp`
    files, the state file's `checkpoint.tmp*`, data shards whose index never arrived, a write test of
    `check_writable`), never a complete checkpoint. Returns the names removed."""
    if not files.isdir(model_path):
        return []
    names = files.listdir(model_path)
    complete = {f"{PREFIX}-{step}" for step in steps(model_path)}
    removed = []
    for name in names:
        data = _DATA.match(name)
        if _LEFTOVER.match(name) or (data and data.group(1) not in complete):
            path = os.path.join(model_path, name)
            if files.isdir(path):
                files.rmtree(path)
            else:
                files.remove(path)
            removed.append(name)
    return removed


class CheckpointWriter:
    """Saves the variables of `saver` (sharded, relative paths) into model_path, atomically, and rotates."""

    def __init__(self, model_path: str, saver, keep: int = 5, keep_every_hours: float = 2.0,
                 keep_steps=()):
        self.model_path, self.saver = model_path, saver
        self.keep, self.keep_every_hours, self.keep_steps = keep, keep_every_hours, frozenset(keep_steps)
        self.started = time.time()

    def save(self, session, step: int) -> str:
        """Writes model.ckpt-STEP; returns its prefix. A write that fails (disk full, read-only, not a folder) is a
        CheckpointError, after what it wrote is removed: the checkpoints saved before are as they were."""
        tf = _tf()
        try:
            return self._save(session, step)
        except (OSError, tf.errors.OpError) as e:
            if isinstance(e, OSError) and e.errno is None:
                raise  # no error of the file system (a process dying, as tests simulate): leftovers stay for the next start
            try:
                remove_leftovers(self.model_path)
            except (OSError, tf.errors.OpError):
                pass  # the next start removes them
            kept = ", ".join(f"{PREFIX}-{s}" for s in steps(self.model_path)) or "none"
            raise CheckpointError(f"could not save {PREFIX}-{step} in {self.model_path} ({reason(e)}); the checkpoints "
                                  f"saved before are intact ({kept}): free space or fix the folder, then run again "
                                  f"to resume from the newest") from e

    def _save(self, session, step: int) -> str:
        files.makedirs(self.model_path)
        staging = os.path.join(self.model_path, f"{STAGING}{step}")
        if files.exists(staging):
            files.rmtree(staging)
        files.makedirs(staging)
        written = self.saver.save(session, os.path.join(staging, f"{PREFIX}-{step}"), write_meta_graph=False,
                                  write_state=False)
        final = prefix_of(self.model_path, step)
        if files.exists(final + ".index"):  # saving a step again: the old one stops existing first
            _delete(final)
        names = sorted(files.listdir(staging))
        for name in [n for n in names if ".data-" in n] + [n for n in names if n.endswith(".index")]:
            files.rename(os.path.join(staging, name), os.path.join(self.model_path, name))
        files.rmtree(staging)
        assert os.path.basename(written) == os.path.basename(final)
        self._rotate(step)
        return final

    def _rotate(self, new: int) -> None:
        """tf.train.Saver's rotation, over the checkpoints the state file lists (this writer's and earlier
        runs'): the newest `keep` stay listed; one leaving the list is deleted unless keep_every_hours have
        passed since the last one kept that way, or its step is one of keep_steps. Checkpoints the state file
        does not list (kept ones, an imported step 0) are never deleted."""
        state = _read_state(self.model_path)
        listed = [step_of(p) for p in state.all_model_checkpoint_paths] if state else []
        # Listed newer ones cannot be read (training restored an older step): they stay, unlisted, until saved again.
        listed = sorted(s for s in listed if s < new and files.exists(prefix_of(self.model_path, s) + ".index"))
        listed.append(new)
        last_kept = state.last_preserved_timestamp if state and state.last_preserved_timestamp else self.started
        while len(listed) > self.keep:
            old = listed.pop(0)
            saved = _save_time(prefix_of(self.model_path, old))
            if old in self.keep_steps:
                continue  # kept, unlisted, as the hours' ones are
            if saved - last_kept >= self.keep_every_hours * 3600:
                last_kept = saved
            else:
                _delete(prefix_of(self.model_path, old))
        _write_state(self.model_path, listed, last_kept)


def copy(prefix: str, model_path: str) -> str:
    """The checkpoint at `prefix` copied into model_path (made if need be) as a checkpoint of the same step, landing
    as a save does: every file into a staging folder there, then the data shards moved in, then the index, so a
    copy cut short is no checkpoint (the next start removes what it left); then, where model_path has no state
    file, one listing the copy, so that TensorFlow's readers find it and training's start has nothing to repair.
    Returns the copy's prefix. (The ladder starts a branch from its trunk's checkpoint so: the branch's own
    model_path, resumed by training as any other.)"""
    step = step_of(prefix)
    folder, base = os.path.split(prefix)
    files.makedirs(model_path)
    staging = os.path.join(model_path, f"{STAGING}{step}")
    if files.exists(staging):
        files.rmtree(staging)
    files.makedirs(staging)
    names = sorted(n for n in files.listdir(folder) if n.startswith(base + ".data-") or n == base + ".index")
    for name in names:
        files.copy(os.path.join(folder, name), os.path.join(staging, name))
    for name in [n for n in names if ".data-" in n] + [n for n in names if n.endswith(".index")]:
        files.rename(os.path.join(staging, name), os.path.join(model_path, name))
    files.rmtree(staging)
    if not files.exists(os.path.join(model_path, STATE)):
        _write_state(model_path, [step], None)
    return prefix_of(model_path, step)


def _read_state(model_path: str):
    tf = _tf()
    try:
        return tf.train.get_checkpoint_state(model_path)
    except (tf.errors.OpError, ValueError):  # an unreadable state file: rebuilt from this save on
        return None


def _save_time(prefix: str) -> float:
    try:
        return files.mtime(prefix + ".index")
    except FileNotFoundError:
        return time.time()


def _delete(prefix: str) -> None:
    """Index first, so that a delete cut short leaves no checkpoint that looks complete."""
    folder, base = os.path.split(prefix)
    files.remove(prefix + ".index")
    for name in files.listdir(folder):
        if name.startswith(base + ".data-") or name == base + ".meta":
            files.remove(os.path.join(folder, name))


def require_checkpoint(folder: str) -> str:
    """The newest checkpoint in `folder` (a model_path) that can be read (`restorable`); a one-line error when
    there is none."""
    found = restorable(folder)
    if not found:
        raise ConfigError(f"no checkpoint in {folder}: train first (python main.py --model ...)")
    return found
