"""A model_path you can trust (issue 14): a broken `checkpoint` state file, a cut-short newest checkpoint, a
checkpoint of another model shape, write failures (read-only, disk full, a file where model_path should be,
a failed --predict write) and the leftovers of interrupted saves. Every case is main.py as a user runs it
(in this process, so TensorFlow starts once): one `error:` line and exit 1, or a resume from the newest
readable checkpoint, and the checkpoints already there intact."""
import errno
import json
import os
import re
import shutil
import socket
import tempfile
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import main
from permissions import read_only
from modelpath import checkpoints
from workspace import copy_workspace

# The session's trained workspace (conftest.py: 2 layers, 32 wide, checkpoints at steps 1 and 2), sampling
# settings for --predict.
MODEL = dict(predict_batch_size=2, max_new_tokens=3, sampling_seed=1)


@pytest.fixture(scope="module")
def trained(trained_workspace, tmp_path_factory):
    """This module's copy of the trained workspace: a model_path holding model.ckpt-1 and model.ckpt-2 (and its
    state file), and a prompt."""
    root = tmp_path_factory.mktemp("safety")
    copy_workspace(trained_workspace, root, **MODEL)
    (root / "prompt.txt").write_text("import json\n")
    return root


def copy_run(trained, tmp_path, **changes):
    """A copy of the trained model_path under tmp_path and a config using it (with `changes`)."""
    model_path = tmp_path / "run"
    shutil.copytree(trained / "run", model_path)
    model = json.loads((trained / "configs" / "tiny.json").read_text())
    model.update(changes, model_path=str(model_path))
    config = trained / "configs" / f"{tmp_path.name}.json"  # beside dataset_configs/
    config.write_text(json.dumps(model))
    return str(config), str(model_path)


