"""jobs.py: each job checked before it runs, and nothing written by a check; --new with training only. Which job
the flags pick is main.py's (tests/test_main.py)."""
import os

import pytest

import jobs
import main
from schema import ConfigError
from tiny import tiny_config


def test_new_goes_with_training_only():
    """--new deletes model_path: with --eval it would delete the model it then evaluates."""
    jobs.refuse_new_with(main.job_for(main.parse_args(["--new"]), tiny_config()))
    with pytest.raises(ConfigError) as info:
        jobs.refuse_new_with(main.job_for(main.parse_args(["--eval", "--new"]), tiny_config()))
    assert "--new goes with training" in str(info.value)


def test_a_training_check_writes_nothing(tmp_path):
    """Training.check refuses a config without datasets and leaves model_path as it was (nothing made)."""
    cfg = tiny_config(model_path=str(tmp_path / "run"), datasets=[])
    job = main.job_for(main.parse_args(["--ignore_memory_check"]), cfg)
    with pytest.raises(ConfigError) as info:
        job.check(placement=None)
    assert "no datasets" in str(info.value) and not (tmp_path / "run").exists()


def test_training_prepares_the_harness_once_in_its_check_and_runs_with_what_it_found(tmp_path, monkeypatch):
    """main.py's training job checks before --new deletes anything (train/job.check_training: the data, the
    harness's tasks prepared, lm-eval's task index built), then runs with what its check found, as --eval's job
    does. Bug caught: Training.run not handing `checked` to run_training (the tasks prepared twice: for lm-eval's
    own tasks, its task index built again, 21 CPU s)."""
    from config import load_config
    from evals import harness
    from train import job as train_job
    from workspace import make_workspace
    tasks = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "harness_tasks")
    cfg = load_config(make_workspace(tmp_path, harness_tasks=["tiny_lambada"], harness_include_path=tasks))
    prepared, trained = [], []
    monkeypatch.setattr(harness, "prepare", lambda options, cfg=None: prepared.append(options.tasks) or
                        f"tasks prepared {len(prepared)}")
    monkeypatch.setattr(train_job, "_train_locked", lambda cfg, placement, options, harness_options, ready:
                        trained.append(ready) or cfg.train_steps)
    job = main.job_for(main.parse_args(["--ignore_memory_check"]), cfg)
    job.check(placement=None)
    assert job.run(placement=None) == 0
    assert prepared == [("tiny_lambada",)] and trained == ["tasks prepared 1"]
