"""One trainer per model_path (issue 22): the lock file, refused with one line naming the holder, stale locks taken
over; readers (--predict, --eval, --export) take no lock and cope with a checkpoint rotated away while they open
it."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import main
from config import load_config, replace
from modelpath import checkpoints
from modelpath.lock import LOCK, LockedError, TrainerLock, read
from tiny import compute_logits, devices_for, random_tokens
from workspace import make_workspace, run_main_in_process, start_main, wait_for_line


def write_lock(model_path, **holder):
    os.makedirs(model_path, exist_ok=True)
    with open(os.path.join(model_path, LOCK), "w") as f:
        json.dump(holder, f)


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_second_trainer_is_refused_naming_the_first(tmp_path):
    model_path = str(tmp_path / "run")
    with TrainerLock(model_path):
        holder = read(model_path)
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(LockedError) as refused:
            TrainerLock(model_path).acquire()
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(refused.value)
        assert "one trainer per model_path" in str(refused.value)
    assert not os.path.exists(os.path.join(model_path, LOCK))  # released


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path):
    model_path = str(tmp_path / "run")
    said = []
    write_lock(model_path, host=socket.gethostname(), pid=dead_pid(), started=time.time() - 60)
    with TrainerLock(model_path, say=said.append):
        assert read(model_path)["pid"] == os.getpid()
    assert len(said) == 1 and "no longer running" in said[0], said
    # A live pid that started after the lock was written is another process that reused the number: stale too.
    write_lock(model_path, host=socket.gethostname(), pid=os.getpid(), started=time.time() - 10 ** 7)
    with TrainerLock(model_path, say=said.append):
        assert read(model_path)["started"] > time.time() - 60
    # A damaged lock file: stale once it is old (a fresh empty one is a trainer just writing it).
    open(os.path.join(model_path, LOCK), "w").close()
    with pytest.raises(LockedError, match="just starting"):
        TrainerLock(model_path).acquire()
    old = time.time() - 3600
    os.utime(os.path.join(model_path, LOCK), (old, old))
    with TrainerLock(model_path, say=said.append):
        pass
    assert "damaged" in said[-1]


def test_a_lock_of_another_host_is_refused_saying_how_to_remove_it(tmp_path):
    model_path = str(tmp_path / "run")
    write_lock(model_path, host="node-017", pid=4242, started=time.time())
    with pytest.raises(LockedError) as refused:
        TrainerLock(model_path).acquire()
    message = str(refused.value)
    assert "pid 4242 on host node-017" in message and f"delete {os.path.join(model_path, LOCK)}" in message


def test_main_refuses_to_train_a_locked_model_path_in_one_line_and_touches_nothing(tmp_path, capsys):
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]])
    model_path = str(tmp_path / "run")
    write_lock(model_path, host=socket.gethostname(), pid=os.getppid(), started=time.time() - 5)
    before = sorted(os.listdir(model_path))
    assert main.main(["--model", config, "--peak_tflops", "1"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and f"pid {os.getppid()}" in err[0], err
    assert sorted(os.listdir(model_path)) == before and read(model_path)["pid"] == os.getppid()
    # --new deletes nothing under a running trainer either
    assert main.main(["--model", config, "--peak_tflops", "1", "--new", "--yes"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and f"pid {os.getppid()}" in err[0], err
    assert sorted(os.listdir(model_path)) == before


@pytest.fixture(scope="module")
def two_checkpoints(trained_workspace):
    """The session's trained workspace (checkpoints 1 and 2), some tokens and their logits at checkpoint 2."""
    cfg = load_config(os.path.join(trained_workspace, "configs", "tiny.json"))
    assert checkpoints.steps(cfg.model_path) == [1, 2]
    tokens = random_tokens([2, cfg.n_ctx], vocab=cfg.n_vocab, seed=32)
    return cfg, tokens, compute_logits(cfg, tokens, devices_for(cfg), checkpoints.prefix_of(cfg.model_path, 2))


def copy_of(cfg, tmp_path):
    import shutil
    shutil.copytree(cfg.model_path, tmp_path / "run")
    return replace(cfg, model_path=str(tmp_path / "run"))


def remove_checkpoint(model_path, step):
    prefix = checkpoints.prefix_of(model_path, step)
    os.remove(prefix + ".index")  # as rotation does: the index first
    for name in os.listdir(model_path):
        if name.startswith(os.path.basename(prefix) + ".data-"):
            os.remove(os.path.join(model_path, name))


