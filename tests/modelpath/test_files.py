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
