"""Files the project reads back from a model_path, damaged or empty (issue 22): run_info.json and the trainer's
lock file never block a resume; a warning says what was done, and the damaged run_info.json is kept beside."""
import json
import os
import time

import pytest

import main
from modelpath import checkpoints
from modelpath.lock import LOCK
from tiny import tiny_config
from modelpath import run_info
from modelpath.run_info import RUN_INFO
from train.job import run_description
from workspace import make_workspace


@pytest.mark.parametrize("damage", ["", "{\"n_layer\": 2, \"starts\": [{\"st", "\x00\x81garbage", "[1, 2]", "null"],
                         ids=["empty", "cut short", "garbage", "a list", "null"])
def test_a_damaged_run_info_is_kept_aside_and_rebuilt(tmp_path, capsys, damage):
    cfg = tiny_config(model_path=str(tmp_path / "run"))
    os.makedirs(cfg.model_path)
    path = os.path.join(cfg.model_path, RUN_INFO)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(damage)
    assert run_info.read(cfg.model_path) is None
    assert "damaged" in capsys.readouterr().err
    run_info.write(cfg.model_path, run_description(cfg), 7)
    info = json.loads(open(path).read())
    assert info["n_layer"] == 2 and [s["step"] for s in info["starts"]] == [7]
    assert open(path + ".damaged", encoding="utf-8", errors="surrogateescape").read() == damage
    err = capsys.readouterr().err
    assert "run_info.json.damaged" in err and err.count("warning:") == 2, err
    run_info.write(cfg.model_path, run_description(cfg), 9)  # the rebuilt file is read back as usual
    assert [s["step"] for s in run_info.read(cfg.model_path)["starts"]] == [7, 9]


@pytest.mark.slow
def test_training_resumes_over_a_damaged_run_info_and_lock_file(tmp_path, capsys):
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]], train_steps=1,
                            steps_per_checkpoint=1)
    model_path = str(tmp_path / "run")
    assert main.main(["--model", config, "--peak_tflops", "1"]) == 0
    open(os.path.join(model_path, RUN_INFO), "w").close()  # a disk that filled up as it was written
    open(os.path.join(model_path, LOCK), "w").close()  # a trainer killed as it took the lock
    old = time.time() - 3600
    os.utime(os.path.join(model_path, LOCK), (old, old))
    model = json.loads(open(config).read())
    model["train_steps"] = 2
    open(config, "w").write(json.dumps(model))
    capsys.readouterr()
    assert main.main(["--model", config, "--peak_tflops", "1"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "run_info.json" in err and "lock" in err, err
    assert checkpoints.steps(model_path) == [1, 2]
    assert [s["step"] for s in run_info.read(model_path)["starts"]] == [1]
    assert not os.path.exists(os.path.join(model_path, LOCK))
