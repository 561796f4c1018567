"""File operations on a model_path, wherever it is: a local folder through `os`, a bucket (`gs://...`, any
path with a scheme) through TensorFlow's gfile, which is imported only then. So what a model_path holds can be
read without TensorFlow (tools/plot_runs.py, run_experiment.py, the ladder's status and fit), and a bucket
works wherever TensorFlow does."""
from __future__ import annotations

import os
import shutil


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


def write_atomically(path: str, text: str) -> None:
    """`text` written to a temporary file beside `path`, then renamed over it: a reader sees the old file or the
    whole new one, never a part."""
    with open_text(path + ".tmp", "w") as f:
        f.write(text)
    rename(path + ".tmp", path)
