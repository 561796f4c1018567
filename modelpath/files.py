"""File operations on a model_path, wherever it is: a local folder through `os`, a bucket (`gs://...`, any
path with a scheme) through TensorFlow's gfile, which is imported only then. So what a model_path holds can be
read without TensorFlow (tools/plot_runs.py, run_experiment.py, the ladder's status and fit), and a bucket
works wherever TensorFlow does. `write_atomically` and `write_json_atomically` are the project's one way to
write a whole file (datasets' manifests, plans, results, the compiled decoder's traces, ...), in a model_path
or not."""
from __future__ import annotations

import json
import os
import secrets
import shutil

# How the name of `write_atomically`'s temporary ends after its target's: `.<pid>-<8 hex digits>.tmp`, for those who
# clear a crashed writer's leftovers (data/create_tfrecords.py)
TEMPORARY_TAIL = r"\.\d+-[0-9a-f]{8}\.tmp"


def is_remote(path: str) -> bool:
    """Whether `path` names a bucket (a scheme such as gs://), which only TensorFlow's gfile reaches."""
    return "://" in path


def _gfile():
    import tensorflow as tf
    return tf.io.gfile


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def listdir(path: str) -> list[str]:
    """The names in the folder `path` (a bucket's sub-folders without their trailing slash)."""
    if is_remote(path):
        return [name.rstrip("/") for name in _gfile().listdir(path)]
    return os.listdir(path)


def makedirs(path: str) -> None:
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
    if is_remote(path):
        _gfile().remove(path)
    else:
        os.remove(path)


def rmtree(path: str) -> None:
    if is_remote(path):
        _gfile().rmtree(path)
    else:
        shutil.rmtree(path)


def rename(source: str, target: str) -> None:
    """Moves `source` to `target`, replacing it (atomic on a local file system)."""
    if is_remote(source) or is_remote(target):
        _gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def copy(source: str, target: str) -> None:
    if is_remote(source) or is_remote(target):
        _gfile().copy(source, target, overwrite=True)
    else:
        shutil.copyfile(source, target)


def size(path: str) -> int:
    """The file's length in bytes; FileNotFoundError when it is gone."""
    if is_remote(path):
        import tensorflow as tf
        try:
            return _gfile().stat(path).length
        except tf.errors.NotFoundError as e:
            raise FileNotFoundError(path) from e
    return os.stat(path).st_size


def mtime(path: str) -> float:
    """When the file was last written (seconds since the epoch); FileNotFoundError when it is gone."""
    if is_remote(path):
        import tensorflow as tf
        try:
            return _gfile().stat(path).mtime_nsec / 1e9
        except tf.errors.NotFoundError as e:
            raise FileNotFoundError(path) from e
    return os.stat(path).st_mtime


def open_text(path: str, mode: str = "r"):
    """The file opened as text ("r", "w" or "a")."""
    if is_remote(path):
        return _gfile().GFile(path, mode)
    return open(path, mode, encoding="utf-8")


def write_atomically(path: str, data: str | bytes) -> None:
    """`data` (text as UTF-8) written to a temporary file of its own beside `path`, then renamed over it: a reader
    sees the old file or the whole new one, never a part, and two writers never share a temporary. A write that
    fails (a full disk, a read-only folder, an interrupt) raises and leaves `path` as it was and no temporary."""
    temporary = f"{path}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with (_gfile().GFile(temporary, "wb") if is_remote(path) else open(temporary, "xb")) as f:
            f.write(payload)
        rename(temporary, path)
    except BaseException:
        try:
            if exists(temporary):
                remove(temporary)
        except Exception:  # noqa: BLE001  (the write's own error is the one to raise)
            pass
        raise


def write_json_atomically(path: str, value, indent: int = 1, **dump_options) -> None:
    """`value` as JSON (ending with a newline) through `write_atomically`; `dump_options` go to json.dumps."""
    write_atomically(path, json.dumps(value, indent=indent, **dump_options) + "\n")
