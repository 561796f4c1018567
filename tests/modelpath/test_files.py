"""modelpath/files.py: a model_path in a bucket goes through TensorFlow's gfile, a local one through `os`; TensorFlow's
in-memory file system (ram://) stands in for a bucket, which the tests cannot reach."""
import os

import pytest

from modelpath import eval_results, files, run_info


def test_a_model_path_with_a_scheme_is_written_and_read_through_gfile(tmp_path, monkeypatch):
    """run_info.json and eval results written to a ram:// model_path land there (gfile sees them) and nothing lands
    on the local disk; they read back as written, and a missing file's size or time is FileNotFoundError, as
    checkpoints.py expects of a local one. (Bugs: is_remote asking for `gs://` only, `path.startswith("gs://")`:
    another scheme's model_path is written to a local folder named after it; size letting gfile's NotFoundError
    through, which checkpoints.py's `except FileNotFoundError` does not catch.)"""
    import tensorflow as tf
    monkeypatch.chdir(tmp_path)  # where a path taken for local would land
    model_path = f"ram://{tmp_path.name}/run"
    assert files.is_remote(model_path) and not files.is_remote(str(tmp_path))
    run_info.write(model_path, {"n_layer": 2, "train_steps": 10}, start_step=0)
    where = eval_results.append(eval_results.path(model_path), {"task": "validation", "step": 10, "loss": 5.0})
    assert tf.io.gfile.exists(f"{model_path}/run_info.json") and tf.io.gfile.exists(where)
    assert os.listdir(tmp_path) == []
    assert run_info.read(model_path)["train_steps"] == 10
    assert [r["loss"] for r in eval_results.read(where)] == [5.0]
    assert sorted(files.listdir(model_path)) == ["eval_results.jsonl", "run_info.json"]
    assert files.size(f"{model_path}/run_info.json") == len(tf.io.gfile.GFile(f"{model_path}/run_info.json").read())
    for read in (files.size, files.mtime):
        with pytest.raises(FileNotFoundError):
            read(f"{model_path}/model.ckpt-1.index")


@pytest.mark.parametrize("failing", ["write", "rename", "interrupt"])
def test_a_failed_whole_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, failing):
    """A full disk while writing, a rename that fails, Ctrl-C in between: the old file stays as it was, whole, and
    no temporary is left beside it. (Bugs: the temporary not removed on failure; the file written in place.)"""
    path = tmp_path / "plan.json"
    files.write_json_atomically(str(path), {"steps": 1})
    before = path.read_bytes()

    class Failing:
        def __init__(self, *args, **kwargs):
            self.handle = open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            self.handle.write(data[:5])  # part of it reached the disk
            raise OSError(28, "No space left on device")

    error = KeyboardInterrupt if failing == "interrupt" else OSError
    if failing == "write":
        monkeypatch.setattr(files, "open", Failing, raising=False)
    else:
        def fail(*args):
            raise error("stopped")
        monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(error):
        files.write_json_atomically(str(path), {"steps": 2, "more": "x" * 1000})
    assert os.listdir(tmp_path) == ["plan.json"] and path.read_bytes() == before


def test_two_writers_never_share_a_temporary_and_text_and_bytes_land_whole(tmp_path, monkeypatch):
    """Each write takes a temporary of its own (two processes writing one file each rename their own whole file,
    never one the other is still writing): the names the writes opened differ. (Bug: a fixed `path + ".tmp"`.)"""
    opened = []
    real_open = open
    monkeypatch.setattr(files, "open", lambda name, mode: opened.append(name) or real_open(name, mode),
                        raising=False)
    path = str(tmp_path / "out")
    files.write_atomically(path, "é\n")
    assert open(path, "rb").read() == "é\n".encode()
    files.write_atomically(path, b"\x00\x01")
    assert open(path, "rb").read() == b"\x00\x01"
    assert len(set(opened)) == 2 and all(name.startswith(path + ".") for name in opened)
    assert os.listdir(tmp_path) == ["out"]