def run(capsys, config, *args):
    """main.py in this process: (exit code, stdout, stderr)."""
    code = main.main(["--model", config, "--peak_tflops", "1", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(code, err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


def snapshot(folder):
    """Every file under folder with its size, modification time and bytes: 'nothing was touched' compares two."""
    found = {}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.stat(path)
            data = open(path, "rb").read() if name in files else None
            found[os.path.relpath(path, folder)] = (info.st_size if data is not None else None, info.st_mtime_ns, data)
    return found


def restorable(model_path, step):
    return tf.train.list_variables(checkpoints.prefix_of(model_path, step))


def state_steps(model_path):
    state = tf.train.get_checkpoint_state(model_path)
    return [checkpoints.step_of(p) for p in state.all_model_checkpoint_paths]


# ----------------------------------------------------------------------------------------------------
# 1. A broken state file, a cut-short newest checkpoint; 4. leftovers of interrupted saves


@pytest.fixture(scope="module")
def resumed_after_a_crash(trained, tmp_path_factory):
    """A model_path as a crash or a bad copy leaves it: a garbage state file, model.ckpt-2's data file cut
    short, and the leftovers of a save killed half-way; then training to step 3."""
    tmp_path = tmp_path_factory.mktemp("crash")
    config, model_path = copy_run(trained, tmp_path, train_steps=3)
    with open(os.path.join(model_path, "checkpoint"), "w") as f:
        f.write("this is not a checkpoint state\x00\x01")
    shard = max((n for n in os.listdir(model_path) if n.startswith("model.ckpt-2.data-")),
                key=lambda n: os.path.getsize(os.path.join(model_path, n)))
    os.truncate(os.path.join(model_path, shard), os.path.getsize(os.path.join(model_path, shard)) // 2)
    leftovers = ["model.ckpt-3_temp/part-00000-of-00002.index", ".saving-3/model.ckpt-3.index",
                 "model.ckpt-3.meta.tmp1f2e", "graph.pbtxt.tmp9a8b", "checkpoint.tmp0c0d"]
    for name in leftovers:
        os.makedirs(os.path.dirname(os.path.join(model_path, name)), exist_ok=True)
        open(os.path.join(model_path, name), "w").write("half")
    code = main.main(["--model", config, "--peak_tflops", "1", "--log_every", "1"])
    return code, model_path, shard


@pytest.mark.slow
def test_a_broken_state_file_never_restarts_training_from_step_0(resumed_after_a_crash):
    code, model_path, _ = resumed_after_a_crash
    assert code == 0
    assert checkpoints.steps(model_path) == [1, 2, 3]  # nothing rotated away, step 2 saved again
    assert int(tf.train.load_variable(checkpoints.prefix_of(model_path, 3), "global_step")) == 3
    assert state_steps(model_path) == [1, 2, 3]  # the state file was repaired


@pytest.mark.slow
def test_a_cut_short_newest_checkpoint_falls_back_to_the_previous_one(resumed_after_a_crash, trained):
    code, model_path, shard = resumed_after_a_crash
    assert code == 0
    # Resumed from step 1 (2 could not be read): steps 2 and 3 were trained again and model.ckpt-2 is whole.
    assert os.path.getsize(os.path.join(model_path, shard)) == os.path.getsize(trained / "run" / shard)
    for step in (1, 2, 3):
        assert restorable(model_path, step)


@pytest.mark.slow
def test_leftovers_of_interrupted_saves_are_removed_at_the_next_start(resumed_after_a_crash):
    _, model_path, _ = resumed_after_a_crash
    names = sorted(os.listdir(model_path))
    assert not [n for n in names if "_temp" in n or ".tmp" in n or n.startswith(".saving-")], names
    assert {f"model.ckpt-{s}.index" for s in (1, 2, 3)} <= set(names)


@pytest.mark.parametrize("state", ["missing", "empty", "garbage"])
def test_predict_eval_and_export_find_checkpoints_without_a_state_file(trained, tmp_path, capsys, state):
    config, model_path = copy_run(trained, tmp_path)
    path = os.path.join(model_path, "checkpoint")
    os.remove(path)
    if state != "missing":
        open(path, "w").write("" if state == "empty" else "model_checkpoint_path: \x00garbage")
    assert checkpoints.require_checkpoint(model_path).endswith("model.ckpt-2")  # what --predict, --eval and --export use


def test_a_cut_short_newest_checkpoint_is_reported_in_one_line(trained, tmp_path, capsys):
    config, model_path = copy_run(trained, tmp_path)
    shard = max((n for n in os.listdir(model_path) if n.startswith("model.ckpt-2.data-")),
                key=lambda n: os.path.getsize(os.path.join(model_path, n)))
    os.truncate(os.path.join(model_path, shard), 100)
    step = checkpoints.prefix_of(model_path, 1)
    found = checkpoints.require_checkpoint(model_path)
    assert found == step
    warning = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(warning) == 1 and "model.ckpt-2" in warning[0] and "model.ckpt-1" in warning[0], warning
    # When no checkpoint can be read: one line that says so and how to start over; nothing is touched.
    for name in os.listdir(model_path):
        if name.startswith("model.ckpt-1.data-"):
            os.truncate(os.path.join(model_path, name), 0)
    before = snapshot(model_path)
    for args in ([], ["--predict", "--prompt", str(trained / "prompt.txt")], ["--export"]):
        line = one_error(*run(capsys, config, *args)[::2])
        assert "model.ckpt-2" in line and "--new" in line, line
    assert snapshot(model_path) == before


# ----------------------------------------------------------------------------------------------------
# 2. A checkpoint of another model shape


@pytest.mark.parametrize("job", [[], ["--predict"], ["--export"]], ids=["train", "predict", "export"])
def test_a_checkpoint_of_another_shape_is_one_line_and_nothing_is_touched(trained, tmp_path, capsys, job):
    config, model_path = copy_run(trained, tmp_path, n_embd=64, train_steps=3)
    if job == ["--predict"]:
        job = job + ["--prompt", str(trained / "prompt.txt")]
    before = snapshot(model_path)
    line = one_error(*run(capsys, config, *job)[::2])
    assert "model.ckpt-2" in line and "gpt2/" in line and "32]" in line and "64]" in line, line
    assert snapshot(model_path) == before


# ----------------------------------------------------------------------------------------------------
# 2b. --new deletes last: every refusal comes first


@pytest.mark.parametrize("refusal", ["memory", "data", "lock", pytest.param("harness", marks=pytest.mark.slow)])
def test_new_yes_refused_by_a_check_leaves_model_path_and_its_checkpoints(trained, tmp_path, capsys, monkeypatch,
                                                                         refusal):
    """`--new --yes` deleted model_path, then the memory check refused the job: the run was gone and nothing
    trained. The memory check, training's data check (stitch 1 of documents shorter than n_ctx+1), a running
    trainer's lock and the harness tasks' check (a harness_include_path that is not there: the check of an unknown
    task name indexes all of lm-eval's tasks, ~7 CPU s, and tests/evals/test_harness.py makes it) all refuse
    before anything is deleted."""
    from plan import memory_check
    changes = dict(datasets=[["tiny", 1, "documents_random", 1.0]], n_ctx=4096) if refusal == "data" else {}
    config, model_path = copy_run(trained, tmp_path, train_steps=3, **changes)
    if refusal in ("memory", "lock"):  # with a lock held too, the lock is what refuses: it is checked first
        monkeypatch.setattr(memory_check, "available_host_bytes", lambda: 1024.0)
    if refusal == "lock":  # this process, alive, holds the lock
        with open(os.path.join(model_path, ".trainer.lock"), "w") as f:
            json.dump({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}, f)
    tasks = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "harness_tasks")
    flags = ["--harness_tasks", "tiny_lambada", "--harness_include_path", tasks + "_typo"] \
        if refusal == "harness" else []
    before = snapshot(model_path)
    code, out, err = run(capsys, config, "--new", "--yes", *flags)
    line = one_error(code, err)
    expected = {"memory": "error: training ", "data": "error: stitch 1 * shortest document",
                "lock": f"error: {model_path} is being trained by pid {os.getpid()}",
                "harness": f"error: harness_include_path {tasks}_typo is not a folder"}[refusal]
    assert line.startswith(expected), line
    assert "deleted" not in out and snapshot(model_path) == before


# ----------------------------------------------------------------------------------------------------
# 3. Write failures


@pytest.mark.parametrize("job", [[], ["--predict"], ["--eval"], ["--export"]],
                         ids=["train", "predict", "eval", "export"])
def test_a_read_only_model_path_is_one_line(trained, tmp_path, capsys, job):
    """Runs as root too (tests/permissions.py). Bugs caught: a job that skips modelpath/checkpoints.check_writable
    (a traceback, or files written where root writes all the same), an error line without the folder."""
    config, model_path = copy_run(trained, tmp_path, train_steps=3)
    if job == ["--predict"]:
        job = job + ["--prompt", str(trained / "prompt.txt")]
    with read_only(model_path):
        before = snapshot(model_path)
        line = one_error(*run(capsys, config, *job)[::2])
        assert model_path in line and ("permission" in line.lower() or "read-only" in line.lower()), line
        assert snapshot(model_path) == before


def test_a_model_path_that_is_a_file_is_one_line(trained, tmp_path, capsys):
    config, model_path = copy_run(trained, tmp_path)
    shutil.rmtree(model_path)
    open(model_path, "w").write("not a folder")
    line = one_error(*run(capsys, config)[::2])
    assert model_path in line and "not a folder" in line, line
    assert open(model_path).read() == "not a folder"


@pytest.mark.slow
def test_a_full_disk_mid_save_is_one_line_and_the_checkpoints_stay(trained, tmp_path, capsys, monkeypatch):
    config, model_path = copy_run(trained, tmp_path, train_steps=3)
    before = {n: open(os.path.join(model_path, n), "rb").read() for n in os.listdir(model_path)
              if n.startswith("model.ckpt-")}
    save = tf.train.Saver.save

    def disk_full(self, session, save_path, *args, **kwargs):
        with open(save_path + ".data-00000-of-00002", "wb") as f:  # half a shard, then the disk is full
            f.write(b"\x00" * 100)
        raise tf.errors.ResourceExhaustedError(None, None, f"{save_path}.data-00000-of-00002; No space left on device")

    monkeypatch.setattr(tf.train.Saver, "save", disk_full)
    line = one_error(*run(capsys, config)[::2])
    monkeypatch.setattr(tf.train.Saver, "save", save)
    assert "model.ckpt-3" in line and "No space left on device" in line, line
    after = {n: open(os.path.join(model_path, n), "rb").read() for n in os.listdir(model_path)
             if n.startswith("model.ckpt-")}
    assert after == before
    assert not [n for n in os.listdir(model_path) if n.startswith(checkpoints.STAGING)]
    assert state_steps(model_path) == [1, 2] and restorable(model_path, 2)


def test_a_failed_predict_write_keeps_the_samples(trained, tmp_path, capsys, monkeypatch):
    config, model_path = copy_run(trained, tmp_path)
    import infer.predict

    def no_space(path, *args, **kwargs):
        if str(path).startswith(model_path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(infer.predict, "open", no_space, raising=False)
    kept = tmp_path / "tmp"  # where the samples go: the temporary folder, here inside this test's own
    kept.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(kept))
    code, out, err = run(capsys, config, "--predict", "--prompt", str(trained / "prompt.txt"))
    line = one_error(code, err)
    assert "No space left on device" in line and "samples" in line, line
    assert out.count("======== sample") == 2  # printed, all of them
    words = [word.rstrip(";:,.)") for word in line.split()]
    saved = [word for word in words if os.path.isabs(word) and word.endswith(".jsonl") and not word.startswith(model_path)]
    assert saved and os.path.dirname(saved[0]) == str(kept), line
    records = [json.loads(l) for l in open(saved[0], encoding="utf-8")]
    assert len(records) == 2 and all(r["step"] == 2 for r in records)
    assert not [n for n in os.listdir(model_path) if n.startswith("predictions_")]


# ----------------------------------------------------------------------------------------------------
# 5. A run that diverges (issue 29): stopped in one line, no checkpoint of inf or NaN, resumable


def checkpoint_files(model_path):
    """The checkpoint files and the state file, with their bytes."""
    return {n: open(os.path.join(model_path, n), "rb").read() for n in os.listdir(model_path)
            if n.startswith("model.ckpt-") or n == "checkpoint"}


def all_finite(prefix):
    return all(np.all(np.isfinite(tf.train.load_variable(prefix, name)))
               for name, _ in tf.train.list_variables(prefix) if name != "global_step")


@pytest.mark.slow
def test_an_update_that_makes_the_weights_inf_is_never_saved_and_the_run_resumes(trained, tmp_path, capsys):
    """lr 1e39 is inf in float32: step 3's update (from model.ckpt-2's finite weights, with a finite loss and
    gradient norm) leaves inf and NaN in every weight, and step 3 is a save. One error line names step 3 and
    what to change; model.ckpt-1 and -2 and the state file are byte for byte as they were (no model.ckpt-3 was
    written, so rotation deleted nothing). With the config's lr back, the same command resumes from
    model.ckpt-2 and trains to the end. Bugs caught: a save that writes what it holds (model.ckpt-3 of NaN, the
    newest), a check after the write (rotation, the state file), a stop that exits 0."""
    config, model_path = copy_run(trained, tmp_path, lr=1e39, train_steps=4)
    before = checkpoint_files(model_path)
    line = one_error(*run(capsys, config)[::2])
    assert "diverged at step 3" in line and "inf or NaN" in line and "model.ckpt-2" in line and "lr" in line, line
    assert checkpoint_files(model_path) == before
    good = json.loads(open(config).read())
    good["lr"] = json.loads((trained / "configs" / "tiny.json").read_text())["lr"]
    open(config, "w").write(json.dumps(good))
    code, _, err = run(capsys, config)
    assert code == 0, err
    assert checkpoints.steps(model_path) == [1, 2, 3, 4] and all_finite(checkpoints.prefix_of(model_path, 4))


@pytest.mark.slow
def test_a_non_finite_loss_stops_the_run_at_its_step_with_nothing_saved_after(trained, tmp_path, capsys):
    """lr 1e30: step 3's update leaves finite weights of order 1e30 (no save: checkpoints every 2 steps), whose
    products overflow in step 4's forward pass. The run stops at step 4 in one line naming it and the loss;
    model.ckpt-2 stays the newest, its weights finite. Bug caught: a loop that trains on (and saves model.ckpt-4)
    after the loss became non-finite."""
    config, model_path = copy_run(trained, tmp_path, lr=1e30, train_steps=6)
    code, out, err = run(capsys, config, "--steps_per_checkpoint", "2", "--log_every", "1")
    line = one_error(code, err)
    assert "diverged at step 4" in line and re.search(r"loss (nan|inf)", line) and "model.ckpt-2" in line, line
    assert re.search(r"step +4/6 \| loss (nan|inf)", out), out  # the progress line of the step is shown
    assert checkpoints.steps(model_path) == [1, 2] and all_finite(checkpoints.prefix_of(model_path, 2))
