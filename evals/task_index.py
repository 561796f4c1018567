"""lm-eval's index of its own tasks, kept on disk between processes.

lm-eval's TaskManager indexes every task YAML it ships (14,683 entries from 13,986 files in lm-eval 0.4.13) in
every process that names one of its tasks: 5.6 CPU s before `--eval`'s first row or a training run's first step
on a 2-core EPYC. Those files change only when lm-eval does, so the index of that folder is kept as a pickle
(0.66 s to load), keyed by lm-eval's version and the folder's YAML files (how many, the newest change), in
$GPT_NEO_TASK_INDEX_CACHE ("off" for none) or $XDG_CACHE_HOME/gpt-neo/lm-eval-index (~/.cache/...). The
include_path's tasks are indexed afresh every time, as lm-eval does, and override lm-eval's own of the same name.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Optional

from console.environment import cache_root

CACHE_VARIABLE = "GPT_NEO_TASK_INDEX_CACHE"
CACHE_FOLDER = "gpt-neo/lm-eval-index"  # under $XDG_CACHE_HOME or ~/.cache


def cache_folder(environ=os.environ) -> Optional[str]:
    """Where the index is kept: $GPT_NEO_TASK_INDEX_CACHE, else the user's cache folder; None when switched off."""
    return cache_root(CACHE_VARIABLE, CACHE_FOLDER, environ)


def cache_key(root: Path) -> str:
    """lm-eval's version, the folder, and its YAML files' count and newest modification: a changed, added or
    removed task file (an editable install of lm-eval) makes another key."""
    files = list(root.glob("**/*.yaml"))
    newest = max((p.stat().st_mtime_ns for p in files), default=0)
    text = f"{metadata.version('lm_eval')}|{root.resolve()}|{len(files)}|{newest}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def folder_index(root: Path, folder: Optional[str], build) -> dict:
    """`build([root])` (lm-eval's TaskIndex.build), read from `folder` when it holds the index for this key and
    written there when not; a cache that cannot be read is built again, one that cannot be written is left."""
    if folder is None:
        return build([root])
    path = os.path.join(folder, f"tasks-{cache_key(root)}.pickle")
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError):
        pass
    index = build([root])
    try:
        os.makedirs(folder, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=folder, prefix=".tasks-", suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as f:
                pickle.dump(index, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial, path)  # whole or not there: a reader never meets half a file
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    except OSError:
        pass
    return index


@contextlib.contextmanager
def lm_evals_own_tasks_cached(folder: Optional[str], defaults_root: Optional[Path] = None):
    """While inside, lm-eval's TaskIndex.build (which TaskManager calls with lm-eval's own tasks folder first, then
    the include_path) reads `defaults_root` (default: that folder) through `folder_index`; the others it indexes
    as before, a later folder's task overriding an earlier one's of the same name, as lm-eval merges them."""
    from lm_eval.tasks import _index, manager
    defaults_root = Path(defaults_root or Path(manager.__file__).parent).resolve()
    original = _index.TaskIndex.build

    def build(paths, *, resolve_includes=True):
        index = {}
        for root in paths:
            if resolve_includes and Path(root).resolve() == defaults_root:
                index.update(folder_index(Path(root), folder, original))
            else:
                index.update(original([root], resolve_includes=resolve_includes))
        return index

    _index.TaskIndex.build = staticmethod(build)
    try:
        yield
    finally:
        _index.TaskIndex.build = staticmethod(original)