def test_a_reader_whose_checkpoint_was_rotated_away_takes_the_newest(two_checkpoints, tmp_path, capsys):
    cfg, tokens, newest_logits = two_checkpoints
    cfg = copy_of(cfg, tmp_path)
    remove_checkpoint(cfg.model_path, 1)  # chosen by the reader, then rotated away by the trainer
    logits = compute_logits(cfg, tokens, devices_for(cfg), checkpoints.prefix_of(cfg.model_path, 1))
    np.testing.assert_array_equal(logits, newest_logits)
    err = capsys.readouterr().err
    assert "model.ckpt-1" in err and "removed while it was being read" in err and "model.ckpt-2" in err, err


def test_a_checkpoint_removed_during_its_restore_is_retried_once_from_the_newest(two_checkpoints, tmp_path,
                                                                                 monkeypatch):
    cfg, tokens, newest_logits = two_checkpoints
    cfg = copy_of(cfg, tmp_path)
    restore, calls = tf.train.Saver.restore, []

    def rotated_meanwhile(self, session, path):
        calls.append(os.path.basename(path))
        if len(calls) == 1:
            remove_checkpoint(cfg.model_path, 1)
        return restore(self, session, path)

    monkeypatch.setattr(tf.train.Saver, "restore", rotated_meanwhile)
    logits = compute_logits(cfg, tokens, devices_for(cfg), checkpoints.prefix_of(cfg.model_path, 1))
    assert calls == ["model.ckpt-1", "model.ckpt-2"]
    np.testing.assert_array_equal(logits, newest_logits)

    # Once only: a checkpoint that cannot be restored for another reason is still one error.
    monkeypatch.setattr(tf.train.Saver, "restore", restore)
    for name in os.listdir(cfg.model_path):
        if name.startswith("model.ckpt-2.data-"):
            os.truncate(os.path.join(cfg.model_path, name), 10)
    with pytest.raises(checkpoints.CheckpointError, match="model.ckpt-2"):
        compute_logits(cfg, tokens, devices_for(cfg), checkpoints.prefix_of(cfg.model_path, 2))


@pytest.mark.slow
def test_while_one_trainer_runs_a_second_is_refused_and_predict_reads_the_rotating_checkpoints(tmp_path):
    """The issue's scenario across processes: a trainer in a process of its own, saving every 10 steps (well under a
    second here) and keeping two checkpoints, so that the one --predict chose is rotated away while it builds its
    graph; a second trainer started on the same model_path meanwhile. The second trainer and --predict run main()
    in this test's process: another process than the trainer's, which is what the lock and the rotation see (a
    fresh TensorFlow for each only added its start-up). The second asks for --train_steps 1, so that were it not
    refused it would stop at once here rather than train on. Bug caught: TrainerLock taking over a live trainer's
    lock (lock._alive always False)."""
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]], train_steps=100000,
                            steps_per_checkpoint=10, keep_checkpoint_max=2, max_new_tokens=2)
    (tmp_path / "prompt.txt").write_text("import json\n")
    first = start_main("--model", config, "--log_every", "1", "--peak_tflops", "1")
    try:
        wait_for_line(first, r"step +11/100000 \| loss")
        drain = threading.Thread(target=first.stdout.read, daemon=True)  # the trainer never waits on its pipe
        drain.start()
        second = run_main_in_process("--model", config, "--peak_tflops", "1", "--train_steps", "1")
        reader = run_main_in_process("--model", config, "--predict", "--prompt", str(tmp_path / "prompt.txt"))
        assert first.poll() is None  # still training through both
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
        drain.join(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    errors = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 1 and len(errors) == 1, second.stderr[-3000:]
    assert errors[0].startswith("error: ") and f"pid {first.pid} on host {socket.gethostname()}" in errors[0]
    assert reader.returncode == 0 and "======== sample" in reader.stdout, reader.stderr[-3000:]
    assert first.returncode == 143
    assert not os.path.exists(os.path.join(tmp_path, "run", LOCK))


def test_a_lock_that_made_model_path_removes_it_when_the_job_wrote_nothing(tmp_path):
    """A job refused inside the lock (its data, a precision this device lacks) left an empty model_path (and its
    missing parents) behind; one that wrote a file keeps it."""
    model_path = tmp_path / "runs" / "a" / "run"
    with pytest.raises(RuntimeError, match="refused"):
        with TrainerLock(str(model_path)):
            assert os.path.isfile(model_path / LOCK)
            raise RuntimeError("refused")
    assert os.listdir(tmp_path) == []
    (tmp_path / "runs").mkdir()  # a parent that was there stays, empty or not
    with TrainerLock(str(model_path)):
        pass
    assert os.listdir(tmp_path) == ["runs"] and os.listdir(tmp_path / "runs") == []
    with TrainerLock(str(model_path)):
        (model_path / "model.ckpt-1.index").write_text("x")
    assert os.listdir(model_path) == ["model.ckpt-1.index"]
