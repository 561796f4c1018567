"""jobs.py and main.py's choice of job: one job per command line, each checked before it runs."""
import os

import pytest

import jobs
import main
from schema import ConfigError
from tiny import tiny_config


@pytest.mark.parametrize("flags,kind", [
    ([], jobs.Training), (["--new"], jobs.Training), (["--eval"], jobs.Evaluation),
    (["--predict"], jobs.Prediction), (["--export"], jobs.Export), (["--check_dataset"], jobs.DatasetCheck),
    (["--dry_run"], jobs.DryRun), (["--auto_layout"], jobs.AutoLayout),
    (["--auto_layout_and_mesh_shape", "--num_devices", "4"], jobs.AutoLayout),
    # --check_dataset and the planning flags read nothing of model_path's: they win over --eval and --predict
    (["--check_dataset", "--eval"], jobs.DatasetCheck), (["--dry_run", "--predict"], jobs.DryRun),
])
def test_the_flags_pick_one_job(flags, kind):
    """Bug caught: job_for testing --eval before --check_dataset or the planning flags (a dry run that trains)."""
    job = main.job_for(main.parse_args(flags), tiny_config())
    assert type(job) is kind
    assert job.uses_devices == (kind in (jobs.Training, jobs.Evaluation, jobs.Prediction, jobs.Export))
    if kind is jobs.AutoLayout:
        assert job.n_devices == (4 if "--num_devices" in flags else None)


@pytest.mark.parametrize("flags,message", [
    (["--dry_run", "--auto_layout"], "pass one of --dry_run, --auto_layout"),
    (["--device_memory", "16GB"], "--device_memory goes with --dry_run"),
    (["--write_config", "x.json"], "--write_config goes with --auto_layout"),
])
def test_planning_flags_that_do_not_go_together_are_one_line(flags, message):
    with pytest.raises(ConfigError) as info:
        main.job_for(main.parse_args(flags), tiny_config())
    assert message in str(info.value) and "\n" not in str(info.value)


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
