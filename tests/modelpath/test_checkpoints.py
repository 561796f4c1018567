"""modelpath/checkpoints.py's one definition of a model_path's checkpoints and its newest, read without
TensorFlow (the bigger scenarios: tests/scenarios/test_checkpoint_safety.py)."""
import os
import subprocess
import sys

from modelpath import checkpoints, eval_results, run_info

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def touch_checkpoint(folder, step, index=True):
    (folder / f"model.ckpt-{step}.data-00000-of-00001").write_bytes(b"x")
    if index:
        (folder / f"model.ckpt-{step}.index").write_bytes(b"x")


def test_the_latest_checkpoint_is_the_newest_index_file_whatever_the_state_file_says(tmp_path):
    """The `checkpoint` state file (TensorFlow's) names step 3, the files hold 2, 10 and a save of 12 cut short
    (no index): latest is 10 and latest_step 10, from the files. Bug caught: latest_step read from the state file
    (run_experiment's old definition), or sorting the steps as strings ("10" < "2")."""
    for step in (2, 10):
        touch_checkpoint(tmp_path, step)
    touch_checkpoint(tmp_path, 12, index=False)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-3"\n')
    assert checkpoints.steps(str(tmp_path)) == [2, 10]
    assert checkpoints.latest(str(tmp_path)) == checkpoints.prefix_of(str(tmp_path), 10)
    assert checkpoints.latest_step(str(tmp_path)) == 10
    assert checkpoints.latest_step(str(tmp_path / "none")) == 0 and checkpoints.latest(str(tmp_path / "none")) is None


def test_run_info_keeps_every_start_and_survives_a_damaged_file(tmp_path, capsys):
    path = str(tmp_path)
    run_info.write(path, {"n_layer": 2, "train_steps": 10, "lr": 0.1}, start_step=0, sacred_id="7")
    run_info.write(path, {"n_layer": 2, "train_steps": 20, "lr": 0.05}, start_step=10)
    info = run_info.read(path)
    assert info["train_steps"] == 20 and [s["step"] for s in info["starts"]] == [0, 10]
    assert info["starts"][0]["sacred_id"] == "7" and info["starts"][1]["lr"] == 0.05
    (tmp_path / "run_info.json").write_text('{"cut short')
    assert run_info.read(path) is None and "damaged" in capsys.readouterr().err
    run_info.write(path, {"n_layer": 2}, start_step=20)  # a new one, the damaged one kept aside
    assert (tmp_path / "run_info.json.damaged").exists() and len(run_info.read(path)["starts"]) == 1


def test_eval_results_are_appended_and_a_line_cut_short_is_skipped(tmp_path):
    where = eval_results.path(str(tmp_path))
    eval_results.append(where, {"task": "validation", "step": 1, "loss": 2.5})
    eval_results.append(where, {"task": "validation", "step": 2, "loss": 2.0})
    with open(where, "a") as f:
        f.write('{"task": "valid')  # a write cut short by a crash
    assert [(r["step"], r["loss"]) for r in eval_results.read(where)] == [(1, 2.5), (2, 2.0)]
    assert eval_results.path(str(tmp_path), "elsewhere.jsonl") == "elsewhere.jsonl"


def test_reading_a_model_path_needs_no_tensorflow(tmp_path):
    """Tools, the ladder's fit and run_experiment read model_paths without importing TensorFlow. Bug caught: a
    module-level `import tensorflow` in modelpath/checkpoints.py (or any module it imports)."""
    touch_checkpoint(tmp_path, 5)
    code = ("import sys; from modelpath import checkpoints, run_info, eval_results, events, tokenizer_record, lock; "
            f"assert checkpoints.latest_step({str(tmp_path)!r}) == 5; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
